package session

import (
	"context"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
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
	// Paused: the reaper froze the sandbox for being idle (IdlePause);
	// the next operation that needs it running resumes it.
	Paused bool
	// Background: a background process was started in the sandbox and
	// the reaper has not yet seen all of them end. Before it pauses or
	// removes such a sandbox as idle it asks the sandbox: a running
	// background process is use, so that nobody polling a long build does
	// not freeze or lose it (the lifetime still applies).
	Background bool
}

// action is what the reaper does to a sandbox on one pass.
type action int

const (
	keep action = iota
	remove
	pause
)

// decide says what the reaper does to a sandbox now, and why. The lifetime
// is absolute; the idle actions apply to a sandbox nobody uses, the one
// with the longest delay first: removal after the idle timeout, then,
// when idlePause is set, pausing after that shorter delay.
func (a *Activity) decide(now time.Time, idleTimeout, idlePause time.Duration) (action, string) {
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
	case idlePause > 0 && idle > idlePause && !a.Paused:
		return pause, "idle"
	}
	return keep, ""
}

// ReapReason says why the reaper removes the sandbox now ("lifetime over"
// or "idle"), or "" when it keeps it.
func (a *Activity) ReapReason(now time.Time, idleTimeout time.Duration) string {
	if act, why := a.decide(now, idleTimeout, 0); act == remove {
		return why
	}
	return ""
}

// ReapInterval is how often the reaper looks for idle and expired sandboxes,
// given its shortest idle delay (the idle timeout, or the idle pause): often
// enough to honour a short one, never more than every 30 s.
func ReapInterval(idleTimeout time.Duration) time.Duration {
	return min(30*time.Second, max(time.Second, idleTimeout/4))
}

func (m *Manager) loop() {
	defer close(m.loopDone)
	shortest := m.opts.IdleTimeout
	if m.pauser != nil && m.opts.IdlePause > 0 {
		shortest = min(shortest, m.opts.IdlePause)
	}
	t := time.NewTicker(ReapInterval(shortest))
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
	var victims, sleepers []victim
	var running []*entry
	idlePause := time.Duration(0)
	if m.pauser != nil {
		idlePause = m.opts.IdlePause
	}
	classify := func(e *entry) {
		switch act, why := e.decide(now, m.opts.IdleTimeout, idlePause); {
		case act != keep && why == "idle" && e.Background && !e.Paused:
			running = append(running, e)
		case act == remove:
			e.Removing = true
			victims = append(victims, victim{e, why})
		case act == pause:
			sleepers = append(sleepers, victim{e, why})
		}
	}
	m.mu.Lock()
	for _, e := range m.entries {
		classify(e)
	}
	m.mu.Unlock()
	// Idle by its tool calls, but it ran background processes: idle only
	// if none is running any more.
	checked := running
	running = nil
	for _, e := range checked {
		busy, err := m.runsProcesses(e)
		m.mu.Lock()
		switch {
		case err != nil || busy:
			// Running (or unknown: keep the work, the lifetime still
			// bounds it) counts as use.
			e.LastUsedAt = now
		default:
			e.Background = false
			classify(e)
		}
		m.mu.Unlock()
	}
	for _, s := range sleepers {
		m.pauseIdle(s.e, now)
	}
	for _, v := range victims {
		m.log.Info("removing sandbox", "sandbox", v.e.id, "reason", v.why, "owner", contract.IdentityHash(v.e.owner.ID))
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.sweepCtx), removeTimeout)
		if err := m.d.Remove(ctx, v.e.handle(), RemoveReap); err != nil {
			m.log.Warn("removing sandbox", "sandbox", v.e.id, "reason", v.why, "error", err)
		}
		cancel()
		m.forget(v.e)
	}
}

// runsProcesses asks the sandbox whether any of its background processes
// is still running.
func (m *Manager) runsProcesses(e *entry) (bool, error) {
	pd, ok := m.d.(ProcessDriver)
	if !ok {
		return false, nil
	}
	m.mu.Lock()
	h := e.handle()
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.sweepCtx), processCheckTimeout)
	defer cancel()
	resp, err := pd.Processes(ctx, h, contract.ProcessCall{Action: execio.ProcessActionList})
	if err != nil {
		m.log.Warn("listing an idle sandbox's background processes; keeping it", "sandbox", e.id, "error", err)
		return false, err
	}
	for _, p := range resp.Processes {
		if p.State == execio.ProcessRunning {
			return true, nil
		}
	}
	return false, nil
}

// processCheckTimeout bounds the reaper's look at a sandbox's processes.
const processCheckTimeout = 10 * time.Second

// removeTimeout bounds one removal by the reaper.
const removeTimeout = time.Minute

// pauseIdle freezes e if it is still idle. e.state serialises it with
// resume, and the idleness is checked again under it, so an operation that
// started meanwhile (InFlight, a newer LastUsedAt) keeps its sandbox
// running; one that starts during the pause waits on e.state and resumes
// it. A failed pause is logged and leaves the sandbox running.
func (m *Manager) pauseIdle(e *entry, now time.Time) {
	e.state.Lock()
	defer e.state.Unlock()
	m.mu.Lock()
	act, _ := e.decide(now, m.opts.IdleTimeout, m.opts.IdlePause)
	h := e.handle()
	m.mu.Unlock()
	if act != pause {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.sweepCtx), removeTimeout)
	defer cancel()
	if err := m.pauser.Pause(ctx, h); err != nil {
		m.log.Warn("pausing an idle sandbox", "sandbox", e.id, "error", err)
		return
	}
	m.mu.Lock()
	e.Paused = true
	m.mu.Unlock()
	m.log.Info("paused an idle sandbox", "sandbox", e.id, "owner", contract.IdentityHash(e.owner.ID))
}

// resume thaws e before an operation that needs it running; the caller has
// marked it busy, so the reaper cannot pause it again meanwhile.
func (m *Manager) resume(ctx context.Context, e *entry, h Handle) error {
	if e == nil || m.pauser == nil {
		return nil
	}
	e.state.Lock()
	defer e.state.Unlock()
	m.mu.Lock()
	paused := e.Paused
	m.mu.Unlock()
	if !paused {
		return nil
	}
	if err := m.pauser.Resume(ctx, h); err != nil {
		return err
	}
	m.mu.Lock()
	e.Paused = false
	m.mu.Unlock()
	m.log.Info("resumed a paused sandbox", "sandbox", e.id, "owner", contract.IdentityHash(e.owner.ID))
	return nil
}
