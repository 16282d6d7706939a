package dockerbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

// The warm pool (Options.WarmPool): containers made exactly as a default
// sandbox_initialize makes them (the default image, CPU and memory, no
// network, the same hardening and runtime), started, checked with one
// command through the in-sandbox helper, then paused (the cgroup freezer:
// no CPU, memory resident). A default create takes one, unpauses it and
// returns it as a new sandbox; the pool refills in the background.
const (
	// DefaultWarmPool is the binary's --warm-pool default.
	DefaultWarmPool = 1
	// MaxWarmPool bounds Options.WarmPool.
	MaxWarmPool = 64
	// PoolNamespace is the sandbox-namespace label of warm pool members
	// (a sandbox's label is its owner's identity hash). A member keeps it
	// once claimed: labels cannot change. The node label is this run's
	// instance, as on every sandbox, so Close and the orphan sweep of dead
	// runs remove members with the rest.
	PoolNamespace = "warm-pool"

	poolBackoffFirst = time.Second
	poolBackoffLast  = time.Minute
	// poolCheckTimeout bounds a member's health check.
	poolCheckTimeout = 30 * time.Second
)

// poolMember is one idle, paused member.
type poolMember struct {
	uid string
	ref string // container ID
}

// pool keeps up to size paused members of the default sandbox. Each member
// goes to exactly one claim (taken from idle under mu). One goroutine
// refills, one create at a time; close stops it and waits for it, so that
// no member is created after RemoveAll lists this run's containers.
type pool struct {
	d     *driver
	size  int
	image string

	mu      sync.Mutex
	idle    []poolMember
	closed  bool
	started bool

	// kick wakes the refill loop (a claim, a successful cold default
	// create, which proves the image is on the host) and resets its
	// backoff.
	kick chan struct{}
	// makeMember is make; a test may wrap it to inject a failure.
	makeMember func() (poolMember, error)
	ctx        context.Context
	cancel     context.CancelFunc
	done       chan struct{}
}

func newPool(d *driver, size int, image string) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{d: d, size: size, image: image, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	p.makeMember = p.make
	return p
}

// start starts the refill loop; nil-safe, once.
func (p *pool) start() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return
	}
	p.started = true
	go p.loop()
}

// wake nudges the refill loop; nil-safe, never blocks.
func (p *pool) wake() {
	if p == nil {
		return
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// close stops the refill loop and waits for it (or ctx): an in-flight
// member is finished, so RemoveAll, which lists after close, finds it.
// Nil-safe, idempotent.
func (p *pool) close(ctx context.Context) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	p.idle = nil
	started := p.started
	p.mu.Unlock()
	p.cancel()
	if !started {
		return
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.d.log.Warn("warm pool refill did not stop in time", "error", ctx.Err())
	}
}

// matches reports whether req is a default create, which a member serves.
func (p *pool) matches(req contract.CreateRequest) bool {
	return p != nil &&
		(req.Image == "" || req.Image == p.image) &&
		(req.NanoCPUs == 0 || req.NanoCPUs == dockerruntime.DefaultNanoCPUs) &&
		(req.MemoryBytes == 0 || req.MemoryBytes == dockerruntime.DefaultMemoryBytes) &&
		(req.Network == "" || req.Network == contract.NetworkNone)
}

// take removes one idle member from the pool, or reports that there is
// none.
func (p *pool) take() (poolMember, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) == 0 {
		return poolMember{}, false
	}
	m := p.idle[0]
	p.idle = p.idle[1:]
	return m, true
}

// claim hands out an idle member as the new sandbox of a default create.
// It checks that the member's container is still there and paused (one
// inspect, which Docker answers from memory), then thaws it in the
// background (thaw), so that sandbox_initialize does not wait for the
// unpause: the sandbox's first operation does, if it comes sooner. ok is
// false when the pool has no usable member (the caller then creates cold);
// err is set only when ctx ended.
func (p *pool) claim(ctx context.Context, caller contract.Caller) (ref string, sb contract.Sandbox, ok bool, err error) {
	for {
		m, found := p.take()
		if !found {
			return "", contract.Sandbox{}, false, nil
		}
		p.wake()
		ct, ierr := p.d.docker.Inspect(context.WithoutCancel(ctx), m.ref)
		if ierr == nil && !ct.State.Paused {
			ierr = fmt.Errorf("container %s is %s, not paused", dockerruntime.ShortID(m.ref), ct.State.Status)
		}
		if ierr != nil {
			p.d.log.Warn("warm pool member unusable; dropping it", "sandbox", m.uid, "container", dockerruntime.ShortID(m.ref), "error", ierr)
			go p.d.removeContainer(m.ref, 0, "unusable warm pool member")
			continue
		}
		if ctx.Err() != nil {
			go p.d.removeContainer(m.ref, 0, "request cancelled during claim")
			return "", contract.Sandbox{}, false, ctx.Err()
		}
		p.d.thaw(m.ref)
		sb := contract.Sandbox{
			ID: m.uid, Image: p.image, Network: contract.NetworkNone, WorkingDir: dockerruntime.DefaultWorkingDir,
			NanoCPUs: dockerruntime.DefaultNanoCPUs, MemoryBytes: dockerruntime.DefaultMemoryBytes,
			Status: "running", // being thawed; every operation waits for it
		}
		p.d.log.Info("sandbox created from the warm pool", "sandbox", m.uid, "container", dockerruntime.ShortID(m.ref), "image", p.image, "owner", contract.IdentityHash(caller.ID))
		return m.ref, sb, true, nil
	}
}

// thawing is a claimed member's unpause, started with
// dockerruntime.BeginUnpause (which also makes the runtime's own commands
// and transfers on the container wait for it).
type thawing struct {
	wait func(context.Context) error
	// warned logs a failed thaw once, however many operations meet it.
	warned sync.Once
}

// thaw unpauses a claimed member's container in the background. The
// unpause runs to completion whatever happens to the request that claimed
// it, so the container is never left half-thawed.
func (b *driver) thaw(ref string) {
	b.thaws.Store(ref, &thawing{wait: b.docker.BeginUnpause(ref)})
}

// thawed waits until a claimed member's container has been unpaused (at
// once for any other sandbox). A failed unpause fails every operation on
// it; a container gone meanwhile is reported gone.
func (b *driver) thawed(ctx context.Context, h session.Handle) error {
	v, ok := b.thaws.Load(h.Ref)
	if !ok {
		return nil
	}
	t := v.(*thawing)
	err := t.wait(ctx)
	if ctxErr := ctx.Err(); err != nil && ctxErr != nil {
		return ctxErr
	}
	if err == nil {
		b.thaws.CompareAndDelete(h.Ref, t)
		return nil
	}
	t.warned.Do(func() {
		b.log.Warn("thawing a claimed warm pool member", "container", dockerruntime.ShortID(h.Ref), "error", err)
	})
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forgetHistory(h.ID)
		return session.Gone(mapErr(err))
	}
	return fmt.Errorf("%w: the sandbox could not be resumed from the warm pool: %w", contract.ErrUnavailable, err)
}

// loop refills the pool, one member at a time, with backoff on failures,
// until close.
func (p *pool) loop() {
	defer close(p.done)
	// backoff grows with each failure in a row; delay is the wait before
	// the next attempt, spent once (a failure sets it, the wait clears it).
	// A kick resets both. (When the wait did not clear it, a failure left
	// the pool waiting out its backoff again and again until a kick came:
	// one failed member and the pool stayed short for good.)
	var backoff, delay time.Duration
	for {
		p.mu.Lock()
		need := !p.closed && len(p.idle) < p.size
		p.mu.Unlock()
		if !need || delay > 0 {
			var (
				t     *time.Timer
				timer <-chan time.Time
			)
			if need {
				t = time.NewTimer(delay)
				timer = t.C
			}
			select {
			case <-p.ctx.Done():
			case <-p.kick:
				backoff = 0
			case <-timer:
			}
			if t != nil {
				t.Stop()
			}
			if p.ctx.Err() != nil {
				return
			}
			delay = 0
			continue
		}
		p.yieldToRestores()
		m, err := p.makeMember()
		if p.ctx.Err() != nil {
			// Closing: RemoveAll, which waits for this loop, removes a
			// member just made.
			return
		}
		if err != nil {
			backoff = min(max(2*backoff, poolBackoffFirst), poolBackoffLast)
			if errors.Is(err, dockerruntime.ErrImageNotFound) {
				// The pool never pulls: the first default sandbox_initialize
				// does, as --pull-policy allows, and kicks the pool.
				p.d.log.Info("warm pool waits for the default image to be on the host", "image", p.image, "error", err)
				backoff = poolBackoffLast
			} else {
				p.d.log.Warn("creating a warm pool member failed; retrying", "image", p.image, "retry_in", backoff, "error", err)
			}
			delay = backoff
			continue
		}
		backoff = 0
		p.mu.Lock()
		p.idle = append(p.idle, m)
		n := len(p.idle)
		p.mu.Unlock()
		p.d.log.Debug("warm pool member ready", "sandbox", m.uid, "container", dockerruntime.ShortID(m.ref), "idle", n, "size", p.size)
	}
}

// make creates, starts, checks and pauses one member. On failure it
// leaves nothing behind.
func (p *pool) make() (poolMember, error) {
	uid := newUID()
	spec := p.d.spec(uid, PoolNamespace, contract.CreateRequest{Image: p.image, Network: contract.NetworkNone})
	// The pool never pulls (see loop).
	spec.PullPolicy = dockerruntime.PullNever
	// The create runs to completion even when close cancels p.ctx, so
	// that RemoveAll finds a whole container, not a half-made one.
	ct, err := p.d.docker.CreateAndStart(context.WithoutCancel(p.ctx), spec)
	if err != nil {
		p.d.cleanupFailedCreate(uid)
		return poolMember{}, err
	}
	m := poolMember{uid: uid, ref: ct.ID}
	// The check (dockerruntime.CheckHealth, as the node managers run it on
	// their pool members) runs through the in-sandbox helper exactly as
	// sandbox_exec does, leaves no file and no process, and is not recorded
	// in the exec history.
	cctx, cancel := context.WithTimeout(p.ctx, poolCheckTimeout)
	err = p.d.docker.CheckHealth(cctx, ct.ID)
	cancel()
	if err == nil {
		err = p.d.docker.Pause(context.WithoutCancel(p.ctx), ct.ID)
	}
	if err != nil {
		if p.ctx.Err() == nil {
			p.d.removeContainer(ct.ID, 0, "warm pool member failed its check")
		}
		return poolMember{}, err
	}
	return m, nil
}

// restoreYieldMax bounds how long a refill waits for restores in flight.
const restoreYieldMax = 10 * time.Second

// yieldToRestores waits, up to restoreYieldMax, until no snapshot restore
// is in flight: a fork takes up to 16 members at once and then writes its
// files into them, and a member made meanwhile (create, start, health
// check, pause) competes with those writes for the same CPU and Docker
// daemon, which the fork's caller waits for and the pool's does not.
func (p *pool) yieldToRestores() {
	deadline := time.Now().Add(restoreYieldMax)
	for p.d.restoring.Load() > 0 && time.Now().Before(deadline) {
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}
