// Package kubebackend runs the MCP server's sandboxes as Sandbox resources in
// one namespace of a Kubernetes cluster: it creates them through the API
// server, waits until a manager reports them Ready, and runs commands, moves
// files and reads logs through the managers' node API (sandboxclient). It
// acts with the MCP server's own credentials. When callers are Kubernetes
// identities (--auth kubernetes), every operation is first put to a
// SubjectAccessReview for the caller, so RBAC decides what each caller may
// do; ownership labels then keep one identity's sandboxes invisible to
// another. Nothing about the Sandboxes lives in the process (the session
// Manager runs Stateless): any replica finds, lists and counts an identity's
// Sandboxes through its informer cache (cache.go), holds the identity to
// --max-sandboxes exactly through a reservation record in the API
// (reservation.go), and leaves idle pausing, idle deletion and expiry to the
// node managers (spec.lifecycle). A replica's start or stop changes nothing
// for the agents.
package kubebackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// Labels and annotations on the Sandboxes this backend creates.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "code-sandbox-mcp"
	// LabelOwner is contract.IdentityHash of the identity that created
	// the Sandbox: the ownership record.
	LabelOwner = "sandbox.code-sandbox.dev/mcp-owner"
	// LabelInstance is the server instance (replica run) that created it:
	// for people and logs only. No instance removes its Sandboxes when it
	// exits (Options.KeepOnClose of the session Manager), so that any
	// replica serves them.
	LabelInstance = "sandbox.code-sandbox.dev/mcp-instance"
	// AnnotationIdentity spells out the owner identity for people reading
	// the object (labels cannot hold it).
	AnnotationIdentity = "sandbox.code-sandbox.dev/mcp-identity"
	// NamePrefix starts every Sandbox name this backend creates.
	NamePrefix = "mcp-"
)

// Defaults for Options.
const (
	DefaultMaxSandboxes = session.DefaultMaxSandboxes
	// DefaultMaxSnapshots is the Docker backend's default of
	// --max-snapshots, so that both backends keep the same.
	DefaultMaxSnapshots = 16
	DefaultIdleTimeout  = session.DefaultIdleTimeout
	DefaultReadyTimeout = 2 * time.Minute
	// DefaultStopTimeout bounds the wait for a deleted Sandbox to be gone:
	// the manager holds its finalizer until the container is removed,
	// after the manager's --stop-grace-period
	// (sandboxv1alpha1.DefaultStopGracePeriod, 10 s) by default.
	DefaultStopTimeout = 30 * time.Second
	// maxActiveDeadline is the CRD's ceiling on activeDeadlineSeconds.
	maxActiveDeadline = 30 * 24 * time.Hour
	apiTimeout        = 30 * time.Second
)

// Options configure a Backend.
type Options struct {
	// Config is the MCP server's own identity towards the API server and
	// the node APIs.
	Config *rest.Config
	// Namespace holds the Sandboxes.
	Namespace string
	// NamespaceFromServiceAccount puts the Sandboxes of a caller that
	// authenticated as a ServiceAccount in that ServiceAccount's own
	// namespace, and everyone else's in Namespace. One shared server then
	// serves many teams, each under its own namespace's RBAC and
	// SandboxQuotas.
	NamespaceFromServiceAccount bool
	// CallerNamespaces says callers may come with a namespace of their own
	// (contract.Caller.Namespace: --auth oidc's claim mapping); the
	// server then looks for its Sandboxes in every namespace.
	CallerNamespaces bool
	// NodeName, when set, pins the Sandboxes to one node (spec.nodeName).
	NodeName string
	// PullPolicy and Runtime go to spec.imagePullPolicy and spec.runtime
	// (empty: the CRD's defaults).
	PullPolicy sandboxv1alpha1.ImagePullPolicy
	Runtime    sandboxv1alpha1.RuntimeClass
	// MaxSandboxes bounds the Sandboxes one identity may have at once,
	// across every replica (reservation.go).
	MaxSandboxes int
	// MaxSnapshots bounds the SandboxSnapshots one identity may keep at
	// once, across every replica, through the same reservation record
	// (reservation.go); default DefaultMaxSnapshots.
	MaxSnapshots int
	// IdleTimeout deletes a Sandbox nobody used this long: written to its
	// spec.lifecycle.idleDeleteSeconds, and the node manager acts on it.
	IdleTimeout time.Duration
	// IdlePause, when set, pauses a Sandbox nobody used for this long
	// (spec.lifecycle.idlePauseSeconds, enforced by the node manager, which
	// also thaws it on the next exec or file transfer). It must be shorter
	// than IdleTimeout.
	IdlePause time.Duration
	// ReadyTimeout bounds sandbox_initialize's wait for Ready.
	ReadyTimeout time.Duration
	// StopTimeout bounds sandbox_stop's wait for the Sandbox to be gone.
	StopTimeout time.Duration
	// WarmPool, when set, names a SandboxWarmPool in the Sandboxes'
	// namespace: a sandbox_initialize with the default settings (no image or
	// DefaultImage, default CPU and memory, no network) creates a Sandbox
	// that claims from it (spec.warmPoolRef) and runs the pool template's
	// image and resources.
	WarmPool string
	// DefaultImage is the image of a default sandbox_initialize.
	DefaultImage string
	Logger       *slog.Logger
}

// Backend implements contract.Backend on Sandbox resources: a
// session.Manager on the Kubernetes driver.
type Backend struct {
	*session.Manager
	driver *driver
}

// driver is the session.Driver that runs sandboxes as Sandbox objects. Its
// Refs are namespaces (the sandbox ID is the object's name). Ownership is
// decided by the labels, so a caller also finds its Sandboxes made by
// other server instances (a SharedDriver).
type driver struct {
	kube client.WithWatch
	// cache holds the MCP Sandboxes (cache.go); nil: read from kube.
	cache *sandboxCache
	// limitError words a refusal past MaxSandboxes.
	limitError func(have, limit int) error
	nodes      *sandboxclient.Client
	authz      *authorizer
	ns         string
	instance   string
	opts       Options
	log        *slog.Logger
}

var (
	_ contract.Backend     = (*Backend)(nil)
	_ session.SharedDriver = (*driver)(nil)
	_ session.Authorizer   = (*driver)(nil)
	_ session.Starter      = (*driver)(nil)
)

// serviceAccountPrefix starts the username of every ServiceAccount token.
const serviceAccountPrefix = "system:serviceaccount:"

// namespaceFor is where caller's Sandboxes live.
func (b *driver) namespaceFor(caller contract.Caller) string {
	if b.opts.CallerNamespaces && caller.Namespace != "" {
		return caller.Namespace
	}
	if b.opts.NamespaceFromServiceAccount && caller.IsKubernetesUser() {
		if rest, ok := strings.CutPrefix(caller.Username, serviceAccountPrefix); ok {
			if ns, _, ok := strings.Cut(rest, ":"); ok && len(validation.IsDNS1123Label(ns)) == 0 {
				return ns
			}
		}
	}
	return b.ns
}

// sweepNamespace is where the server looks for its own Sandboxes in bulk:
// every namespace when callers bring their own.
func (b *driver) sweepNamespace() string {
	if b.opts.NamespaceFromServiceAccount || b.opts.CallerNamespaces {
		return ""
	}
	return b.ns
}

// New returns a backend for opts.Namespace; Start starts its reaper.
func New(opts Options) (*Backend, error) {
	if opts.Config == nil {
		return nil, errors.New("kubebackend: no Kubernetes client configuration")
	}
	if errs := validation.IsDNS1123Label(opts.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubebackend: namespace %q: %s", opts.Namespace, strings.Join(errs, "; "))
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kubebackend: registering the Sandbox type: %w", err)
	}
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kubebackend: registering the Lease type: %w", err)
	}
	ns := opts.Namespace
	if opts.NamespaceFromServiceAccount {
		ns = ""
	}
	sc, err := newSandboxCache(opts.Config, scheme, ns)
	if err != nil {
		return nil, err
	}
	kube, err := client.NewWithWatch(opts.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubebackend: API server client: %w", err)
	}
	nodes, err := sandboxclient.New(opts.Config, sandboxclient.Options{UserAgent: ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("kubebackend: node API client: %w", err)
	}
	authz, err := authzclient.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("kubebackend: SubjectAccessReview client: %w", err)
	}
	return newBackend(&driver{
		kube:     kube,
		cache:    &sandboxCache{c: sc},
		nodes:    nodes,
		authz:    newAuthorizer(authz.SubjectAccessReviews()),
		ns:       opts.Namespace,
		instance: "mcp-" + randid.Hex(8),
		opts:     opts,
		log:      opts.Logger,
	}), nil
}

// newBackend puts the session.Manager on d.
func newBackend(d *driver) *Backend {
	if d.opts.MaxSandboxes <= 0 {
		d.opts.MaxSandboxes = DefaultMaxSandboxes
	}
	if d.opts.MaxSnapshots <= 0 {
		d.opts.MaxSnapshots = DefaultMaxSnapshots
	}
	d.limitError = func(have, limit int) error {
		return &messageError{kind: contract.ErrQuota, msg: fmt.Sprintf("you already have %d sandboxes; the limit is %d", have, limit)}
	}
	return &Backend{driver: d, Manager: session.New(d, session.Options{
		MaxSandboxes: d.opts.MaxSandboxes,
		IdleTimeout:  d.opts.IdleTimeout,
		IdlePause:    d.opts.IdlePause,
		// Nothing about the Sandboxes lives in this process: any replica
		// serves any of them (ownership is on the objects, listing and
		// counting come from the cache, the limit from the reservation
		// records), and a replica that stops leaves them to the others.
		Stateless:  true,
		Logger:     d.opts.Logger,
		LimitError: d.limitError,
	})}
}

// Start implements session.Starter: it starts the Sandbox cache (until ctx
// ends); until it has synced, reads go to the API server.
func (b *driver) Start(ctx context.Context) {
	b.cache.start(ctx, b.log)
}

// InstanceID is the value of LabelInstance on this run's Sandboxes.
func (b *Backend) InstanceID() string { return b.driver.instance }

func notFound(id string) error {
	return fmt.Errorf("%w: %q", contract.ErrNotFound, id)
}

// owns reports whether sbx is a live Sandbox of this backend that caller
// created. The owner label alone decides: only the MCP server may set it,
// and nobody may change or remove it (config/policy/mcp_owner_policy.yaml),
// whereas anyone who may edit the Sandbox can change the managed-by label.
func owns(caller contract.Caller, sbx *sandboxv1alpha1.Sandbox) bool {
	return sbx.DeletionTimestamp == nil &&
		sbx.Labels[LabelOwner] == contract.IdentityHash(caller.ID)
}

// permissions are what each operation needs.
var permissions = map[session.Op]permission{
	session.OpCreate:   permCreate,
	session.OpGet:      permGet,
	session.OpList:     permList,
	session.OpStop:     permDelete,
	session.OpExec:     permExec,
	session.OpUpload:   permUpload,
	session.OpDownload: permDownload,
	session.OpLogs:     permLogs,
	// The portforward op covers DialPort, Expose and Unexpose; a preview
	// URL's requests are not a caller's (no review: the URL is the bearer).
	session.OpPortForward: permPortForward,
	session.OpMetrics:     permMetrics,
}

// Authorize implements session.Authorizer: a SubjectAccessReview for the
// caller, in the namespace of its Sandboxes.
func (b *driver) Authorize(ctx context.Context, caller contract.Caller, op session.Op, id string) error {
	return b.authz.check(ctx, caller, b.namespaceFor(caller), permissions[op], id)
}

// lookup returns the caller's Sandbox h.ID. Anything that is not the
// caller's is reported exactly like a Sandbox that never existed; when it
// was one the Manager holds, it is gone.
func (b *driver) lookup(ctx context.Context, h session.Handle) (*sandboxv1alpha1.Sandbox, error) {
	id := h.ID
	if !strings.HasPrefix(id, NamePrefix) || len(validation.IsDNS1123Label(id)) > 0 {
		return nil, notFound(id)
	}
	gone := func(err error) error {
		if h.Ref != "" {
			return session.Gone(err)
		}
		return err
	}
	var sbx sandboxv1alpha1.Sandbox
	if err := b.getSandbox(ctx, client.ObjectKey{Namespace: b.namespaceFor(h.Caller), Name: id}, &sbx); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, gone(notFound(id))
		}
		return nil, apiError("reading sandbox "+id, err)
	}
	if !owns(h.Caller, &sbx) {
		return nil, gone(notFound(id))
	}
	return &sbx, nil
}

// ownerSelector selects the Sandboxes of one identity (see owns).
func ownerSelector(caller contract.Caller) client.MatchingLabels {
	return client.MatchingLabels{LabelOwner: contract.IdentityHash(caller.ID)}
}

// sandboxSpec is the Sandbox a CreateRequest asks for.
func (b *driver) sandboxSpec(caller contract.Caller, name string, req contract.CreateRequest) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: b.namespaceFor(caller),
			Labels: map[string]string{
				LabelManagedBy: ManagedBy,
				LabelOwner:     contract.IdentityHash(caller.ID),
				LabelInstance:  b.instance,
			},
			Annotations: map[string]string{AnnotationIdentity: caller.ID},
		},
		Spec: sandboxv1alpha1.SandboxSpec{
			Image:           req.Image,
			ImagePullPolicy: b.opts.PullPolicy,
			Runtime:         b.opts.Runtime,
			NodeName:        b.opts.NodeName,
			Network:         sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkNone},
		},
	}
	if req.Lifetime > 0 {
		secs := seconds(req.Lifetime)
		sbx.Spec.ActiveDeadlineSeconds = &secs
	}
	sbx.Spec.Lifecycle = b.lifecycle()
	if b.claimsFromPool(req) {
		// The pool's template decides the image and the shape; the
		// lifecycle is the claimant's own.
		sbx.Spec = sandboxv1alpha1.SandboxSpec{
			WarmPoolRef:           &sandboxv1alpha1.WarmPoolReference{Name: b.opts.WarmPool},
			NodeName:              b.opts.NodeName,
			ActiveDeadlineSeconds: sbx.Spec.ActiveDeadlineSeconds,
			Lifecycle:             sbx.Spec.Lifecycle,
		}
		return sbx
	}
	if req.Network == contract.NetworkEgress {
		sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
		if len(req.EgressAllow) > 0 {
			// Enforced by the node's egress proxy; the namespace's
			// SandboxQuota may narrow the names (the webhook names any
			// refused host, which reaches the caller as ErrInvalid).
			pol := &sandboxv1alpha1.EgressPolicy{}
			for _, h := range req.EgressAllow {
				pol.Allow = append(pol.Allow, sandboxv1alpha1.EgressRule{Host: h})
			}
			sbx.Spec.Network.Egress = pol
		}
	}
	if req.NanoCPUs > 0 {
		sbx.Spec.Resources.CPU = resource.NewMilliQuantity(max(1, req.NanoCPUs/1e6), resource.DecimalSI)
	}
	if req.MemoryBytes > 0 {
		sbx.Spec.Resources.Memory = resource.NewQuantity(req.MemoryBytes, resource.BinarySI)
	}
	return sbx
}

// seconds is d in whole seconds, rounded up, at most the CRD's ceiling.
func seconds(d time.Duration) int64 {
	return int64((min(d, maxActiveDeadline) + time.Second - 1) / time.Second)
}

// lifecycle is spec.lifecycle of every Sandbox this backend creates: the node
// manager that runs it pauses it after --idle-pause and deletes it after
// --idle-timeout without an exec, file transfer or log read (through any
// replica: the node API sees them all), and deletes it once its
// activeDeadlineSeconds (--max-lifetime) passes. No MCP process keeps an
// idle clock, so a replica's stop or restart changes nothing for them.
func (b *driver) lifecycle() *sandboxv1alpha1.SandboxLifecycle {
	lc := &sandboxv1alpha1.SandboxLifecycle{ShutdownPolicy: sandboxv1alpha1.ShutdownDelete}
	idle := b.opts.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	del := seconds(idle)
	lc.IdleDeleteSeconds = &del
	if b.opts.IdlePause > 0 {
		if pause := seconds(b.opts.IdlePause); pause < del {
			lc.IdlePauseSeconds = &pause
		}
	}
	return lc
}

// claimsFromPool reports whether req is a default create, which the warm
// pool serves.
func (b *driver) claimsFromPool(req contract.CreateRequest) bool {
	return b.opts.WarmPool != "" &&
		(req.Image == "" || req.Image == b.opts.DefaultImage) &&
		req.NanoCPUs == 0 && req.MemoryBytes == 0 &&
		(req.Network == "" || req.Network == contract.NetworkNone)
}

// CountOthers implements session.SharedDriver: the caller's live Sandboxes
// that other server instances created.
func (b *driver) CountOthers(ctx context.Context, caller contract.Caller) (int, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	live, err := b.ownedSandboxes(actx, b.namespaceFor(caller), caller)
	if err != nil {
		return 0, apiError("counting your sandboxes", err)
	}
	n := 0
	for i := range live {
		if live[i].Labels[LabelInstance] != b.instance {
			n++
		}
	}
	return n, nil
}

// Create implements session.Driver: it creates the Sandbox, waits until it
// is Ready, and deletes it again if it cannot start.
func (b *driver) Create(ctx context.Context, caller contract.Caller, req contract.CreateRequest) (string, contract.Sandbox, error) {
	sbx, err := b.createObject(ctx, caller, req)
	if err != nil {
		return "", contract.Sandbox{}, err
	}
	name := sbx.Name
	b.log.Info("sandbox created; waiting for it to become ready", "sandbox", name, "image", req.Image, "owner", contract.IdentityHash(caller.ID))
	ready, err := b.waitReady(ctx, sbx)
	if err != nil {
		b.deleteQuietly(sbx.Namespace, name, "did not start")
		b.unreserve(sbx.Namespace, caller, name)
		return "", contract.Sandbox{}, err
	}
	b.log.Info("sandbox ready", "sandbox", name, "node", ready.Status.NodeName)
	return sbx.Namespace, view(ready), nil
}

// createObject reserves a fresh random name within the caller's
// --max-sandboxes (reservation.go) and creates the Sandbox under it.
func (b *driver) createObject(ctx context.Context, caller contract.Caller, req contract.CreateRequest, mutate ...func(*sandboxv1alpha1.Sandbox)) (*sandboxv1alpha1.Sandbox, error) {
	// Finished even if the caller leaves: a create cut off half-way could
	// leave a Sandbox nobody knows about.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	ns := b.namespaceFor(caller)
	for attempt := 0; ; attempt++ {
		name, err := b.reserve(actx, ns, caller)
		if err != nil {
			return nil, err
		}
		sbx := b.sandboxSpec(caller, name, req)
		for _, m := range mutate {
			m(sbx)
		}
		err = b.kube.Create(actx, sbx)
		if err != nil {
			b.unreserve(ns, caller, name)
		}
		if apierrors.IsAlreadyExists(err) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, apiError("creating the sandbox", err)
		}
		return sbx, nil
	}
}

// waitReady follows the Sandbox until it is Ready, fails, or the ready
// timeout passes. It watches, and reads the object again whenever a watch
// ends, so a dropped watch costs nothing but a Get.
func (b *driver) waitReady(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (*sandboxv1alpha1.Sandbox, error) {
	wctx, cancel := context.WithTimeout(ctx, b.opts.ReadyTimeout)
	defer cancel()
	name := sbx.Name
	var last error
	for {
		state, why := startStatus(sbx)
		switch state {
		case started:
			return sbx, nil
		case failed:
			return nil, why
		}
		last = why
		next, err := b.watchUntilChange(wctx, sbx)
		if wctx.Err() != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &messageError{kind: contract.ErrUnavailable, msg: fmt.Sprintf(
				"sandbox %s did not become ready within %s; last status: %v (the Sandbox was deleted)", name, b.opts.ReadyTimeout, last)}
		}
		if errors.Is(err, errDeleted) {
			return nil, &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("sandbox %s was deleted while it was starting", name)}
		}
		if err != nil {
			b.log.Debug("watching a starting sandbox", "sandbox", name, "error", err)
			select {
			case <-wctx.Done():
				continue
			case <-time.After(time.Second):
			}
		}
		if next != nil {
			sbx = next
			continue
		}
		var fresh sandboxv1alpha1.Sandbox
		if err := b.kube.Get(wctx, client.ObjectKeyFromObject(sbx), &fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("sandbox %s was deleted while it was starting", name)}
			}
			if wctx.Err() == nil {
				b.log.Debug("reading a starting sandbox", "sandbox", name, "error", err)
			}
			continue
		}
		sbx = &fresh
	}
}

var errDeleted = errors.New("deleted")

// watchUntilChange watches the Sandbox from its resource version and
// returns its next state whose readiness differs, or nil when the watch
// ended without one.
func (b *driver) watchUntilChange(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (*sandboxv1alpha1.Sandbox, error) {
	w, err := b.kube.Watch(ctx, &sandboxv1alpha1.SandboxList{}, &client.ListOptions{
		Namespace:     sbx.Namespace,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", sbx.Name),
		Raw:           &metav1.ListOptions{ResourceVersion: sbx.ResourceVersion},
	})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, errDeleted
			case watch.Error:
				// Typically "resource version too old": read it again.
				return nil, nil
			case watch.Added, watch.Modified:
				next, ok := ev.Object.(*sandboxv1alpha1.Sandbox)
				if !ok || next.UID != sbx.UID {
					continue
				}
				if state, _ := startStatus(next); state != starting {
					return next, nil
				}
				// Keep the latest reason for the timeout message.
				sbx.Status = next.Status
			}
		}
	}
}

// deleteQuietly deletes a Sandbox without waiting, logging a failure.
func (b *driver) deleteQuietly(namespace, name, why string) {
	if err := b.delete(context.Background(), namespace, name); err != nil {
		b.log.Warn("deleting sandbox", "namespace", namespace, "sandbox", name, "reason", why, "error", err)
	}
}

// delete deletes a Sandbox without waiting; one already gone is no error.
func (b *driver) delete(ctx context.Context, namespace, name string) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := b.kube.Delete(ctx, &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// view is what the caller may know about its Sandbox. A Sandbox claimed
// from a warm pool is shown with the template it was made from.
func view(sbx *sandboxv1alpha1.Sandbox) contract.Sandbox {
	if spec, ok := warmpool.Effective(sbx); ok {
		sbx = sbx.DeepCopy()
		sbx.Spec = spec
	}
	s := contract.Sandbox{
		ID:          sbx.Name,
		Image:       sbx.Spec.Image,
		Status:      statusText(sbx),
		Network:     contract.NetworkNone,
		WorkingDir:  sbx.Spec.WorkingDir,
		NanoCPUs:    sandboxv1alpha1.DefaultNanoCPUs,
		MemoryBytes: sandboxv1alpha1.DefaultMemoryBytes,
		CreatedAt:   sbx.CreationTimestamp.Time,
		LastUsedAt:  sbx.CreationTimestamp.Time,
	}
	if t := sbx.Status.LastActivityTime; t != nil {
		// The node manager's record, whichever replica the calls came
		// through.
		s.LastUsedAt = t.Time
	}
	if sbx.Spec.Network.Mode == sandboxv1alpha1.NetworkEgress {
		s.Network = contract.NetworkEgress
	}
	if s.WorkingDir == "" {
		s.WorkingDir = sandboxv1alpha1.DefaultWorkingDir
	}
	if q := sbx.Spec.Resources.CPU; q != nil {
		s.NanoCPUs = q.MilliValue() * 1e6
	}
	if q := sbx.Spec.Resources.Memory; q != nil {
		s.MemoryBytes = q.Value()
	}
	if d := sbx.Spec.ActiveDeadlineSeconds; d != nil {
		start := sbx.CreationTimestamp.Time
		if sbx.Status.StartTime != nil {
			start = sbx.Status.StartTime.Time
		}
		s.ExpiresAt = start.Add(time.Duration(*d) * time.Second)
	}
	return s
}

// statusText is "running" for a Ready Sandbox and its Ready reason and
// message otherwise.
func statusText(sbx *sandboxv1alpha1.Sandbox) string {
	if sbx.DeletionTimestamp != nil {
		return "terminating"
	}
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	switch {
	case c == nil:
		return "pending"
	case c.Status == metav1.ConditionTrue:
		return "running"
	case c.Message == "":
		return c.Reason
	}
	return c.Reason + ": " + c.Message
}

// Get implements session.Driver.
func (b *driver) Get(ctx context.Context, h session.Handle) (contract.Sandbox, error) {
	sbx, err := b.lookup(ctx, h)
	if err != nil {
		return contract.Sandbox{}, err
	}
	return view(sbx), nil
}

// List implements session.Driver: the caller's Sandboxes, whichever
// server instance made them.
func (b *driver) List(ctx context.Context, caller contract.Caller, _ []session.Handle) ([]contract.Sandbox, error) {
	live, err := b.ownedSandboxes(ctx, b.namespaceFor(caller), caller)
	if err != nil {
		return nil, apiError("listing your sandboxes", err)
	}
	out := make([]contract.Sandbox, 0, len(live))
	for i := range live {
		out = append(out, view(&live[i]))
	}
	return out, nil
}

// Exec implements session.Driver. The node API records the command in the
// Sandbox's exec history (under the MCP server's identity).
func (b *driver) Exec(ctx context.Context, h session.Handle, req execio.Request, out contract.OutputFunc) (execio.Result, error) {
	sbx, err := b.lookup(ctx, h)
	if err == nil {
		sbx, err = b.running(ctx, sbx)
	}
	if err != nil {
		return execio.Result{}, err
	}
	res, err := b.nodes.Exec(ctx, sandboxclient.For(sbx), req, out.Writer("stdout"), out.Writer("stderr"))
	return res, clientError(err)
}

// errStreamStopped ends a transfer pipe from the reading side, so that the
// error that made it stop, not the pipe's, is reported.
var errStreamStopped = errors.New("stream stopped")

// Upload implements session.Driver. The archive is sanitised and held to
// limits here, as it streams to the node API (which applies its own caps).
func (b *driver) Upload(ctx context.Context, h session.Handle, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	sbx, err := b.lookup(ctx, h)
	if err == nil {
		sbx, err = b.running(ctx, sbx)
	}
	if err != nil {
		return execio.TransferStats{}, err
	}
	if _, err := execio.ResolvePath(view(sbx).WorkingDir, destDir); err != nil {
		return execio.TransferStats{}, err
	}
	pr, pw := io.Pipe()
	sanitized := make(chan error, 1)
	go func() {
		_, err := execio.SanitizeTar(archive, pw, limits)
		pw.CloseWithError(err)
		sanitized <- err
	}()
	stats, err := b.nodes.Upload(ctx, sandboxclient.For(sbx), destDir, pr)
	pr.CloseWithError(errStreamStopped)
	if serr := <-sanitized; serr != nil && !errors.Is(serr, errStreamStopped) {
		return stats, serr
	}
	return stats, clientError(err)
}

// Download implements session.Driver.
func (b *driver) Download(ctx context.Context, h session.Handle, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	sbx, err := b.lookup(ctx, h)
	if err == nil {
		sbx, err = b.running(ctx, sbx)
	}
	if err != nil {
		return execio.TransferStats{}, err
	}
	if _, err := execio.ResolvePath(view(sbx).WorkingDir, src); err != nil {
		return execio.TransferStats{}, err
	}
	if maxBytes <= 0 {
		maxBytes = execio.DefaultDownloadLimit
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	downloaded := make(chan error, 1)
	go func() {
		err := b.nodes.Download(dctx, sandboxclient.For(sbx), src, pw)
		pw.CloseWithError(err)
		downloaded <- err
	}()
	stats, ferr := execio.ForwardTar(ctx, pr, w, maxBytes)
	if ferr != nil {
		cancel()
	}
	pr.CloseWithError(errStreamStopped)
	derr := <-downloaded
	switch {
	case ferr != nil && errors.Is(ferr, execio.ErrTooLarge):
		return stats, ferr
	case derr != nil && !errors.Is(derr, errStreamStopped) && !(ferr != nil && errors.Is(derr, context.Canceled)):
		return stats, clientError(derr)
	}
	return stats, ferr
}

// Logs implements session.Driver: the container's output and the exec
// history, both from the node API.
func (b *driver) Logs(ctx context.Context, h session.Handle, opts contract.LogsOptions) (contract.Logs, error) {
	sbx, err := b.lookup(ctx, h)
	if err != nil {
		return contract.Logs{}, err
	}
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	lctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	tb := execio.NewTailBuffer(int(maxBytes))
	if err := b.nodes.Logs(lctx, sandboxclient.For(sbx), sandboxclient.LogOptions{Tail: opts.TailLines}, tb); err != nil {
		return contract.Logs{}, clientError(err)
	}
	var recs []history.Record
	err = b.nodes.History(lctx, sandboxclient.For(sbx), sandboxclient.LogOptions{Tail: opts.HistoryRecords}, func(r history.Record) error {
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return contract.Logs{}, clientError(err)
	}
	return contract.Logs{Output: tb.String(), Truncated: tb.Truncated(), History: recs}, nil
}

// Remove implements session.Driver. sandbox_stop deletes the Sandbox and
// waits until the manager has removed its container and released it; the
// reaper only deletes it.
func (b *driver) Remove(ctx context.Context, h session.Handle, how session.Removal) error {
	if how == session.RemoveReap {
		err := b.delete(ctx, h.Ref, h.ID)
		if err == nil {
			b.unreserve(h.Ref, h.Caller, h.ID)
		}
		return err
	}
	sbx, err := b.lookup(ctx, h)
	if err != nil {
		return err
	}
	// Removal continues if the caller goes away: a half-stopped sandbox
	// helps nobody.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.StopTimeout)
	defer cancel()
	err = b.kube.Delete(sctx, sbx, client.Preconditions{UID: &sbx.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return apiError("deleting sandbox "+h.ID, err)
	}
	// Its place is free at once (a Sandbox being deleted no longer counts).
	b.unreserve(sbx.Namespace, h.Caller, h.ID)
	if err := b.waitGone(sctx, []client.ObjectKey{client.ObjectKeyFromObject(sbx)}); err != nil {
		// Deleted, not yet gone: the manager finishes it.
		b.log.Warn("sandbox deleted but still terminating", "sandbox", h.ID, "error", err)
	}
	return nil
}

// waitGone returns once none of the named Sandboxes exists. It watches
// rather than polls, so that sandbox_stop returns as soon as the manager has
// removed the container and its finalizer.
func (b *driver) waitGone(ctx context.Context, keys []client.ObjectKey) error {
	for i, key := range keys {
		for {
			var sbx sandboxv1alpha1.Sandbox
			err := b.kube.Get(ctx, key, &sbx)
			if apierrors.IsNotFound(err) {
				break
			}
			if err == nil {
				// Deleted, or changed (a finalizer went): look again.
				if _, err = b.watchUntilChange(ctx, &sbx); errors.Is(err, errDeleted) {
					break
				}
			}
			if ctx.Err() != nil {
				names := make([]string, 0, len(keys)-i)
				for _, k := range keys[i:] {
					names = append(names, k.Name)
				}
				return fmt.Errorf("%d sandbox(es) still terminating (%s): %w", len(names), strings.Join(names, ", "), ctx.Err())
			}
			if err != nil {
				// The API server refused a read or a watch: do not spin.
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}
	return nil
}

// Ready implements session.Driver: the API server answers and the
// server may list Sandboxes in its namespace.
func (b *driver) Ready(ctx context.Context) error {
	if b.cache != nil && !b.cache.synced.Load() {
		return errCacheNotSynced
	}
	var list sandboxv1alpha1.SandboxList
	return apiError("listing sandboxes", b.kube.List(ctx, &list, client.InNamespace(b.sweepNamespace()), client.Limit(1),
		client.MatchingLabels{LabelManagedBy: ManagedBy}))
}

// RemoveAll implements session.Driver: it deletes every Sandbox this
// instance created, including any a create still in flight made, and waits
// (bounded by ctx) until they are gone. The Manager of this backend never
// calls it (KeepOnClose: a replica's stop must not end the agents' work);
// it stays for the Driver contract and for tests.
func (b *driver) RemoveAll(ctx context.Context) error {
	var list sandboxv1alpha1.SandboxList
	if err := b.kube.List(ctx, &list, client.InNamespace(b.sweepNamespace()), client.MatchingLabels{LabelManagedBy: ManagedBy, LabelInstance: b.instance}); err != nil {
		return fmt.Errorf("listing this server's sandboxes for removal: %w", apiError("listing sandboxes", err))
	}
	var (
		keys []client.ObjectKey
		errs []error
	)
	for i := range list.Items {
		sbx := &list.Items[i]
		err := b.kube.Delete(ctx, sbx, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting sandbox %s: %w", sbx.Name, err))
			continue
		}
		keys = append(keys, client.ObjectKeyFromObject(sbx))
	}
	if len(keys) > 0 {
		if err := b.waitGone(ctx, keys); err != nil {
			errs = append(errs, err)
		}
		b.log.Info("deleted this server's sandboxes", "count", len(keys))
	}
	return errors.Join(errs...)
}

// Close implements session.Driver.
func (b *driver) Close(context.Context) error {
	if b.nodes != nil {
		b.nodes.Close()
	}
	return nil
}

// Sweep implements session.Driver: the expiry sweep.
func (b *driver) Sweep(ctx context.Context) { b.sweepExpired(ctx) }

// sweepExpired deletes MCP Sandboxes in the namespace that have expired,
// whichever server instance created them: their containers are gone, and
// without this the objects of a crashed server would stay forever.
func (b *driver) sweepExpired(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	var list sandboxv1alpha1.SandboxList
	if err := b.reader().List(ctx, &list, client.InNamespace(b.sweepNamespace()), client.HasLabels{LabelOwner}); err != nil {
		b.log.Warn("listing sandboxes for the expiry sweep", "error", err)
		return
	}
	for i := range list.Items {
		sbx := &list.Items[i]
		if sbx.DeletionTimestamp == nil && meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)) {
			b.log.Info("deleting expired sandbox", "namespace", sbx.Namespace, "sandbox", sbx.Name, "instance", sbx.Labels[LabelInstance])
			b.deleteQuietly(sbx.Namespace, sbx.Name, "expired")
		}
	}
}
