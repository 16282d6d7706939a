// Package dockerbackend runs the MCP server's sandboxes on the local Docker
// Engine through internal/dockerruntime, so they are hardened exactly as the
// operator's. Each container is labelled managed-by=code-sandbox-mcp with a
// random sandbox UID, the owner's identity hash as namespace and this server
// run's instance ID as node; the backend removes its containers when the
// server exits, and the containers of dead server runs when it starts. The
// bookkeeping (registry, ownership, limits, reaping) is the session
// package's: this package is its Docker driver.
package dockerbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// Defaults for Options.
const (
	DefaultMaxSandboxes = session.DefaultMaxSandboxes
	DefaultIdleTimeout  = session.DefaultIdleTimeout
	DefaultStopGrace    = dockerruntime.DefaultStopGracePeriod
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
	// IdlePause, when set, pauses a sandbox nobody used for this long
	// (the cgroup freezer: no CPU, memory kept); its next exec or file
	// transfer resumes it. It must be shorter than IdleTimeout.
	IdlePause time.Duration
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
	// WarmPool keeps this many paused sandboxes of the default settings
	// (DefaultImage, default CPU and memory, no network) ready for
	// sandbox_initialize (pool.go); 0 (the default here) turns it off, at
	// most MaxWarmPool.
	WarmPool int
	// DefaultImage is the image sandbox_initialize uses when none is given
	// (the tools' Config.DefaultImage); the warm pool's members run it.
	// Default contract.DefaultImage.
	DefaultImage string
	// SnapshotDir is where this run keeps snapshots (snapshots.go), in a
	// directory of its own that Close removes; default os.TempDir().
	SnapshotDir string
	// MaxSnapshots bounds the snapshots one identity may keep (default
	// DefaultMaxSnapshots).
	MaxSnapshots int
	// SnapshotStore, when set (--snapshot-registry), holds the snapshots'
	// tars instead of SnapshotDir; the records stay in SnapshotDir.
	SnapshotStore snapshotstore.Store
}

// Backend implements contract.Backend on Docker: a session.Manager on the
// Docker driver.
type Backend struct {
	*session.Manager
	driver *driver
}

// driver is the session.Driver that runs sandboxes as containers. Its
// Refs are container IDs.
type driver struct {
	// restoring counts the snapshot restores in flight (a fork's children
	// getting their files); the warm pool's refill waits for them.
	restoring atomic.Int32

	docker   *dockerruntime.Client
	instance Instance
	node     string
	opts     Options
	log      *slog.Logger
	history  *history.Store
	// pool is the warm pool (pool.go); nil when Options.WarmPool is 0.
	pool *pool
	// thaws holds the unpauses of claimed warm pool members still under
	// way, by container ID (*thawing, pool.go): dockerruntime.BeginUnpause
	// keeps the thaw; this map keeps a failed one, which fails the sandbox.
	thaws sync.Map

	mu sync.Mutex
	// swept: the orphan sweep has completed once.
	swept bool
	// removeFailed: RemoveAll left containers behind, so the egress
	// firewall stays.
	removeFailed bool

	// snaps is the snapshot store, made at the first use (snapshots.go).
	snapMu sync.Mutex
	snaps  *snapshotStore

	egressStop context.CancelFunc
	egressDone chan struct{}
}

var (
	_ contract.Backend = (*Backend)(nil)
	_ session.Starter  = (*driver)(nil)
)

// New returns a backend; Start sweeps the orphans of dead server runs and
// starts its reaper. Docker need not be up yet: the orphan sweep is
// retried until it succeeds.
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
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.WarmPool < 0 || opts.WarmPool > MaxWarmPool {
		return nil, fmt.Errorf("dockerbackend: warm pool size %d: want 0 (off) to %d", opts.WarmPool, MaxWarmPool)
	}
	if opts.DefaultImage == "" {
		opts.DefaultImage = contract.DefaultImage
	}
	hist, err := history.New(opts.HistoryDir, 0)
	if err != nil {
		return nil, err
	}
	d := &driver{
		docker:   opts.Client,
		instance: opts.Instance,
		node:     opts.Instance.String(),
		opts:     opts,
		log:      opts.Logger,
		history:  hist,
	}
	if opts.WarmPool > 0 {
		d.pool = newPool(d, opts.WarmPool, opts.DefaultImage)
	}
	m := session.New(d, session.Options{
		MaxSandboxes: opts.MaxSandboxes,
		IdleTimeout:  opts.IdleTimeout,
		IdlePause:    opts.IdlePause,
		Clock:        opts.Clock,
		Logger:       opts.Logger,
	})
	return &Backend{Manager: m, driver: d}, nil
}

// InstanceID is the node label this run puts on its containers.
func (b *Backend) InstanceID() string { return b.driver.node }

// Start sweeps orphans once (bounded) and starts the egress firewall's
// checks; the session.Manager then starts the reaper.
func (b *driver) Start(ctx context.Context) {
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
	b.pool.start()
}

func newUID() string { return randid.Hex(12) }

// mapErr translates dockerruntime's errors into the backend contract,
// keeping Docker's text.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, dockerruntime.ErrImageNotAllowed):
		// The server's registry policy (--allowed-registries) refuses the
		// image's registry; nothing was pulled.
		return fmt.Errorf("%w: %w", contract.ErrInvalid, err)
	case errors.Is(err, dockerruntime.ErrImageNotFound):
		// A failed pull's text names the failure class only; the daemon's
		// own error (which may quote the registry) is logged by Create.
		return fmt.Errorf("%w: %w", contract.ErrImageNotFound, err)
	case errors.Is(err, dockerruntime.ErrUnavailable):
		return fmt.Errorf("%w: %w", contract.ErrUnavailable, err)
	case errors.Is(err, dockerruntime.ErrRuntimeUnavailable):
		return fmt.Errorf("%w: %w", contract.ErrUnavailable, err)
	case errors.Is(err, dockerruntime.ErrInvalidSpec):
		return fmt.Errorf("%w: %w", contract.ErrInvalid, err)
	case errors.Is(err, dockerruntime.ErrNotFound):
		return fmt.Errorf("%w: %w", contract.ErrNotFound, err)
	case errors.Is(err, dockerruntime.ErrPaused):
		// Frozen outside this server (docker pause); the server thaws
		// only the sandboxes it paused itself (--idle-pause).
		return fmt.Errorf("%w: %w", contract.ErrNotRunning, err)
	case cerrdefs.IsConflict(err):
		// Docker answers 409 Conflict to an exec in a container that is
		// not running, paused or restarting.
		return fmt.Errorf("%w: %w", contract.ErrNotRunning, err)
	}
	return err
}

// forgetHistory drops the exec history of a sandbox that is gone.
func (b *driver) forgetHistory(id string) {
	if err := b.history.Delete(id); err != nil {
		b.log.Warn("deleting exec history", "sandbox", id, "error", err)
	}
}

// Create implements session.Driver.
func (b *driver) Create(ctx context.Context, caller contract.Caller, req contract.CreateRequest) (string, contract.Sandbox, error) {
	if len(req.EgressAllow) > 0 {
		// Refused, never ignored: ignoring it would give the sandbox the
		// whole internet where its caller asked for a few names.
		return "", contract.Sandbox{}, fmt.Errorf("%w: egress_allow is not supported on the Docker backend, which runs no egress proxy; use the Kubernetes backend, or leave egress_allow out for unrestricted egress", contract.ErrInvalid)
	}
	warm := b.pool.matches(req)
	if warm {
		// A default create takes a warm pool member; with none, it
		// creates cold and the pool refills in the background.
		ref, sb, ok, err := b.pool.claim(ctx, caller)
		if ok || err != nil {
			return ref, sb, err
		}
		if req.Image == "" {
			req.Image = b.pool.image
		}
	}
	uid := newUID()
	spec := b.spec(uid, contract.IdentityHash(caller.ID), req)
	// The container must not outlive a cancelled request half-made: the
	// create runs to completion and is undone below if the caller left.
	ct, err := b.docker.CreateAndStart(context.WithoutCancel(ctx), spec)
	if err != nil {
		if pe := (*dockerruntime.PullError)(nil); errors.As(err, &pe) {
			b.log.Warn("image pull failed", "image", req.Image, "class", string(pe.Class), "error", pe.Detail, "owner", contract.IdentityHash(caller.ID))
		}
		b.cleanupFailedCreate(uid)
		return "", contract.Sandbox{}, mapErr(err)
	}
	if ctx.Err() != nil {
		b.removeContainer(ct.ID, 0, "request cancelled during create")
		return "", contract.Sandbox{}, ctx.Err()
	}
	sb := contract.Sandbox{
		ID: uid, Image: req.Image, Network: req.Network, WorkingDir: dockerruntime.DefaultWorkingDir,
		NanoCPUs: orDefault(req.NanoCPUs, dockerruntime.DefaultNanoCPUs), MemoryBytes: orDefault(req.MemoryBytes, dockerruntime.DefaultMemoryBytes),
	}
	if sb.Network == "" {
		sb.Network = contract.NetworkNone
	}
	// Answered once the resident helper CreateAndStart began is up, so
	// that the caller's first command costs what a repeated one does (as
	// a node manager reports a Sandbox Ready only then).
	b.docker.AwaitHelper(ctx, ct.ID)
	b.log.Info("sandbox created", "sandbox", uid, "container", dockerruntime.ShortID(ct.ID), "image", req.Image, "owner", contract.IdentityHash(caller.ID))
	if warm {
		// The default image is on the host now: the pool may fill.
		b.pool.wake()
	}
	return ct.ID, view(sb, ct.State), nil
}

// spec is the container spec of a sandbox for req (a warm pool member's
// too, so that it is made exactly as a default create would make it).
func (b *driver) spec(uid, namespace string, req contract.CreateRequest) dockerruntime.Spec {
	network := dockerruntime.NetworkNone
	if req.Network == contract.NetworkEgress {
		network = dockerruntime.NetworkEgress
	}
	return dockerruntime.Spec{
		Owner: dockerruntime.Owner{
			ManagedBy: dockerruntime.ManagedByMCP,
			UID:       uid,
			Namespace: namespace,
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
}

func orDefault(v, d int64) int64 {
	if v == 0 {
		return d
	}
	return v
}

// cleanupFailedCreate removes a container a failed create may have left.
func (b *driver) cleanupFailedCreate(uid string) {
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

func (b *driver) removeContainer(dockerID string, grace time.Duration, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), grace+time.Minute)
	defer cancel()
	if err := b.docker.Remove(ctx, dockerID, grace); err != nil {
		b.log.Warn("removing sandbox container", "container", dockerruntime.ShortID(dockerID), "reason", why, "error", err)
	}
}

// view is sb, as recorded at create, in container state st.
func view(sb contract.Sandbox, st dockerruntime.ContainerState) contract.Sandbox {
	sb.Status = st.Status
	if st.OOMKilled {
		sb.Status += " (OOM-killed)"
	}
	return sb
}

// Get implements session.Driver.
func (b *driver) Get(ctx context.Context, h session.Handle) (contract.Sandbox, error) {
	if err := b.thawed(ctx, h); err != nil {
		return contract.Sandbox{}, err
	}
	ct, err := b.docker.Inspect(ctx, h.Ref)
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forgetHistory(h.ID)
		return contract.Sandbox{}, session.Gone(fmt.Errorf("%w: %q (its container was removed outside this server)", contract.ErrNotFound, h.ID))
	}
	if err != nil {
		return contract.Sandbox{}, mapErr(err)
	}
	return view(h.Sandbox, ct.State), nil
}

// List implements session.Driver: the state of each of mine.
func (b *driver) List(ctx context.Context, _ contract.Caller, mine []session.Handle) ([]contract.Sandbox, error) {
	list, err := b.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: b.node})
	if err != nil {
		return nil, mapErr(err)
	}
	states := map[string]dockerruntime.ContainerState{}
	for _, c := range list {
		states[c.ID] = c.State
	}
	out := make([]contract.Sandbox, 0, len(mine))
	for _, h := range mine {
		st, ok := states[h.Ref]
		if !ok {
			st.Status = "removed"
		}
		out = append(out, view(h.Sandbox, st))
	}
	return out, nil
}

// Exec implements session.Driver, and records the command in the
// sandbox's exec history.
func (b *driver) Exec(ctx context.Context, h session.Handle, req execio.Request, out contract.OutputFunc) (execio.Result, error) {
	if err := b.thawed(ctx, h); err != nil {
		return execio.Result{}, err
	}
	started := time.Now()
	res, err := b.docker.RunCommand(ctx, h.Ref, req, out.Writer("stdout"), out.Writer("stderr"))
	rec := history.Record{
		ID: newUID()[:16], Command: req.Command, Shell: req.Shell, WorkingDir: req.WorkingDir, StartedAt: started,
		DurationMillis: res.DurationMillis, ExitCode: res.ExitCode, TimedOut: res.TimedOut, Truncated: res.Truncated(),
		Caller: contract.IdentityHash(h.Caller.ID),
	}
	if err != nil {
		rec.Error = err.Error()
		if rec.DurationMillis == 0 {
			rec.DurationMillis = time.Since(started).Milliseconds()
		}
	}
	if herr := b.history.Append(h.ID, rec); herr != nil {
		b.log.Warn("recording exec history", "sandbox", h.ID, "error", herr)
	}
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forgetHistory(h.ID)
		return res, session.Gone(mapErr(err))
	}
	return res, mapErr(err)
}

// Upload implements session.Driver.
func (b *driver) Upload(ctx context.Context, h session.Handle, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	target, err := execio.ResolvePath(dockerruntime.DefaultWorkingDir, destDir)
	if err != nil {
		return execio.TransferStats{}, err
	}
	if err := b.thawed(ctx, h); err != nil {
		return execio.TransferStats{}, err
	}
	stats, err := b.docker.CopyIn(ctx, h.Ref, target, archive, limits)
	return stats, mapErr(err)
}

// Download implements session.Driver.
func (b *driver) Download(ctx context.Context, h session.Handle, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	target, err := execio.ResolvePath(dockerruntime.DefaultWorkingDir, src)
	if err != nil {
		return execio.TransferStats{}, err
	}
	if err := b.thawed(ctx, h); err != nil {
		return execio.TransferStats{}, err
	}
	stats, err := b.docker.CopyOut(ctx, h.Ref, target, w, maxBytes)
	return stats, mapErr(err)
}

// Logs implements session.Driver.
func (b *driver) Logs(ctx context.Context, h session.Handle, opts contract.LogsOptions) (contract.Logs, error) {
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	tb := execio.NewTailBuffer(int(maxBytes))
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.docker.Logs(lctx, h.Ref, dockerruntime.LogsOptions{Tail: opts.TailLines}, tb, tb); err != nil {
		return contract.Logs{}, mapErr(err)
	}
	recs, err := b.history.Tail(h.ID, opts.HistoryRecords)
	if err != nil {
		return contract.Logs{}, err
	}
	return contract.Logs{Output: tb.String(), Truncated: tb.Truncated(), History: recs}, nil
}

// Remove implements session.Driver. sandbox_stop gives the container its
// grace period; the reaper forces it.
func (b *driver) Remove(ctx context.Context, h session.Handle, how session.Removal) error {
	// A member still thawing is removed once thawed, so that a graceful
	// stop reaches its processes; the thaw's own error does not matter.
	_ = b.thawed(context.WithoutCancel(ctx), h)
	defer b.thaws.Delete(h.Ref)
	if how == session.RemoveReap {
		err := b.docker.Remove(ctx, h.Ref, 0)
		b.forgetHistory(h.ID)
		return err
	}
	// Removal continues if the caller goes away: a half-stopped sandbox
	// helps nobody.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.StopGrace+time.Minute)
	defer cancel()
	if err := b.docker.Remove(rctx, h.Ref, b.opts.StopGrace); err != nil {
		return mapErr(err)
	}
	b.forgetHistory(h.ID)
	return nil
}

// Sweep implements session.Driver: it retries the orphan sweep until it
// has completed once.
func (b *driver) Sweep(ctx context.Context) {
	b.mu.Lock()
	swept := b.swept
	b.mu.Unlock()
	if !swept {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		b.sweepOrphans(sctx)
		cancel()
	}
}

// Ready implements session.Driver.
func (b *driver) Ready(ctx context.Context) error {
	return mapErr(b.docker.Ping(ctx))
}

// RemoveAll implements session.Driver: it force-removes every container of
// this run, including any the Manager does not hold (a create that
// finished while the server was shutting down).
func (b *driver) RemoveAll(ctx context.Context) error {
	// The pool stops refilling first, so that no member is created after
	// the list below.
	b.pool.close(ctx)
	list, err := b.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: b.node})
	if err != nil {
		b.mu.Lock()
		b.removeFailed = true
		b.mu.Unlock()
		return fmt.Errorf("listing this server's sandboxes for removal: %w", err)
	}
	errs := b.removeAll(ctx, list)
	for _, c := range list {
		if uid := c.Labels[dockerruntime.LabelSandboxUID]; uid != "" {
			_ = b.history.Delete(uid)
		}
	}
	if len(list) > 0 {
		b.log.Info("removed this server's sandboxes", "count", len(list)-len(errs))
	}
	b.mu.Lock()
	b.removeFailed = len(errs) > 0
	b.mu.Unlock()
	return errors.Join(errs...)
}

// Close implements session.Driver: it stops the egress firewall's checks
// and removes its rules, unless sandboxes may remain.
func (b *driver) Close(ctx context.Context) error {
	b.pool.close(ctx)
	b.closeSnapshots()
	b.docker.ReleaseMachineIDs(ctx)
	fw := b.opts.EgressFirewall
	if fw == nil || b.egressStop == nil {
		return nil
	}
	b.egressStop()
	<-b.egressDone
	b.mu.Lock()
	failed := b.removeFailed
	b.mu.Unlock()
	if failed {
		return nil
	}
	// Rules stay while sandboxes may remain, and when a node manager owns
	// them.
	if err := fw.Close(ctx); err != nil {
		return fmt.Errorf("removing the egress firewall: %w", err)
	}
	return nil
}

// removeAll force-removes containers, a few at a time.
func (b *driver) removeAll(ctx context.Context, list []dockerruntime.Container) []error {
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
func (b *driver) sweepOrphans(ctx context.Context) bool {
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
