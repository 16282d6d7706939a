// Package dockerbackend runs the MCP server's sandboxes on the local Docker
// Engine through internal/dockerruntime, so they are hardened exactly as the
// operator's. Each container is labelled managed-by=code-sandbox-mcp with a
// random sandbox UID, the owner's identity hash as namespace and this server
// run's instance ID as node; the backend removes its containers when the
// server exits, and the containers of dead server runs when it starts.
package dockerbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
)

// Defaults for Options.
const (
	DefaultMaxSandboxes = 5
	DefaultIdleTimeout  = 30 * time.Minute
	DefaultStopGrace    = 10 * time.Second
)

// Options configure a Backend.
type Options struct {
	// Client talks to Docker; it must have been created with
	// ManagedBy: dockerruntime.ManagedByMCP.
	Client *dockerruntime.Client
	// Instance identifies this server run (CurrentInstance).
	Instance Instance
	// PullPolicy says whether missing images may be pulled.
	PullPolicy dockerruntime.PullPolicy
	// Runtime is the OCI runtime (runc or runsc).
	Runtime string
	// MaxSandboxes bounds the sandboxes one identity may have at once.
	MaxSandboxes int
	// IdleTimeout removes a sandbox nobody used for this long.
	IdleTimeout time.Duration
	// StopGrace is sandbox_stop's SIGTERM-to-SIGKILL grace period.
	StopGrace time.Duration
	// HistoryDir keeps exec history files; empty keeps it in memory.
	HistoryDir string
	Logger     *slog.Logger
	// EgressFirewall, if set, is installed by Start, kept until Close and
	// removed by Close unless a node manager owns the rules. The Client
	// must have been created with EgressReady: EgressFirewall.Healthy.
	EgressFirewall *egress.Firewall
	// Clock is the time idle and lifetime reaping go by (default
	// time.Now); tests set a fake one.
	Clock func() time.Time
}

// Backend implements mcpserver.Backend on Docker.
type Backend struct {
	docker   *dockerruntime.Client
	instance Instance
	node     string
	opts     Options
	log      *slog.Logger
	history  *history.Store

	mu        sync.Mutex
	sandboxes map[string]*entry
	// pending counts creates in flight per identity, so that concurrent
	// creates cannot overshoot the quota.
	pending map[string]int
	swept   bool

	stop     chan struct{}
	loopDone chan struct{}

	egressStop context.CancelFunc
	egressDone chan struct{}
}

// entry is one sandbox this server run created. The registry is the
// ownership record: only the identity that created a sandbox finds it.
type entry struct {
	id        string
	owner     string
	dockerID  string
	image     string
	network   string
	nanoCPUs  int64
	memory    int64
	createdAt time.Time
	mcpserver.Activity
}

var _ mcpserver.Backend = (*Backend)(nil)

// New returns a backend and starts its reaper (idle, lifetime, and dead
// servers' orphans). Docker need not be up yet: the orphan sweep is retried
// until it succeeds.
func New(opts Options) (*Backend, error) {
	if opts.Client == nil {
		return nil, errors.New("dockerbackend: no Docker client")
	}
	if opts.PullPolicy == "" {
		opts.PullPolicy = dockerruntime.PullIfNotPresent
	}
	if opts.Runtime == "" {
		opts.Runtime = dockerruntime.RuntimeRunc
	}
	if opts.MaxSandboxes <= 0 {
		opts.MaxSandboxes = DefaultMaxSandboxes
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	hist, err := history.New(opts.HistoryDir, 0)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		docker:    opts.Client,
		instance:  opts.Instance,
		node:      opts.Instance.String(),
		opts:      opts,
		log:       opts.Logger,
		history:   hist,
		sandboxes: map[string]*entry{},
		pending:   map[string]int{},
		stop:      make(chan struct{}),
		loopDone:  make(chan struct{}),
	}
	return b, nil
}

// Start sweeps orphans once (bounded) and starts the reaper loop.
func (b *Backend) Start(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	b.sweepOrphans(sctx)
	cancel()
	if fw := b.opts.EgressFirewall; fw != nil {
		fctx, cancel := context.WithCancel(context.Background())
		b.egressStop = cancel
		b.egressDone = make(chan struct{})
		go func() {
			defer close(b.egressDone)
			fw.Run(fctx, egress.DefaultCheckInterval, func(repaired []string, err error) {
				if err != nil {
					b.log.Error("egress firewall check; egress sandboxes are not created until it passes", "error", err)
					return
				}
				b.log.Info("repaired the egress firewall", "repaired", repaired)
			})
		}()
	}
	go b.loop()
}

// InstanceID is the node label this run puts on its containers.
func (b *Backend) InstanceID() string { return b.node }

func newUID() string {
	buf := make([]byte, 12)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

// mapErr translates dockerruntime's errors into the backend contract,
// keeping Docker's text.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, dockerruntime.ErrImageNotAllowed):
		// The server's registry policy (--allowed-registries) refuses the
		// image's registry; nothing was pulled.
		return fmt.Errorf("%w: %w", mcpserver.ErrInvalid, err)
	case errors.Is(err, dockerruntime.ErrImageNotFound):
		// A failed pull's text names the failure class only; the daemon's
		// own error (which may quote the registry) is logged by Create.
		return fmt.Errorf("%w: %w", mcpserver.ErrImageNotFound, err)
	case errors.Is(err, dockerruntime.ErrUnavailable):
		return fmt.Errorf("%w: %w", mcpserver.ErrUnavailable, err)
	case errors.Is(err, dockerruntime.ErrRuntimeUnavailable):
		return fmt.Errorf("%w: %w", mcpserver.ErrUnavailable, err)
	case errors.Is(err, dockerruntime.ErrInvalidSpec):
		return fmt.Errorf("%w: %w", mcpserver.ErrInvalid, err)
	case errors.Is(err, dockerruntime.ErrNotFound):
		return fmt.Errorf("%w: %w", mcpserver.ErrNotFound, err)
	case cerrdefs.IsConflict(err):
		// Docker answers 409 Conflict to an exec in a container that is
		// not running, paused or restarting.
		return fmt.Errorf("%w: %w", mcpserver.ErrNotRunning, err)
	}
	return err
}

func (b *Backend) notFound(id string) error {
	return fmt.Errorf("%w: %q", mcpserver.ErrNotFound, id)
}

// lookup returns the caller's sandbox and marks it used. A sandbox that
// belongs to someone else is reported exactly like one that never existed.
func (b *Backend) lookup(caller mcpserver.Caller, id string) (*entry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.sandboxes[id]
	if !ok || e.owner != caller.ID || e.Removing {
		return nil, b.notFound(id)
	}
	e.LastUsedAt = b.opts.Clock()
	return e, nil
}

// forget drops a sandbox whose container is gone.
func (b *Backend) forget(id string) {
	b.mu.Lock()
	delete(b.sandboxes, id)
	b.mu.Unlock()
	if err := b.history.Delete(id); err != nil {
		b.log.Warn("deleting exec history", "sandbox", id, "error", err)
	}
}

// Create implements mcpserver.Backend.
func (b *Backend) Create(ctx context.Context, caller mcpserver.Caller, req mcpserver.CreateRequest) (mcpserver.Sandbox, error) {
	b.mu.Lock()
	n := b.pending[caller.ID]
	for _, e := range b.sandboxes {
		if e.owner == caller.ID && !e.Removing {
			n++
		}
	}
	if n >= b.opts.MaxSandboxes {
		b.mu.Unlock()
		return mcpserver.Sandbox{}, fmt.Errorf("%w: you already have %d sandboxes; the limit is %d", mcpserver.ErrQuota, n, b.opts.MaxSandboxes)
	}
	b.pending[caller.ID]++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		if b.pending[caller.ID]--; b.pending[caller.ID] <= 0 {
			delete(b.pending, caller.ID)
		}
		b.mu.Unlock()
	}()

	network := dockerruntime.NetworkNone
	if req.Network == mcpserver.NetworkEgress {
		network = dockerruntime.NetworkEgress
	}
	uid := newUID()
	spec := dockerruntime.Spec{
		Owner: dockerruntime.Owner{
			ManagedBy: dockerruntime.ManagedByMCP,
			UID:       uid,
			Namespace: mcpserver.IdentityHash(caller.ID),
			Name:      uid[:12],
			Node:      b.node,
		},
		Image:           req.Image,
		PullPolicy:      b.opts.PullPolicy,
		NanoCPUs:        req.NanoCPUs,
		MemoryBytes:     req.MemoryBytes,
		Network:         network,
		Runtime:         b.opts.Runtime,
		StopGracePeriod: b.opts.StopGrace,
	}
	// The container must not outlive a cancelled request half-made: the
	// create runs to completion and is undone below if the caller left.
	ct, err := b.docker.CreateAndStart(context.WithoutCancel(ctx), spec)
	if err != nil {
		if pe := (*dockerruntime.PullError)(nil); errors.As(err, &pe) {
			b.log.Warn("image pull failed", "image", req.Image, "class", string(pe.Class), "error", pe.Detail, "owner", mcpserver.IdentityHash(caller.ID))
		}
		b.cleanupFailedCreate(uid)
		return mcpserver.Sandbox{}, mapErr(err)
	}
	now := b.opts.Clock()
	e := &entry{
		id: uid, owner: caller.ID, dockerID: ct.ID, image: req.Image, network: req.Network,
		nanoCPUs: orDefault(req.NanoCPUs, dockerruntime.DefaultNanoCPUs), memory: orDefault(req.MemoryBytes, dockerruntime.DefaultMemoryBytes),
		createdAt: now, Activity: mcpserver.Activity{ExpiresAt: now.Add(req.Lifetime), LastUsedAt: now},
	}
	if req.Lifetime <= 0 {
		e.ExpiresAt = now.Add(100 * 365 * 24 * time.Hour)
	}
	if e.network == "" {
		e.network = mcpserver.NetworkNone
	}
	if ctx.Err() != nil {
		b.removeContainer(ct.ID, 0, "request cancelled during create")
		return mcpserver.Sandbox{}, ctx.Err()
	}
	b.mu.Lock()
	b.sandboxes[uid] = e
	b.mu.Unlock()
	b.log.Info("sandbox created", "sandbox", uid, "container", dockerruntime.ShortID(ct.ID), "image", req.Image, "owner", mcpserver.IdentityHash(caller.ID))
	return b.view(e, ct.State), nil
}

func orDefault(v, d int64) int64 {
	if v == 0 {
		return d
	}
	return v
}

// cleanupFailedCreate removes a container a failed create may have left.
func (b *Backend) cleanupFailedCreate(uid string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := b.docker.ListManaged(ctx, dockerruntime.ListFilter{UID: uid})
	if err != nil {
		return
	}
	for _, c := range list {
		b.removeContainer(c.ID, 0, "failed create")
	}
}

func (b *Backend) removeContainer(dockerID string, grace time.Duration, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), grace+time.Minute)
	defer cancel()
	if err := b.docker.Remove(ctx, dockerID, grace); err != nil {
		b.log.Warn("removing sandbox container", "container", dockerruntime.ShortID(dockerID), "reason", why, "error", err)
	}
}

func (b *Backend) view(e *entry, st dockerruntime.ContainerState) mcpserver.Sandbox {
	status := st.Status
	if st.OOMKilled {
		status += " (OOM-killed)"
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return mcpserver.Sandbox{
		ID: e.id, Image: e.image, Status: status, Network: e.network, WorkingDir: dockerruntime.DefaultWorkingDir,
		NanoCPUs: e.nanoCPUs, MemoryBytes: e.memory,
		CreatedAt: e.createdAt, LastUsedAt: e.LastUsedAt, ExpiresAt: e.ExpiresAt,
	}
}

// Get implements mcpserver.Backend.
func (b *Backend) Get(ctx context.Context, caller mcpserver.Caller, id string) (mcpserver.Sandbox, error) {
	e, err := b.lookup(caller, id)
	if err != nil {
		return mcpserver.Sandbox{}, err
	}
	ct, err := b.docker.Inspect(ctx, e.dockerID)
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forget(id)
		return mcpserver.Sandbox{}, fmt.Errorf("%w: %q (its container was removed outside this server)", mcpserver.ErrNotFound, id)
	}
	if err != nil {
		return mcpserver.Sandbox{}, mapErr(err)
	}
	return b.view(e, ct.State), nil
}

// List implements mcpserver.Backend.
func (b *Backend) List(ctx context.Context, caller mcpserver.Caller) ([]mcpserver.Sandbox, error) {
	b.mu.Lock()
	var mine []*entry
	for _, e := range b.sandboxes {
		if e.owner == caller.ID && !e.Removing {
			mine = append(mine, e)
		}
	}
	b.mu.Unlock()
	if len(mine) == 0 {
		return nil, nil
	}
	list, err := b.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: b.node})
	if err != nil {
		return nil, mapErr(err)
	}
	states := map[string]dockerruntime.ContainerState{}
	for _, c := range list {
		states[c.ID] = c.State
	}
	out := make([]mcpserver.Sandbox, 0, len(mine))
	for _, e := range mine {
		st, ok := states[e.dockerID]
		if !ok {
			st.Status = "removed"
		}
		out = append(out, b.view(e, st))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// busy marks a sandbox in use for the duration of an operation, so the
// idle reaper never removes it mid-command.
func (b *Backend) busy(e *entry) func() {
	b.mu.Lock()
	e.InFlight++
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		e.InFlight--
		e.LastUsedAt = b.opts.Clock()
		b.mu.Unlock()
	}
}

// Exec implements mcpserver.Backend.
func (b *Backend) Exec(ctx context.Context, caller mcpserver.Caller, id string, req execio.Request, out mcpserver.OutputFunc) (execio.Result, error) {
	req, err := req.Normalize()
	if err != nil {
		return execio.Result{}, err
	}
	e, err := b.lookup(caller, id)
	if err != nil {
		return execio.Result{}, err
	}
	defer b.busy(e)()
	started := time.Now()
	res, err := b.docker.RunCommand(ctx, e.dockerID, req, out.Writer("stdout"), out.Writer("stderr"))
	rec := history.Record{
		ID: newUID()[:16], Command: req.Command, Shell: req.Shell, WorkingDir: req.WorkingDir, StartedAt: started,
		DurationMillis: res.DurationMillis, ExitCode: res.ExitCode, TimedOut: res.TimedOut, Truncated: res.Truncated(),
		Caller: mcpserver.IdentityHash(caller.ID),
	}
	if err != nil {
		rec.Error = err.Error()
		if rec.DurationMillis == 0 {
			rec.DurationMillis = time.Since(started).Milliseconds()
		}
	}
	if herr := b.history.Append(id, rec); herr != nil {
		b.log.Warn("recording exec history", "sandbox", id, "error", herr)
	}
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forget(id)
	}
	return res, mapErr(err)
}

// Upload implements mcpserver.Backend.
func (b *Backend) Upload(ctx context.Context, caller mcpserver.Caller, id, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	e, err := b.lookup(caller, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	target, err := execio.ResolvePath(dockerruntime.DefaultWorkingDir, destDir)
	if err != nil {
		return execio.TransferStats{}, err
	}
	defer b.busy(e)()
	stats, err := b.docker.CopyIn(ctx, e.dockerID, target, archive, limits)
	return stats, mapErr(err)
}

// Download implements mcpserver.Backend.
func (b *Backend) Download(ctx context.Context, caller mcpserver.Caller, id, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	e, err := b.lookup(caller, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	target, err := execio.ResolvePath(dockerruntime.DefaultWorkingDir, src)
	if err != nil {
		return execio.TransferStats{}, err
	}
	defer b.busy(e)()
	stats, err := b.docker.CopyOut(ctx, e.dockerID, target, w, maxBytes)
	return stats, mapErr(err)
}

// Logs implements mcpserver.Backend.
func (b *Backend) Logs(ctx context.Context, caller mcpserver.Caller, id string, opts mcpserver.LogsOptions) (mcpserver.Logs, error) {
	e, err := b.lookup(caller, id)
	if err != nil {
		return mcpserver.Logs{}, err
	}
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	tb := execio.NewTailBuffer(int(maxBytes))
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.docker.Logs(lctx, e.dockerID, dockerruntime.LogsOptions{Tail: opts.TailLines}, tb, tb); err != nil {
		return mcpserver.Logs{}, mapErr(err)
	}
	recs, err := b.history.Tail(id, opts.HistoryRecords)
	if err != nil {
		return mcpserver.Logs{}, err
	}
	return mcpserver.Logs{Output: tb.String(), Truncated: tb.Truncated(), History: recs}, nil
}

// Stop implements mcpserver.Backend.
func (b *Backend) Stop(ctx context.Context, caller mcpserver.Caller, id string) error {
	b.mu.Lock()
	e, ok := b.sandboxes[id]
	if !ok || e.owner != caller.ID || e.Removing {
		b.mu.Unlock()
		return b.notFound(id)
	}
	e.Removing = true
	b.mu.Unlock()
	// Removal continues if the caller goes away: a half-stopped sandbox
	// helps nobody.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.StopGrace+time.Minute)
	defer cancel()
	if err := b.docker.Remove(rctx, e.dockerID, b.opts.StopGrace); err != nil {
		b.mu.Lock()
		e.Removing = false
		b.mu.Unlock()
		return mapErr(err)
	}
	b.forget(id)
	b.log.Info("sandbox stopped", "sandbox", id, "owner", mcpserver.IdentityHash(caller.ID))
	return nil
}

// Ready implements mcpserver.Backend.
func (b *Backend) Ready(ctx context.Context) error {
	return mapErr(b.docker.Ping(ctx))
}

// Close implements mcpserver.Backend: it stops the reaper and force-removes
// every container of this run, including any the registry does not know
// (a create that finished while the server was shutting down).
func (b *Backend) Close(ctx context.Context) error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	list, err := b.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: b.node})
	if err != nil {
		return fmt.Errorf("listing this server's sandboxes for removal: %w", err)
	}
	errs := b.removeAll(ctx, list)
	b.mu.Lock()
	for id := range b.sandboxes {
		_ = b.history.Delete(id)
	}
	b.sandboxes = map[string]*entry{}
	b.mu.Unlock()
	if len(list) > 0 {
		b.log.Info("removed this server's sandboxes", "count", len(list)-len(errs))
	}
	if fw := b.opts.EgressFirewall; fw != nil && b.egressStop != nil {
		b.egressStop()
		<-b.egressDone
		if len(errs) == 0 {
			// Rules stay while sandboxes may remain, and when a node
			// manager owns them.
			if err := fw.Close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("removing the egress firewall: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeAll force-removes containers, a few at a time.
func (b *Backend) removeAll(ctx context.Context, list []dockerruntime.Container) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
	)
	for _, c := range list {
		wg.Add(1)
		sem <- struct{}{}
		go func(c dockerruntime.Container) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := b.docker.Remove(ctx, c.ID, 0); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	return errs
}

// sweepOrphans removes the containers of server runs that are provably
// dead. It reports whether the sweep completed.
func (b *Backend) sweepOrphans(ctx context.Context) bool {
	list, err := b.docker.ListManaged(ctx, dockerruntime.ListFilter{})
	if err != nil {
		b.log.Warn("cannot sweep orphaned sandboxes yet; will retry", "error", err)
		return false
	}
	var orphans []dockerruntime.Container
	for _, c := range list {
		node := c.Labels[dockerruntime.LabelNode]
		if node == b.node {
			continue
		}
		other, ok := ParseInstance(node)
		if !ok {
			continue
		}
		if b.instance.Check(other) == Dead {
			orphans = append(orphans, c)
		}
	}
	errs := b.removeAll(ctx, orphans)
	if len(orphans) > 0 {
		b.log.Info("removed sandboxes of server runs that are gone", "count", len(orphans)-len(errs), "failed", len(errs))
	}
	b.mu.Lock()
	b.swept = len(errs) == 0
	b.mu.Unlock()
	return len(errs) == 0
}

func (b *Backend) loop() {
	defer close(b.loopDone)
	t := time.NewTicker(mcpserver.ReapInterval(b.opts.IdleTimeout))
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.reap(b.opts.Clock())
			b.mu.Lock()
			swept := b.swept
			b.mu.Unlock()
			if !swept {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				b.sweepOrphans(ctx)
				cancel()
			}
		}
	}
}

// reap removes sandboxes past their lifetime, and idle ones.
func (b *Backend) reap(now time.Time) {
	type victim struct {
		e   *entry
		why string
	}
	var victims []victim
	b.mu.Lock()
	for _, e := range b.sandboxes {
		if why := e.ReapReason(now, b.opts.IdleTimeout); why != "" {
			e.Removing = true
			victims = append(victims, victim{e, why})
		}
	}
	b.mu.Unlock()
	for _, v := range victims {
		b.log.Info("removing sandbox", "sandbox", v.e.id, "reason", v.why)
		b.removeContainer(v.e.dockerID, 0, v.why)
		b.forget(v.e.id)
	}
}
