/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
)

// Runtime is what the node API needs from the node's Docker Engine.
// *dockerruntime.Client implements it.
type Runtime interface {
	Inspect(ctx context.Context, idOrName string) (dockerruntime.Container, error)
	RunCommand(ctx context.Context, id string, req execio.Request, stdout, stderr io.Writer) (execio.Result, error)
	CopyIn(ctx context.Context, id string, dest execio.Target, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error)
	CopyOut(ctx context.Context, id string, src execio.Target, w io.Writer, maxBytes int64) (execio.TransferStats, error)
	Logs(ctx context.Context, id string, opts dockerruntime.LogsOptions, stdout, stderr io.Writer) error

	// Background processes (processes.go).
	StartProcess(ctx context.Context, id, handle string, req execio.Request, timeout time.Duration) (execio.ProcessStatus, error)
	ListProcesses(ctx context.Context, id string) ([]execio.ProcessStatus, error)
	WaitProcess(ctx context.Context, id, handle string, off dockerruntime.ProcessOffsets, timeout time.Duration) (execio.ProcessOutput, error)
	KillProcess(ctx context.Context, id, handle string) (execio.ProcessStatus, error)
	WriteProcessStdin(ctx context.Context, id, handle string, data []byte, eof bool) (execio.ProcessStatus, error)

	DialPort(ctx context.Context, id string, port int) (dockerruntime.PortConn, error)
	Stats(ctx context.Context, id string) (dockerruntime.Stats, error)
}

// Activity hears of every exec, file transfer and log read, which are
// what spec.lifecycle's idle timeouts count. The node manager's
// *sandbox.Activity (controllers/sandbox/idle.go) implements it.
type Activity interface {
	// Begin records activity on sbx. With wake the operation needs the
	// container running, and an idle-paused one is thawed before Begin
	// returns. end is called when the operation ends.
	Begin(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, wake bool) (end func(), err error)
	// Background records that a background process was started in sbx:
	// while one runs, the idle clock does not run out (the reconciler
	// asks the helper before it pauses or deletes the sandbox for
	// idleness).
	Background(sbx *sandboxv1alpha1.Sandbox)
}

// HistoryStore keeps the exec history of each Sandbox, keyed by its UID.
// *history.Store implements it.
type HistoryStore interface {
	Append(key string, r history.Record) error
	Tail(key string, n int) ([]history.Record, error)
	Follow(ctx context.Context, key string, tail int, fn func(history.Record) error) error
}

// Defaults of Config.
const (
	DefaultMaxExecsPerSandbox = 64
	// DefaultMaxExecs is the manager's default node-wide bound
	// (--max-execs). Each request in flight may hold its decoded body (up
	// to the stdin cap, several times over while it is copied to the
	// helper), so the bound is what keeps the manager inside its memory
	// limit; a node of many busy Sandboxes raises it with the limit.
	DefaultMaxExecs = 32
	// DefaultExecBodyBudget is the manager's default node-wide budget of
	// exec request bytes (--exec-body-budget): two requests of the
	// largest size (maxExecBody, about 25 MiB) at once, or any number of
	// small ones up to --max-execs.
	DefaultExecBodyBudget int64 = 64 << 20
	// DefaultMaxFollowersPerSandbox and DefaultMaxFollowers bound the
	// followed log and history streams (follow=true), which last until
	// their caller leaves: per Sandbox, and the manager's default per node
	// (--max-followers).
	DefaultMaxFollowersPerSandbox = 4
	DefaultMaxFollowers           = 128
	DefaultDockerCheckTimeout     = 10 * time.Second
)

// Config configures a Server.
type Config struct {
	// NodeName is this node. The API refuses Sandboxes bound elsewhere.
	NodeName string
	// Sandboxes reads Sandboxes; normally the manager's cached client.
	Sandboxes client.Reader
	// APIReader is asked when Sandboxes does not know a Sandbox (a cache
	// that has not caught up yet). Optional.
	APIReader client.Reader
	// Runtime reaches the node's Docker Engine.
	Runtime Runtime
	// ManagedBy is the managed-by label value of our containers; empty
	// means dockerruntime.ManagedByValue.
	ManagedBy string
	// History records every exec and serves the history subresource.
	History HistoryStore
	// EgressEvents returns the node egress proxy's recent decisions about
	// one sandbox ("namespace/name", the label the manager gives its
	// policy), oldest first; it serves log?egress. Nil: this node runs no
	// egress proxy. See EgressEventsOf.
	EgressEvents func(sandbox string) []subresource.EgressEvent
	// Authenticator admits the operator's aggregated API server and names
	// the end user it vouches for; see NewFrontProxyAuthenticator. Required:
	// the API has no anonymous mode. Authorisation happened in front of it.
	Authenticator authenticator.Request

	// ExecOutputLimit is the largest per-stream output cap of one exec; a
	// request may ask for less. Zero means execio.DefaultOutputLimit.
	ExecOutputLimit int64
	// FileTransferLimit caps the file contents of one upload or download.
	// Zero means execio.DefaultUploadLimit.
	FileTransferLimit int64
	// MaxExecsPerSandbox bounds concurrent execs and file transfers in one
	// Sandbox; more get 429. Zero means DefaultMaxExecsPerSandbox.
	MaxExecsPerSandbox int
	// MaxExecs bounds them across the node; zero means no node-wide bound.
	MaxExecs int
	// ExecBodyBudget bounds the bytes of exec request bodies held at once
	// across the node, counted before they are read: a request's declared
	// length is reserved before its body is read, an undeclared one's
	// bytes as they arrive. A request that does not fit gets 429 (413 when
	// it is larger than the whole budget). Zero means no budget.
	ExecBodyBudget int64
	// MaxFollowersPerSandbox bounds the followed log and history streams
	// of one Sandbox; more get 429. Zero means DefaultMaxFollowersPerSandbox.
	MaxFollowersPerSandbox int
	// MaxFollowers bounds them across the node; zero means no node-wide
	// bound.
	MaxFollowers int
	// DockerCheckTimeout bounds the container check before each request, so
	// that a hung Docker Engine yields a quick 503.
	DockerCheckTimeout time.Duration
	// Activity, when set, is told of every exec, file transfer and log
	// read, and thaws an idle-paused container for an exec or transfer.
	Activity Activity
	// Logger is the server's logger; empty means logf.Log.WithName("nodeapi").
	Logger logr.Logger
}

// Server is the node API's HTTP handler. Serve it over TLS with NewRunnable.
type Server struct {
	cfg     Config
	log     logr.Logger
	handler http.Handler
	limits  *limiter
	// followers counts followed log and history streams.
	followers *limiter
	// bodies is the node-wide exec body budget; nil means none.
	bodies *byteBudget

	// verified remembers containers proven to be a Sandbox's own and
	// running, keyed by container ID, so that a busy agent does not pay a
	// Docker inspect per command. A container's labels and name never
	// change; whether it still runs is also in the Sandbox's Ready
	// condition, and a command in a container that stopped since fails
	// with an error frame.
	verifiedMu sync.Mutex
	verified   map[string]verifiedContainer
}

// ownershipTTL is how long a verified container is trusted without a new
// inspect. It also bounds how long a Docker outage can answer 200 with an
// error frame rather than a quick 503.
const ownershipTTL = 5 * time.Second

type verifiedContainer struct {
	uid string
	ct  dockerruntime.Container
	at  time.Time
}

// NewServer validates cfg and builds the handler.
func NewServer(cfg Config) (*Server, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("node API: a node name is required")
	case cfg.Sandboxes == nil:
		return nil, errors.New("node API: a Sandbox reader is required")
	case cfg.Runtime == nil:
		return nil, errors.New("node API: a runtime is required")
	case cfg.History == nil:
		return nil, errors.New("node API: a history store is required")
	case cfg.Authenticator == nil:
		return nil, errors.New("node API: an authenticator is required")
	}
	if cfg.ManagedBy == "" {
		cfg.ManagedBy = dockerruntime.ManagedByValue
	}
	if cfg.ExecOutputLimit <= 0 {
		cfg.ExecOutputLimit = execio.DefaultOutputLimit
	}
	cfg.ExecOutputLimit = min(cfg.ExecOutputLimit, execio.MaxOutputLimit)
	if cfg.FileTransferLimit <= 0 {
		cfg.FileTransferLimit = execio.DefaultUploadLimit
	}
	if cfg.MaxExecsPerSandbox <= 0 {
		cfg.MaxExecsPerSandbox = DefaultMaxExecsPerSandbox
	}
	if cfg.MaxFollowersPerSandbox <= 0 {
		cfg.MaxFollowersPerSandbox = DefaultMaxFollowersPerSandbox
	}
	if cfg.DockerCheckTimeout <= 0 {
		cfg.DockerCheckTimeout = DefaultDockerCheckTimeout
	}
	log := cfg.Logger
	if log.GetSink() == nil {
		log = logf.Log.WithName("nodeapi")
	}
	s := &Server{
		cfg: cfg,
		log: log,
		limits: newLimiter(cfg.MaxExecsPerSandbox, cfg.MaxExecs, subresource.CauseExecLimit,
			"commands or transfers", "retry when one ends"),
		followers: newLimiter(cfg.MaxFollowersPerSandbox, cfg.MaxFollowers, subresource.CauseFollowLimit,
			"followed log or history streams", "close one, or read without follow"),
		verified: map[string]verifiedContainer{},
	}
	if cfg.ExecBodyBudget > 0 {
		s.bodies = &byteBudget{max: cfg.ExecBodyBudget}
	}
	s.handler = s.authenticate(http.HandlerFunc(s.serve))
	return s, nil
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	// Routing first: a malformed URL is answered before anything else.
	rt, err := subresource.ParseRoute(subresource.PathPrefix, r)
	if err != nil {
		writeError(w, err)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), routeKey{}, rt))
	s.handler.ServeHTTP(subresource.NameSandbox(w, rt.Name), r)
}

type routeKey struct{}

// serve runs after authentication.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rt := r.Context().Value(routeKey{}).(subresource.Route)
	ctx := logf.IntoContext(r.Context(), s.log.WithValues(
		"namespace", rt.Namespace, "sandbox", rt.Name, "subresource", rt.Subresource, "user", callerName(r.Context())))
	r = r.WithContext(ctx)
	// Reading history touches no container, and logs only read one, so
	// both also serve a Sandbox that is not Ready (to show why it died).
	// exec and files act on the container and need a Ready Sandbox.
	needReady := subresource.NeedsReady(rt.Subresource)
	sbx, err := s.sandbox(ctx, rt, needReady)
	if err != nil {
		writeError(w, err)
		return
	}
	if rt.Subresource == subresource.SubresourceHistory {
		s.serveHistory(w, r, sbx)
		return
	}
	if rt.Subresource == subresource.SubresourceLog && r.URL.Query().Has(subresource.QueryEgress) {
		// The proxy's record, not the container's: no container needed.
		s.serveEgressLog(w, r, sbx)
		return
	}
	// Before the container check: an idle-paused container is thawed for
	// an exec or transfer (needReady), which then finds it running.
	if rt.Subresource == subresource.SubresourceExec {
		defer observeExec(sbx, time.Now())
	}
	if s.cfg.Activity != nil && rt.Subresource != subresource.SubresourceMetrics { // metrics: no activity, never wakes
		end, err := s.cfg.Activity.Begin(ctx, sbx, needReady)
		if err != nil {
			writeError(w, err)
			return
		}
		defer end()
	}
	ct, err := s.container(ctx, sbx, needReady)
	if err != nil {
		writeError(w, err)
		return
	}
	switch rt.Subresource {
	case subresource.SubresourceExec:
		s.serveExec(w, r, sbx, ct)
	case subresource.SubresourceProcesses:
		s.serveProcesses(w, r, sbx, ct)
	case subresource.SubresourceFiles:
		if r.Method == http.MethodPost {
			s.serveUpload(w, r, sbx, ct)
		} else {
			s.serveDownload(w, r, sbx, ct)
		}
	case subresource.SubresourceLog:
		s.serveLog(w, r, sbx, ct)
	case subresource.SubresourcePortForward:
		s.servePortForward(w, r, sbx, ct)
	case subresource.SubresourceMetrics:
		s.serveMetrics(w, r, sbx, ct)
	}
}

// sandbox looks the Sandbox up and checks that this node serves it.
func (s *Server) sandbox(ctx context.Context, rt subresource.Route, needReady bool) (*sandboxv1alpha1.Sandbox, error) {
	key := types.NamespacedName{Namespace: rt.Namespace, Name: rt.Name}
	sbx, err := subresource.GetSandbox(ctx, getter(s.cfg.Sandboxes), getter(s.cfg.APIReader), key)
	if err != nil {
		return nil, err
	}
	if sbx.Status.NodeName != s.cfg.NodeName {
		where := "is not bound to any node yet"
		if sbx.Status.NodeName != "" {
			where = "runs on node " + sbx.Status.NodeName
		}
		return nil, notFound("sandbox %s is not on node %s: it %s", key, s.cfg.NodeName, where).Because(subresource.CauseSandboxNotOnNode, "")
	}
	if !needReady {
		return sbx, nil
	}
	if sbx = subresource.FreshIfNotReady(ctx, getter(s.cfg.APIReader), sbx); sbx.Status.NodeName != s.cfg.NodeName {
		return nil, notFound("sandbox %s is not on node %s any more", key, s.cfg.NodeName).Because(subresource.CauseSandboxNotOnNode, "")
	}
	if err := subresource.CheckReady(sbx); err != nil {
		return nil, err
	}
	return sbx, nil
}

// getter reads Sandboxes with r, or is nil when r is.
func getter(r client.Reader) subresource.GetFunc {
	if r == nil {
		return nil
	}
	return func(ctx context.Context, key types.NamespacedName, sbx *sandboxv1alpha1.Sandbox) error {
		return r.Get(ctx, key, sbx)
	}
}

// container inspects the Sandbox's container and proves it is ours: our
// managed-by label, this Sandbox's UID, this node, and the deterministic
// name that only a create for this UID can take. The API never acts on any
// other container, whatever status.containerID says.
func (s *Server) container(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, needRunning bool) (dockerruntime.Container, error) {
	key := client.ObjectKeyFromObject(sbx)
	if sbx.Status.ContainerID == "" {
		return dockerruntime.Container{}, conflict("sandbox %s has no container", key).Because(subresource.CauseContainerNotRunning, "")
	}
	if needRunning {
		if ct, ok := s.recentlyVerified(sbx.Status.ContainerID, string(sbx.ContainerUID())); ok {
			return ct, nil
		}
	}
	ictx, cancel := context.WithTimeout(ctx, s.cfg.DockerCheckTimeout)
	defer cancel()
	ct, err := s.cfg.Runtime.Inspect(ictx, sbx.Status.ContainerID)
	switch {
	case errors.Is(err, dockerruntime.ErrNotFound):
		return ct, conflict("sandbox %s: its container %s is gone; the manager is recreating it",
			key, dockerruntime.ShortID(sbx.Status.ContainerID)).Because(subresource.CauseContainerNotRunning, "")
	case err != nil:
		return ct, err
	}
	// A Sandbox that took over a warm pool member runs in the member's
	// container, named and labelled with the member's UID; only the
	// manager writes the status that says so. The member was in the same
	// namespace: a container made for another namespace's Sandbox is never
	// this one's, whatever the status says.
	uid := string(sbx.ContainerUID())
	if !ct.OwnedBy(s.cfg.ManagedBy, uid) || ct.Labels[dockerruntime.LabelNode] != s.cfg.NodeName || ct.Name != dockerruntime.ContainerName(uid) ||
		ct.Labels[dockerruntime.LabelNamespace] != sbx.Namespace {
		logf.FromContext(ctx).Info("refusing a container that is not this sandbox's",
			"container", dockerruntime.ShortID(ct.ID), "name", ct.Name, "labels", ct.Labels)
		return ct, conflict("sandbox %s: container %s is not the sandbox's own container; refusing to touch it",
			key, dockerruntime.ShortID(ct.ID)).Because(subresource.CauseContainerNotRunning, "")
	}
	if needRunning && ct.State.Paused {
		return ct, conflict("sandbox %s: its container %s is paused; set spec.paused to false to resume it",
			key, dockerruntime.ShortID(ct.ID)).Because(subresource.CauseSandboxPaused, "")
	}
	if needRunning && !ct.State.Running {
		return ct, conflict("sandbox %s: its container %s is %s, not running", key, dockerruntime.ShortID(ct.ID), ct.State.Status).Because(subresource.CauseContainerNotRunning, "")
	}
	if needRunning {
		s.rememberVerified(sbx.Status.ContainerID, uid, ct)
	}
	return ct, nil
}

func (s *Server) recentlyVerified(id, uid string) (dockerruntime.Container, bool) {
	s.verifiedMu.Lock()
	defer s.verifiedMu.Unlock()
	v, ok := s.verified[id]
	if !ok || v.uid != uid || time.Since(v.at) > ownershipTTL {
		return dockerruntime.Container{}, false
	}
	return v.ct, true
}

func (s *Server) rememberVerified(id, uid string, ct dockerruntime.Container) {
	s.verifiedMu.Lock()
	defer s.verifiedMu.Unlock()
	now := time.Now()
	if len(s.verified) >= 1024 {
		for k, v := range s.verified {
			if now.Sub(v.at) > ownershipTTL {
				delete(s.verified, k)
			}
		}
	}
	s.verified[id] = verifiedContainer{uid: uid, ct: ct, at: now}
}

// limiter bounds concurrent requests of one kind (execs and transfers, or
// followers) per Sandbox and per node.
type limiter struct {
	mu         sync.Mutex
	perSandbox map[types.UID]int
	total      int
	maxPer     int
	maxTotal   int
	// cause, what and hint word the refusal.
	cause      metav1.CauseType
	what, hint string
}

func newLimiter(maxPer, maxTotal int, cause metav1.CauseType, what, hint string) *limiter {
	return &limiter{perSandbox: map[types.UID]int{}, maxPer: maxPer, maxTotal: maxTotal, cause: cause, what: what, hint: hint}
}

// acquire takes a slot or says why not; release gives it back.
func (l *limiter) acquire(uid types.UID) (release func(), err *apiError) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perSandbox[uid] >= l.maxPer {
		return nil, tooMany(l.cause, "this sandbox already has %d %s, its limit; %s", l.maxPer, l.what, l.hint)
	}
	if l.maxTotal > 0 && l.total >= l.maxTotal {
		return nil, tooMany(l.cause, "this node already has %d %s, its limit; retry later", l.maxTotal, l.what)
	}
	l.perSandbox[uid]++
	l.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.total--
			if l.perSandbox[uid]--; l.perSandbox[uid] <= 0 {
				delete(l.perSandbox, uid)
			}
		})
	}, nil
}

// byteBudget bounds the bytes of exec request bodies held across the node.
type byteBudget struct {
	mu   sync.Mutex
	used int64
	max  int64
}

// errBudgetExhausted fails a body read that would go past the budget.
var errBudgetExhausted = errors.New("the node's exec body budget is exhausted")

// reserve takes n bytes of the budget, or fails with errBudgetExhausted
// without taking any.
func (b *byteBudget) reserve(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return errBudgetExhausted
	}
	b.used += n
	return nil
}

func (b *byteBudget) giveBack(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
}

// budgetReader reads a body while holding budget for every byte read so
// far, reserving in steps of budgetStep beyond what was reserved up front.
type budgetReader struct {
	r        io.Reader
	b        *byteBudget
	reserved int64 // held, to be given back by release
	read     int64
}

const budgetStep = 256 << 10

func (br *budgetReader) Read(p []byte) (int, error) {
	room := br.reserved - br.read
	if room <= 0 && len(p) > 0 {
		if err := br.b.reserve(budgetStep); err != nil {
			return 0, err
		}
		br.reserved += budgetStep
		room = budgetStep
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := br.r.Read(p)
	br.read += int64(n)
	return n, err
}

func (br *budgetReader) release() {
	br.b.giveBack(br.reserved)
	br.reserved = 0
}

// workingDir is the Sandbox's working directory, against which relative
// paths resolve. The default is for a Sandbox read before defaulting (it
// never is from the API server).
func workingDir(sbx *sandboxv1alpha1.Sandbox) string {
	if spec, _ := warmpool.Effective(sbx); spec.WorkingDir != "" {
		return spec.WorkingDir
	}
	return sandboxv1alpha1.DefaultWorkingDir
}
