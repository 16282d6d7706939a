// Package kubebackend runs the MCP server's sandboxes as Sandbox resources in
// one namespace of a Kubernetes cluster: it creates them through the API
// server, waits until a manager reports them Ready, and runs commands, moves
// files and reads logs through the managers' node API (sandboxclient). It
// acts with the MCP server's own credentials. When callers are Kubernetes
// identities (--auth kubernetes), every operation is first put to a
// SubjectAccessReview for the caller, so RBAC decides what each caller may
// do; ownership labels then keep one identity's sandboxes invisible to
// another.
package kubebackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

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
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// Labels and annotations on the Sandboxes this backend creates.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "code-sandbox-mcp"
	// LabelOwner is mcpserver.IdentityHash of the identity that created
	// the Sandbox: the ownership record.
	LabelOwner = "sandbox.code-sandbox.dev/mcp-owner"
	// LabelInstance is the server instance that created it, which removes
	// it when idle and when the server exits.
	LabelInstance = "sandbox.code-sandbox.dev/mcp-instance"
	// AnnotationIdentity spells out the owner identity for people reading
	// the object (labels cannot hold it).
	AnnotationIdentity = "sandbox.code-sandbox.dev/mcp-identity"
	// NamePrefix starts every Sandbox name this backend creates.
	NamePrefix = "mcp-"
)

// Defaults for Options.
const (
	DefaultMaxSandboxes = 5
	DefaultIdleTimeout  = 30 * time.Minute
	DefaultReadyTimeout = 2 * time.Minute
	// DefaultStopTimeout bounds the wait for a deleted Sandbox to be gone:
	// the manager holds its finalizer until the container is removed,
	// after a 10 s grace period by default.
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
	// NodeName, when set, pins the Sandboxes to one node (spec.nodeName).
	NodeName string
	// PullPolicy and Runtime go to spec.imagePullPolicy and spec.runtime
	// (empty: the CRD's defaults).
	PullPolicy sandboxv1alpha1.ImagePullPolicy
	Runtime    sandboxv1alpha1.RuntimeClass
	// MaxSandboxes bounds the Sandboxes one identity may have at once.
	MaxSandboxes int
	// IdleTimeout deletes a Sandbox of this instance nobody used this long.
	IdleTimeout time.Duration
	// ReadyTimeout bounds sandbox_initialize's wait for Ready.
	ReadyTimeout time.Duration
	// StopTimeout bounds sandbox_stop's wait for the Sandbox to be gone.
	StopTimeout time.Duration
	Logger      *slog.Logger
}

// Backend implements mcpserver.Backend on Sandbox resources.
type Backend struct {
	kube     client.WithWatch
	nodes    *sandboxclient.Client
	authz    *authorizer
	ns       string
	instance string
	opts     Options
	log      *slog.Logger

	// quotaMu makes counting an identity's Sandboxes and creating one
	// atomic within this server, so concurrent creates cannot overshoot.
	quotaMu sync.Mutex

	mu        sync.Mutex
	sandboxes map[string]*entry

	stopOnce sync.Once
	stop     chan struct{}
}

// entry is a Sandbox this server instance created, for idle reaping and
// removal at exit. Ownership is decided by the labels, not by this record.
type entry struct {
	namespace, name string
	mcpserver.Activity
}

// entryKey keys b.sandboxes: names are unique only within a namespace.
func entryKey(namespace, name string) string { return namespace + "/" + name }

// serviceAccountPrefix starts the username of every ServiceAccount token.
const serviceAccountPrefix = "system:serviceaccount:"

// namespaceFor is where caller's Sandboxes live.
func (b *Backend) namespaceFor(caller mcpserver.Caller) string {
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
func (b *Backend) sweepNamespace() string {
	if b.opts.NamespaceFromServiceAccount {
		return ""
	}
	return b.ns
}

var _ mcpserver.Backend = (*Backend)(nil)

// New returns a backend for opts.Namespace; Start starts its reaper.
func New(opts Options) (*Backend, error) {
	if opts.Config == nil {
		return nil, errors.New("kubebackend: no Kubernetes client configuration")
	}
	if errs := validation.IsDNS1123Label(opts.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubebackend: namespace %q: %s", opts.Namespace, strings.Join(errs, "; "))
	}
	if opts.MaxSandboxes <= 0 {
		opts.MaxSandboxes = DefaultMaxSandboxes
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
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
	return &Backend{
		kube:      kube,
		nodes:     nodes,
		authz:     newAuthorizer(authz.SubjectAccessReviews()),
		ns:        opts.Namespace,
		instance:  "mcp-" + randomHex(8),
		opts:      opts,
		log:       opts.Logger,
		sandboxes: map[string]*entry{},
		stop:      make(chan struct{}),
	}, nil
}

// Start starts the idle reaper.
func (b *Backend) Start(context.Context) { go b.loop() }

// InstanceID is the value of LabelInstance on this run's Sandboxes.
func (b *Backend) InstanceID() string { return b.instance }

func randomHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

func notFound(id string) error {
	return fmt.Errorf("%w: %q", mcpserver.ErrNotFound, id)
}

// owns reports whether sbx is a live Sandbox of this backend that caller
// created.
func owns(caller mcpserver.Caller, sbx *sandboxv1alpha1.Sandbox) bool {
	return sbx.DeletionTimestamp == nil &&
		sbx.Labels[LabelManagedBy] == ManagedBy &&
		sbx.Labels[LabelOwner] == mcpserver.IdentityHash(caller.ID)
}

// lookup checks that caller may do p, then returns its Sandbox id. Anything
// that is not the caller's is reported exactly like a Sandbox that never
// existed.
func (b *Backend) lookup(ctx context.Context, caller mcpserver.Caller, p permission, id string) (*sandboxv1alpha1.Sandbox, error) {
	ns := b.namespaceFor(caller)
	if err := b.authz.check(ctx, caller, ns, p, id); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(id, NamePrefix) || len(validation.IsDNS1123Label(id)) > 0 {
		return nil, notFound(id)
	}
	var sbx sandboxv1alpha1.Sandbox
	if err := b.kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, &sbx); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notFound(id)
		}
		return nil, apiError("reading sandbox "+id, err)
	}
	if !owns(caller, &sbx) {
		return nil, notFound(id)
	}
	b.mu.Lock()
	if e, ok := b.sandboxes[entryKey(ns, id)]; ok {
		e.LastUsedAt = time.Now()
	}
	b.mu.Unlock()
	return &sbx, nil
}

// busy marks a Sandbox in use for an operation, so the idle reaper never
// deletes it mid-command.
func (b *Backend) busy(sbx *sandboxv1alpha1.Sandbox) func() {
	b.mu.Lock()
	e := b.sandboxes[entryKey(sbx.Namespace, sbx.Name)]
	if e != nil {
		e.InFlight++
	}
	b.mu.Unlock()
	return func() {
		if e == nil {
			return
		}
		b.mu.Lock()
		e.InFlight--
		e.LastUsedAt = time.Now()
		b.mu.Unlock()
	}
}

func (b *Backend) forget(namespace, name string) {
	b.mu.Lock()
	delete(b.sandboxes, entryKey(namespace, name))
	b.mu.Unlock()
}

// ownerSelector selects the Sandboxes of one identity.
func ownerSelector(caller mcpserver.Caller) client.MatchingLabels {
	return client.MatchingLabels{LabelManagedBy: ManagedBy, LabelOwner: mcpserver.IdentityHash(caller.ID)}
}

// sandboxSpec is the Sandbox a CreateRequest asks for.
func (b *Backend) sandboxSpec(caller mcpserver.Caller, name string, req mcpserver.CreateRequest) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: b.namespaceFor(caller),
			Labels: map[string]string{
				LabelManagedBy: ManagedBy,
				LabelOwner:     mcpserver.IdentityHash(caller.ID),
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
	if req.Network == mcpserver.NetworkEgress {
		sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
	}
	if req.NanoCPUs > 0 {
		sbx.Spec.Resources.CPU = resource.NewMilliQuantity(max(1, req.NanoCPUs/1e6), resource.DecimalSI)
	}
	if req.MemoryBytes > 0 {
		sbx.Spec.Resources.Memory = resource.NewQuantity(req.MemoryBytes, resource.BinarySI)
	}
	if req.Lifetime > 0 {
		secs := int64((min(req.Lifetime, maxActiveDeadline) + time.Second - 1) / time.Second)
		sbx.Spec.ActiveDeadlineSeconds = &secs
	}
	return sbx
}

// Create implements mcpserver.Backend: it creates the Sandbox, waits until
// it is Ready, and deletes it again if it cannot start.
func (b *Backend) Create(ctx context.Context, caller mcpserver.Caller, req mcpserver.CreateRequest) (mcpserver.Sandbox, error) {
	if err := b.authz.check(ctx, caller, b.namespaceFor(caller), permCreate, ""); err != nil {
		return mcpserver.Sandbox{}, err
	}
	sbx, err := b.createObject(ctx, caller, req)
	if err != nil {
		return mcpserver.Sandbox{}, err
	}
	name := sbx.Name
	now := time.Now()
	e := &entry{namespace: sbx.Namespace, name: name, Activity: mcpserver.Activity{LastUsedAt: now, ExpiresAt: now.Add(req.Lifetime)}}
	if req.Lifetime <= 0 {
		e.ExpiresAt = now.Add(maxActiveDeadline)
	}
	b.mu.Lock()
	b.sandboxes[entryKey(sbx.Namespace, name)] = e
	b.mu.Unlock()
	b.log.Info("sandbox created; waiting for it to become ready", "sandbox", name, "image", req.Image, "owner", mcpserver.IdentityHash(caller.ID))

	ready, err := b.waitReady(ctx, sbx)
	if err != nil {
		b.deleteQuietly(sbx.Namespace, name, "did not start")
		b.forget(sbx.Namespace, name)
		return mcpserver.Sandbox{}, err
	}
	b.log.Info("sandbox ready", "sandbox", name, "node", ready.Status.NodeName)
	return b.view(ready), nil
}

// createObject counts the caller's Sandboxes against the quota and creates
// a new one with a fresh random name.
func (b *Backend) createObject(ctx context.Context, caller mcpserver.Caller, req mcpserver.CreateRequest) (*sandboxv1alpha1.Sandbox, error) {
	b.quotaMu.Lock()
	defer b.quotaMu.Unlock()
	// Finished even if the caller leaves: a create cut off half-way could
	// leave a Sandbox nobody knows about.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	var list sandboxv1alpha1.SandboxList
	if err := b.kube.List(actx, &list, client.InNamespace(b.namespaceFor(caller)), ownerSelector(caller)); err != nil {
		return nil, apiError("counting your sandboxes", err)
	}
	n := 0
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			n++
		}
	}
	if n >= b.opts.MaxSandboxes {
		return nil, &messageError{kind: mcpserver.ErrQuota, msg: fmt.Sprintf("you already have %d sandboxes; the limit is %d", n, b.opts.MaxSandboxes)}
	}
	for attempt := 0; ; attempt++ {
		sbx := b.sandboxSpec(caller, NamePrefix+randomHex(6), req)
		err := b.kube.Create(actx, sbx)
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
func (b *Backend) waitReady(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (*sandboxv1alpha1.Sandbox, error) {
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
			return nil, &messageError{kind: mcpserver.ErrUnavailable, msg: fmt.Sprintf(
				"sandbox %s did not become ready within %s; last status: %v (the Sandbox was deleted)", name, b.opts.ReadyTimeout, last)}
		}
		if errors.Is(err, errDeleted) {
			return nil, &messageError{kind: mcpserver.ErrInvalid, msg: fmt.Sprintf("sandbox %s was deleted while it was starting", name)}
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
				return nil, &messageError{kind: mcpserver.ErrInvalid, msg: fmt.Sprintf("sandbox %s was deleted while it was starting", name)}
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
func (b *Backend) watchUntilChange(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (*sandboxv1alpha1.Sandbox, error) {
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
func (b *Backend) deleteQuietly(namespace, name, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := b.kube.Delete(ctx, &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		b.log.Warn("deleting sandbox", "namespace", namespace, "sandbox", name, "reason", why, "error", err)
	}
}

// view is what the caller may know about its Sandbox.
func (b *Backend) view(sbx *sandboxv1alpha1.Sandbox) mcpserver.Sandbox {
	s := mcpserver.Sandbox{
		ID:          sbx.Name,
		Image:       sbx.Spec.Image,
		Status:      statusText(sbx),
		Network:     mcpserver.NetworkNone,
		WorkingDir:  sbx.Spec.WorkingDir,
		NanoCPUs:    1e9,
		MemoryBytes: 512 << 20,
		CreatedAt:   sbx.CreationTimestamp.Time,
		LastUsedAt:  sbx.CreationTimestamp.Time,
	}
	if sbx.Spec.Network.Mode == sandboxv1alpha1.NetworkEgress {
		s.Network = mcpserver.NetworkEgress
	}
	if s.WorkingDir == "" {
		s.WorkingDir = "/app"
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
	b.mu.Lock()
	if e, ok := b.sandboxes[entryKey(sbx.Namespace, sbx.Name)]; ok {
		s.LastUsedAt = e.LastUsedAt
	}
	b.mu.Unlock()
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

// Get implements mcpserver.Backend.
func (b *Backend) Get(ctx context.Context, caller mcpserver.Caller, id string) (mcpserver.Sandbox, error) {
	sbx, err := b.lookup(ctx, caller, permGet, id)
	if err != nil {
		return mcpserver.Sandbox{}, err
	}
	return b.view(sbx), nil
}

// List implements mcpserver.Backend.
func (b *Backend) List(ctx context.Context, caller mcpserver.Caller) ([]mcpserver.Sandbox, error) {
	ns := b.namespaceFor(caller)
	if err := b.authz.check(ctx, caller, ns, permList, ""); err != nil {
		return nil, err
	}
	var list sandboxv1alpha1.SandboxList
	if err := b.kube.List(ctx, &list, client.InNamespace(ns), ownerSelector(caller)); err != nil {
		return nil, apiError("listing your sandboxes", err)
	}
	out := make([]mcpserver.Sandbox, 0, len(list.Items))
	for i := range list.Items {
		if owns(caller, &list.Items[i]) {
			out = append(out, b.view(&list.Items[i]))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Exec implements mcpserver.Backend. The node API records the command in
// the Sandbox's exec history (under the MCP server's identity).
func (b *Backend) Exec(ctx context.Context, caller mcpserver.Caller, id string, req execio.Request, out mcpserver.OutputFunc) (execio.Result, error) {
	req, err := req.Normalize()
	if err != nil {
		return execio.Result{}, err
	}
	sbx, err := b.lookup(ctx, caller, permExec, id)
	if err != nil {
		return execio.Result{}, err
	}
	defer b.busy(sbx)()
	res, err := b.nodes.Exec(ctx, sandboxclient.For(sbx), req, out.Writer("stdout"), out.Writer("stderr"))
	return res, clientError(err)
}

// errStreamStopped ends a transfer pipe from the reading side, so that the
// error that made it stop, not the pipe's, is reported.
var errStreamStopped = errors.New("stream stopped")

// Upload implements mcpserver.Backend. The archive is sanitised and held to
// limits here, as it streams to the node API (which applies its own caps).
func (b *Backend) Upload(ctx context.Context, caller mcpserver.Caller, id, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	sbx, err := b.lookup(ctx, caller, permUpload, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	if _, err := execio.ResolvePath(b.view(sbx).WorkingDir, destDir); err != nil {
		return execio.TransferStats{}, err
	}
	defer b.busy(sbx)()
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

// Download implements mcpserver.Backend.
func (b *Backend) Download(ctx context.Context, caller mcpserver.Caller, id, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	sbx, err := b.lookup(ctx, caller, permDownload, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	if _, err := execio.ResolvePath(b.view(sbx).WorkingDir, src); err != nil {
		return execio.TransferStats{}, err
	}
	if maxBytes <= 0 {
		maxBytes = execio.DefaultDownloadLimit
	}
	defer b.busy(sbx)()
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	downloaded := make(chan error, 1)
	go func() {
		err := b.nodes.Download(dctx, sandboxclient.For(sbx), src, pw)
		pw.CloseWithError(err)
		downloaded <- err
	}()
	stats, ferr := execio.ForwardTar(pr, w, maxBytes)
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

// Logs implements mcpserver.Backend: the container's output and the exec
// history, both from the node API.
func (b *Backend) Logs(ctx context.Context, caller mcpserver.Caller, id string, opts mcpserver.LogsOptions) (mcpserver.Logs, error) {
	sbx, err := b.lookup(ctx, caller, permLogs, id)
	if err != nil {
		return mcpserver.Logs{}, err
	}
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	lctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	tb := execio.NewTailBuffer(int(maxBytes))
	if err := b.nodes.Logs(lctx, sandboxclient.For(sbx), sandboxclient.LogOptions{Tail: opts.TailLines}, tb); err != nil {
		return mcpserver.Logs{}, clientError(err)
	}
	var recs []history.Record
	err = b.nodes.History(lctx, sandboxclient.For(sbx), sandboxclient.LogOptions{Tail: opts.HistoryRecords}, func(r history.Record) error {
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return mcpserver.Logs{}, clientError(err)
	}
	return mcpserver.Logs{Output: tb.String(), Truncated: tb.Truncated(), History: recs}, nil
}

// Stop implements mcpserver.Backend: it deletes the Sandbox and waits until
// the manager has removed its container and released it.
func (b *Backend) Stop(ctx context.Context, caller mcpserver.Caller, id string) error {
	sbx, err := b.lookup(ctx, caller, permDelete, id)
	if err != nil {
		return err
	}
	key := entryKey(sbx.Namespace, id)
	b.mu.Lock()
	if e, ok := b.sandboxes[key]; ok {
		e.Removing = true
	}
	b.mu.Unlock()
	// Removal continues if the caller goes away: a half-stopped sandbox
	// helps nobody.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.StopTimeout)
	defer cancel()
	err = b.kube.Delete(sctx, sbx, client.Preconditions{UID: &sbx.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		b.mu.Lock()
		if e, ok := b.sandboxes[key]; ok {
			e.Removing = false
		}
		b.mu.Unlock()
		return apiError("deleting sandbox "+id, err)
	}
	b.forget(sbx.Namespace, id)
	if err := b.waitGone(sctx, []client.ObjectKey{client.ObjectKeyFromObject(sbx)}); err != nil {
		// Deleted, not yet gone: the manager finishes it.
		b.log.Warn("sandbox deleted but still terminating", "sandbox", id, "error", err)
	}
	b.log.Info("sandbox stopped", "sandbox", id, "owner", mcpserver.IdentityHash(caller.ID))
	return nil
}

// waitGone returns once none of the named Sandboxes exists. It watches
// rather than polls, so that sandbox_stop returns as soon as the manager has
// removed the container and its finalizer.
func (b *Backend) waitGone(ctx context.Context, keys []client.ObjectKey) error {
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

// Ready implements mcpserver.Backend: the API server answers and the
// server may list Sandboxes in its namespace.
func (b *Backend) Ready(ctx context.Context) error {
	var list sandboxv1alpha1.SandboxList
	return apiError("listing sandboxes", b.kube.List(ctx, &list, client.InNamespace(b.sweepNamespace()), client.Limit(1),
		client.MatchingLabels{LabelManagedBy: ManagedBy}))
}

// Close implements mcpserver.Backend: it stops the reaper and deletes every
// Sandbox this instance created, including any a create still in flight
// made, and waits (bounded by ctx) until they are gone. Sandboxes of a
// server that crashed end through their activeDeadlineSeconds.
func (b *Backend) Close(ctx context.Context) error {
	b.stopOnce.Do(func() { close(b.stop) })
	defer b.nodes.Close()
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
	b.mu.Lock()
	b.sandboxes = map[string]*entry{}
	b.mu.Unlock()
	if len(keys) > 0 {
		if err := b.waitGone(ctx, keys); err != nil {
			errs = append(errs, err)
		}
		b.log.Info("deleted this server's sandboxes", "count", len(keys))
	}
	return errors.Join(errs...)
}

func (b *Backend) loop() {
	t := time.NewTicker(mcpserver.ReapInterval(b.opts.IdleTimeout))
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.reap(time.Now())
		}
	}
}

// reap deletes this instance's Sandboxes that are idle or past their
// lifetime (an expired Sandbox keeps its object until someone deletes it).
func (b *Backend) reap(now time.Time) {
	type victim struct{ namespace, name, why string }
	var victims []victim
	b.mu.Lock()
	for _, e := range b.sandboxes {
		if why := e.ReapReason(now, b.opts.IdleTimeout); why != "" {
			e.Removing = true
			victims = append(victims, victim{e.namespace, e.name, why})
		}
	}
	b.mu.Unlock()
	for _, v := range victims {
		b.log.Info("deleting sandbox", "namespace", v.namespace, "sandbox", v.name, "reason", v.why)
		b.deleteQuietly(v.namespace, v.name, v.why)
		b.forget(v.namespace, v.name)
	}
	b.sweepExpired()
}

// sweepExpired deletes MCP Sandboxes in the namespace that have expired,
// whichever server instance created them: their containers are gone, and
// without this the objects of a crashed server would stay forever.
func (b *Backend) sweepExpired() {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	var list sandboxv1alpha1.SandboxList
	if err := b.kube.List(ctx, &list, client.InNamespace(b.sweepNamespace()), client.MatchingLabels{LabelManagedBy: ManagedBy}); err != nil {
		b.log.Warn("listing sandboxes for the expiry sweep", "error", err)
		return
	}
	for i := range list.Items {
		sbx := &list.Items[i]
		if sbx.DeletionTimestamp == nil && meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)) {
			b.log.Info("deleting expired sandbox", "namespace", sbx.Namespace, "sandbox", sbx.Name, "instance", sbx.Labels[LabelInstance])
			b.deleteQuietly(sbx.Namespace, sbx.Name, "expired")
			b.forget(sbx.Namespace, sbx.Name)
		}
	}
}
