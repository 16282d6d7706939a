package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Defaults for Options.
const (
	DefaultMaxSandboxes = 5
	DefaultIdleTimeout  = 30 * time.Minute
)

// never is the expiry of a sandbox without a lifetime.
const never = 100 * 365 * 24 * time.Hour

// Options configure a Manager.
type Options struct {
	// MaxSandboxes bounds the sandboxes one identity may have at once.
	MaxSandboxes int
	// IdleTimeout removes a sandbox nobody used for this long.
	IdleTimeout time.Duration
	// IdlePause, when set (and shorter than IdleTimeout), pauses a
	// sandbox nobody used for this long, if the driver is a Pauser; the
	// next exec or file transfer resumes it.
	IdlePause time.Duration
	// Clock is the time activity, idle and lifetime reaping go by
	// (default time.Now); tests set a fake one.
	Clock func() time.Time
	// KeepOnClose leaves the sandboxes where they are when the Manager
	// closes: for a SharedDriver whose sandboxes other server instances
	// (replicas) serve too, so that a replica's stop (a rollout, a drain,
	// an eviction) ends nobody's work. Without it Close removes every
	// sandbox of this instance, which is what a local single-process
	// server (the docker backend over stdio) is expected to do.
	KeepOnClose bool
	// Stateless keeps nothing about the sandboxes in this process, for a
	// SharedDriver whose sandboxes any replica serves: no registry (every
	// operation goes to the driver with Ref ""), no count (the driver holds
	// each identity to its limit itself, exactly across replicas), hence
	// nothing for the reaper to pause or remove (lifetimes are the
	// driver's, e.g. the operator's); implies KeepOnClose. Ignored for a
	// driver that is no SharedDriver.
	Stateless bool
	// LimitError words the refusal of a create past MaxSandboxes (default:
	// contract.ErrQuota, "you already have N sandboxes; the limit is M").
	LimitError func(have, limit int) error
	Logger     *slog.Logger
}

// Manager implements contract.Backend on a Driver (see the package doc).
type Manager struct {
	d      Driver
	shared SharedDriver // d, when it is one
	pauser Pauser       // d, when it is one
	opts   Options
	log    *slog.Logger

	mu      sync.Mutex
	entries map[key]*entry
	// pending counts creates in flight per identity, so that concurrent
	// creates cannot overshoot MaxSandboxes.
	pending map[string]int

	stopOnce sync.Once
	stop     chan struct{}
	// sweepCtx ends at Close, cutting a driver's sweep short.
	sweepCtx    context.Context
	sweepCancel context.CancelFunc
	loopDone    chan struct{}
}

// key names an entry: the owner and the ID. With the owner in the key, a
// sandbox is found only by the identity that created it, and IDs need be
// unique only per owner (Kubernetes names are unique per namespace).
type key struct{ owner, id string }

// entry is one sandbox this server instance created: the ownership record.
type entry struct {
	owner   contract.Caller
	id      string
	ref     string
	sandbox contract.Sandbox
	// state serialises pausing and resuming the sandbox.
	state sync.Mutex
	// exposures are its exposed ports (ports.go), under Manager.mu.
	exposures map[int]exposure
	Activity
}

var _ contract.Backend = (*Manager)(nil)

// New returns a Manager for d. Start starts its reaper.
func New(d Driver, opts Options) *Manager {
	if opts.MaxSandboxes <= 0 {
		opts.MaxSandboxes = DefaultMaxSandboxes
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.LimitError == nil {
		opts.LimitError = func(have, limit int) error {
			return fmt.Errorf("%w: you already have %d sandboxes; the limit is %d", contract.ErrQuota, have, limit)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Manager{
		d:        d,
		opts:     opts,
		log:      opts.Logger,
		entries:  map[key]*entry{},
		pending:  map[string]int{},
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	m.shared, _ = d.(SharedDriver)
	m.pauser, _ = d.(Pauser)
	if m.shared == nil {
		m.opts.Stateless = false
	}
	if m.opts.Stateless {
		m.opts.KeepOnClose = true
	}
	m.sweepCtx, m.sweepCancel = context.WithCancel(context.Background())
	return m
}

// Start starts the driver (Starter) and the reaper.
func (m *Manager) Start(ctx context.Context) {
	if s, ok := m.d.(Starter); ok {
		s.Start(ctx)
	}
	go m.loop()
}

func notFound(id string) error {
	return fmt.Errorf("%w: %q", contract.ErrNotFound, id)
}

func (m *Manager) authorize(ctx context.Context, caller contract.Caller, op Op, id string) error {
	if a, ok := m.d.(Authorizer); ok {
		return a.Authorize(ctx, caller, op, id)
	}
	return nil
}

func (e *entry) handle() Handle {
	return Handle{ID: e.id, Caller: e.owner, Ref: e.ref, Sandbox: e.sandbox}
}

// open authorizes op and finds the caller's sandbox, marking it used. A
// sandbox of someone else is reported exactly like one that never existed.
// The entry is nil for a SharedDriver's sandbox the Manager does not hold.
func (m *Manager) open(ctx context.Context, caller contract.Caller, op Op, id string) (*entry, Handle, error) {
	if err := m.authorize(ctx, caller, op, id); err != nil {
		return nil, Handle{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key{caller.ID, id}]
	switch {
	case ok && e.Removing:
		return nil, Handle{}, notFound(id)
	case ok:
		e.LastUsedAt = m.opts.Clock()
		h := e.handle()
		h.Caller = caller
		return e, h, nil
	case m.shared != nil:
		return nil, Handle{ID: id, Caller: caller}, nil
	}
	return nil, Handle{}, notFound(id)
}

// busy marks a sandbox in use for the duration of an operation, so the
// reaper never removes it as idle mid-command; its end counts as use.
func (m *Manager) busy(e *entry) func() {
	if e == nil {
		return func() {}
	}
	m.mu.Lock()
	e.InFlight++
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		e.InFlight--
		e.LastUsedAt = m.opts.Clock()
		m.mu.Unlock()
	}
}

// done forgets e when err says its sandbox is gone.
func (m *Manager) done(e *entry, err error) {
	if e != nil && errors.Is(err, ErrGone) {
		m.forget(e)
	}
}

func (m *Manager) forget(e *entry) {
	m.mu.Lock()
	k := key{e.owner.ID, e.id}
	if m.entries[k] == e {
		delete(m.entries, k)
	}
	m.mu.Unlock()
}

// view is sb with the Manager's record of its use.
func (m *Manager) view(sb contract.Sandbox, e *entry) contract.Sandbox {
	if e != nil {
		m.mu.Lock()
		sb.LastUsedAt = e.LastUsedAt
		m.mu.Unlock()
	}
	return sb
}

// Create implements contract.Backend: it holds the caller to MaxSandboxes,
// counting its creates in flight, then has the driver make the sandbox.
func (m *Manager) Create(ctx context.Context, caller contract.Caller, req contract.CreateRequest) (contract.Sandbox, error) {
	if err := m.authorize(ctx, caller, OpCreate, ""); err != nil {
		return contract.Sandbox{}, err
	}
	if m.opts.Stateless {
		// The driver counts, exactly, and nothing is registered.
		_, sb, err := m.d.Create(ctx, caller, req)
		if err != nil {
			return contract.Sandbox{}, err
		}
		now := m.opts.Clock()
		if sb.CreatedAt.IsZero() {
			sb.CreatedAt = now
		}
		if sb.ExpiresAt.IsZero() {
			sb.ExpiresAt = now.Add(never)
			if req.Lifetime > 0 {
				sb.ExpiresAt = now.Add(req.Lifetime)
			}
		}
		sb.LastUsedAt = now
		return sb, nil
	}
	others := 0
	if m.shared != nil {
		var err error
		if others, err = m.shared.CountOthers(ctx, caller); err != nil {
			return contract.Sandbox{}, err
		}
	}
	m.mu.Lock()
	n := others + m.pending[caller.ID]
	for _, e := range m.entries {
		if e.owner.ID == caller.ID && !e.Removing {
			n++
		}
	}
	if n >= m.opts.MaxSandboxes {
		m.mu.Unlock()
		return contract.Sandbox{}, m.opts.LimitError(n, m.opts.MaxSandboxes)
	}
	m.pending[caller.ID]++
	m.mu.Unlock()
	unpend := func() {
		if m.pending[caller.ID]--; m.pending[caller.ID] <= 0 {
			delete(m.pending, caller.ID)
		}
	}

	ref, sb, err := m.d.Create(ctx, caller, req)
	if err != nil {
		m.mu.Lock()
		unpend()
		m.mu.Unlock()
		return contract.Sandbox{}, err
	}
	now := m.opts.Clock()
	e := &entry{owner: caller, id: sb.ID, ref: ref, Activity: Activity{LastUsedAt: now, ExpiresAt: now.Add(req.Lifetime)}}
	if req.Lifetime <= 0 {
		e.ExpiresAt = now.Add(never)
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = now
	}
	if sb.ExpiresAt.IsZero() {
		sb.ExpiresAt = e.ExpiresAt
	}
	sb.LastUsedAt = now
	e.sandbox = sb
	// Registered before the create stops pending: it is counted throughout.
	m.mu.Lock()
	m.entries[key{caller.ID, sb.ID}] = e
	unpend()
	m.mu.Unlock()
	return sb, nil
}

// Get implements contract.Backend.
func (m *Manager) Get(ctx context.Context, caller contract.Caller, id string) (contract.Sandbox, error) {
	e, h, err := m.open(ctx, caller, OpGet, id)
	if err != nil {
		return contract.Sandbox{}, err
	}
	sb, err := m.d.Get(ctx, h)
	m.done(e, err)
	if err != nil {
		return contract.Sandbox{}, err
	}
	return m.view(sb, e), nil
}

// List implements contract.Backend, oldest first.
func (m *Manager) List(ctx context.Context, caller contract.Caller) ([]contract.Sandbox, error) {
	if err := m.authorize(ctx, caller, OpList, ""); err != nil {
		return nil, err
	}
	m.mu.Lock()
	var mine []Handle
	byID := map[string]*entry{}
	for _, e := range m.entries {
		if e.owner.ID == caller.ID && !e.Removing {
			h := e.handle()
			h.Caller = caller
			mine = append(mine, h)
			byID[e.id] = e
		}
	}
	m.mu.Unlock()
	if len(mine) == 0 && m.shared == nil {
		return nil, nil
	}
	list, err := m.d.List(ctx, caller, mine)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if e := byID[list[i].ID]; e != nil {
			list[i] = m.view(list[i], e)
			delete(byID, list[i].ID)
		}
	}
	if m.shared != nil {
		// The shared driver's list is the truth: what it lacks is gone.
		for _, e := range byID {
			m.forget(e)
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.Before(list[j].CreatedAt) })
	return list, nil
}

// openRunning is open for an operation that runs in the sandbox: it marks
// the sandbox busy (so the reaper cannot pause or remove it meanwhile) and
// resumes it if the reaper paused it. release ends the busy mark.
func (m *Manager) openRunning(ctx context.Context, caller contract.Caller, op Op, id string) (*entry, Handle, func(), error) {
	e, h, err := m.open(ctx, caller, op, id)
	if err != nil {
		return nil, Handle{}, nil, err
	}
	release := m.busy(e)
	if err := m.resume(ctx, e, h); err != nil {
		release()
		m.done(e, err)
		return nil, Handle{}, nil, err
	}
	return e, h, release, nil
}

// Exec implements contract.Backend.
func (m *Manager) Exec(ctx context.Context, caller contract.Caller, id string, req execio.Request, out contract.OutputFunc) (execio.Result, error) {
	req, err := req.Normalize()
	if err != nil {
		return execio.Result{}, err
	}
	e, h, release, err := m.openRunning(ctx, caller, OpExec, id)
	if err != nil {
		return execio.Result{}, err
	}
	defer release()
	res, err := m.d.Exec(ctx, h, req, out)
	m.done(e, err)
	return res, err
}

// Upload implements contract.Backend.
func (m *Manager) Upload(ctx context.Context, caller contract.Caller, id, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	e, h, release, err := m.openRunning(ctx, caller, OpUpload, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	defer release()
	stats, err := m.d.Upload(ctx, h, destDir, archive, limits)
	m.done(e, err)
	return stats, err
}

// Download implements contract.Backend.
func (m *Manager) Download(ctx context.Context, caller contract.Caller, id, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	e, h, release, err := m.openRunning(ctx, caller, OpDownload, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	defer release()
	stats, err := m.d.Download(ctx, h, src, w, maxBytes)
	m.done(e, err)
	return stats, err
}

// Logs implements contract.Backend.
func (m *Manager) Logs(ctx context.Context, caller contract.Caller, id string, opts contract.LogsOptions) (contract.Logs, error) {
	e, h, err := m.open(ctx, caller, OpLogs, id)
	if err != nil {
		return contract.Logs{}, err
	}
	logs, err := m.d.Logs(ctx, h, opts)
	m.done(e, err)
	return logs, err
}

// Stop implements contract.Backend. The sandbox is unusable while it is
// being removed, and usable again if the removal fails.
func (m *Manager) Stop(ctx context.Context, caller contract.Caller, id string) error {
	if err := m.authorize(ctx, caller, OpStop, id); err != nil {
		return err
	}
	m.mu.Lock()
	e, ok := m.entries[key{caller.ID, id}]
	h := Handle{ID: id, Caller: caller}
	switch {
	case ok && !e.Removing:
		e.Removing = true
		h = e.handle()
		h.Caller = caller
	case m.shared == nil || ok:
		m.mu.Unlock()
		return notFound(id)
	}
	m.mu.Unlock()
	// A paused sandbox is stopped as it is: Docker's stop reaches a frozen
	// container's processes (dockerruntime's lifecycle tests show it), so
	// thawing it first would only cost time.
	err := m.d.Remove(ctx, h, RemoveStop)
	if err != nil && !errors.Is(err, ErrGone) {
		if e != nil {
			m.mu.Lock()
			e.Removing = false
			m.mu.Unlock()
		}
		return err
	}
	if e != nil {
		m.forget(e)
	}
	if err != nil {
		return err
	}
	m.log.Info("sandbox stopped", "sandbox", id, "owner", contract.IdentityHash(caller.ID))
	return nil
}

// Ready implements contract.Backend.
func (m *Manager) Ready(ctx context.Context) error { return m.d.Ready(ctx) }

// Close implements contract.Backend: it stops the reaper, has the driver
// remove every sandbox of this server instance (including any the registry
// does not know) unless KeepOnClose, forgets them all and closes the driver.
func (m *Manager) Close(ctx context.Context) error {
	m.stopOnce.Do(func() {
		close(m.stop)
		m.sweepCancel()
	})
	var err error
	if !m.opts.KeepOnClose {
		err = m.d.RemoveAll(ctx)
	}
	m.mu.Lock()
	m.entries = map[key]*entry{}
	m.mu.Unlock()
	return errors.Join(err, m.d.Close(ctx))
}
