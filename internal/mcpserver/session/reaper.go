package session

import (
	"context"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
)

// Activity is what the reaper knows about one sandbox, guarded by the
// Manager's lock.
type Activity struct {
	ExpiresAt  time.Time
	LastUsedAt time.Time
	// InFlight counts operations running in the sandbox; a sandbox with
	// one is never idle.
	InFlight int
	// Removing: the sandbox is being removed and is no longer usable.
	Removing bool
}

// action is what the reaper does to a sandbox on one pass.
type action int

const (
	keep action = iota
	remove
)

// decide says what the reaper does to a sandbox now, and why. The lifetime
// is absolute; the idle actions apply to a sandbox nobody uses, the one
// with the longest delay first. Today there is one, removal after the idle
// timeout; an earlier one (with a shorter delay, and an action of its own)
// goes after it in this list, and the reaper's switch gains a case.
func (a *Activity) decide(now time.Time, idleTimeout time.Duration) (action, string) {
	switch {
	case a.Removing:
		return keep, ""
	case now.After(a.ExpiresAt):
		return remove, "lifetime over"
	case a.InFlight > 0:
		return keep, ""
	}
	idle := now.Sub(a.LastUsedAt)
	switch {
	case idle > idleTimeout:
		return remove, "idle"
	}
	return keep, ""
}

// ReapReason says why the reaper removes the sandbox now ("lifetime over"
// or "idle"), or "" when it keeps it.
func (a *Activity) ReapReason(now time.Time, idleTimeout time.Duration) string {
	if act, why := a.decide(now, idleTimeout); act == remove {
		return why
	}
	return ""
}

// ReapInterval is how often the reaper looks for idle and expired sandboxes:
// often enough to honour a short idle timeout, never more than every 30 s.
func ReapInterval(idleTimeout time.Duration) time.Duration {
	return min(30*time.Second, max(time.Second, idleTimeout/4))
}

func (m *Manager) loop() {
	defer close(m.loopDone)
	t := time.NewTicker(ReapInterval(m.opts.IdleTimeout))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.reap(m.opts.Clock())
			m.d.Sweep(m.sweepCtx)
		}
	}
}

// reap applies decide to every sandbox: it removes those past their
// lifetime and idle ones, through the driver, and forgets them whether or
// not the removal succeeded (Close's RemoveAll catches what is left).
func (m *Manager) reap(now time.Time) {
	type victim struct {
		e   *entry
		why string
	}
	var victims []victim
	m.mu.Lock()
	for _, e := range m.entries {
		switch act, why := e.decide(now, m.opts.IdleTimeout); act {
		case remove:
			e.Removing = true
			victims = append(victims, victim{e, why})
		case keep:
		}
	}
	m.mu.Unlock()
	for _, v := range victims {
		m.log.Info("removing sandbox", "sandbox", v.e.id, "reason", v.why, "owner", mcpserver.IdentityHash(v.e.owner.ID))
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.sweepCtx), removeTimeout)
		if err := m.d.Remove(ctx, v.e.handle(), RemoveReap); err != nil {
			m.log.Warn("removing sandbox", "sandbox", v.e.id, "reason", v.why, "error", err)
		}
		cancel()
		m.forget(v.e)
	}
}

// removeTimeout bounds one removal by the reaper.
const removeTimeout = time.Minute
