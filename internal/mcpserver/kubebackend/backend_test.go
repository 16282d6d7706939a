package kubebackend

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

func withReady(status metav1.ConditionStatus, reason, message string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "mcp-abc"},
		Status: sandboxv1alpha1.SandboxStatus{
			NodeName:      "n1",
			AgentEndpoint: "https://127.0.0.1:9443",
			Conditions:    []metav1.Condition{{Type: "Ready", Status: status, Reason: reason, Message: message}},
		},
	}
}

func TestStartStatus(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sbx   *sandboxv1alpha1.Sandbox
		state startState
		kind  error
		text  []string
	}{
		{"no condition yet", &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "mcp-abc"}}, starting, nil, []string{"no manager"}},
		{"ready", withReady(metav1.ConditionTrue, "Running", "container abc is running"), started, nil, nil},
		{"pending", withReady(metav1.ConditionFalse, "Pending", "nodes at capacity"), starting, nil, []string{"Pending", "nodes at capacity"}},
		{"provisioning", withReady(metav1.ConditionFalse, "Provisioning", "pulling"), starting, nil, []string{"Provisioning"}},
		{"node at capacity", withReady(metav1.ConditionFalse, "NodeAtCapacity", "full"), starting, nil, []string{"NodeAtCapacity"}},
		{"docker unavailable", withReady(metav1.ConditionFalse, "DockerUnavailable", "no answer"), starting, nil, []string{"DockerUnavailable"}},
		{"image not found", withReady(metav1.ConditionFalse, "ImageNotFound", "no such image: nope:1"), failed, mcpserver.ErrImageNotFound, []string{"ImageNotFound", "no such image: nope:1", "mcp-abc"}},
		{"runtime unavailable", withReady(metav1.ConditionFalse, "RuntimeUnavailable", "runsc"), failed, mcpserver.ErrUnavailable, []string{"RuntimeUnavailable"}},
		{"create failed", withReady(metav1.ConditionFalse, "CreateFailed", "docker said no"), failed, mcpserver.ErrInvalid, []string{"CreateFailed", "docker said no"}},
		{"exited", withReady(metav1.ConditionFalse, "ContainerExited", "exit code 1"), failed, mcpserver.ErrInvalid, []string{"ContainerExited"}},
		{"oom", withReady(metav1.ConditionFalse, "OOMKilled", "memory"), failed, mcpserver.ErrInvalid, []string{"OOMKilled"}},
		{"multiple", withReady(metav1.ConditionFalse, "MultipleContainers", "two"), failed, mcpserver.ErrInvalid, []string{"MultipleContainers"}},
		{"expired", withReady(metav1.ConditionFalse, "Expired", "deadline"), failed, mcpserver.ErrInvalid, []string{"Expired"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, err := startStatus(tc.sbx)
			if state != tc.state {
				t.Fatalf("state = %v, want %v (err %v)", state, tc.state, err)
			}
			if tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Errorf("error %v is not %v", err, tc.kind)
			}
			for _, s := range tc.text {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("error %v does not mention %q", err, s)
				}
			}
		})
	}

	noEndpoint := withReady(metav1.ConditionTrue, "Running", "")
	noEndpoint.Status.AgentEndpoint = ""
	if state, err := startStatus(noEndpoint); state != starting || !strings.Contains(err.Error(), "node API") {
		t.Errorf("Ready without endpoint: %v, %v; want starting, waiting for the node API", state, err)
	}
	deleting := withReady(metav1.ConditionFalse, "Provisioning", "")
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if state, _ := startStatus(deleting); state != failed {
		t.Errorf("a Sandbox being deleted is %v, want failed", state)
	}
}

var gr = schema.GroupResource{Group: "sandbox.code-sandbox.dev", Resource: "sandboxes"}

func TestAPIError(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		kind error
		text string
	}{
		{"rbac", apierrors.NewForbidden(gr, "", errors.New(`User "x" cannot create resource "sandboxes"`)), mcpserver.ErrInvalid, `cannot create resource "sandboxes"`},
		{"quota webhook", apierrors.NewForbidden(gr, "", errors.New("sandbox quota exceeded: 3 of 3 in team-a")), mcpserver.ErrQuota, "3 of 3 in team-a"},
		{"validation", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "Sandbox"}, "mcp-x", nil), mcpserver.ErrInvalid, "mcp-x"},
		{"not found", apierrors.NewNotFound(gr, "mcp-x"), mcpserver.ErrNotFound, "mcp-x"},
		{"unavailable", apierrors.NewServiceUnavailable("down"), mcpserver.ErrUnavailable, "down"},
		{"no answer", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), mcpserver.ErrUnavailable, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := apiError("creating the sandbox", tc.err)
			if !errors.Is(err, tc.kind) {
				t.Errorf("%v is not %v", err, tc.kind)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("%q does not carry %q", err, tc.text)
			}
		})
	}
	if err := apiError("x", context.Canceled); !errors.Is(err, context.Canceled) {
		t.Errorf("cancellation became %v", err)
	}
}

func TestClientError(t *testing.T) {
	node := func(code int32, msg string) error {
		return &sandboxclient.APIError{Namespace: "ns", Name: "mcp-x", Code: code, Message: msg, Source: "node API"}
	}
	for _, tc := range []struct {
		name string
		op   nodeOp
		err  error
		kind error
	}{
		{"sandbox gone", opExec, &sandboxclient.APIError{Code: 404, Message: "not found", Source: "kube-apiserver"}, mcpserver.ErrNotFound},
		{"path missing", opFiles, node(404, "downloading /app/nope from sandbox 0123: open nope: no such file or directory"), execio.ErrPathNotFound},
		{"sandbox gone from node", opFiles, node(404, "sandbox ns/mcp-x not found"), mcpserver.ErrNotFound},
		{"not ready", opExec, &sandboxclient.NotReadyError{Namespace: "ns", Name: "mcp-x", Reason: "OOMKilled", Message: "memory"}, mcpserver.ErrNotRunning},
		{"conflict", opExec, node(http.StatusConflict, "container gone"), mcpserver.ErrNotRunning},
		{"docker down", opExec, node(503, "docker"), mcpserver.ErrUnavailable},
		{"busy", opExec, node(429, "too many"), mcpserver.ErrUnavailable},
		{"too large", opFiles, node(413, "too large"), execio.ErrTooLarge},
		{"bad path", opFiles, node(400, "invalid path: ../x"), mcpserver.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := clientError(tc.op, tc.err); !errors.Is(err, tc.kind) {
				t.Errorf("%v is not %v", err, tc.kind)
			}
		})
	}
	if err := clientError(opExec, &sandboxclient.NotReadyError{Name: "mcp-x", Reason: "OOMKilled", Message: "killed"}); !strings.Contains(err.Error(), "OOMKilled") {
		t.Errorf("not-ready error %q lost its reason", err)
	}
}

// recordingReviewer answers SubjectAccessReviews from allow and records
// them.
type recordingReviewer struct {
	mu      sync.Mutex
	allow   func(*authzv1.ResourceAttributes) bool
	reviews []*authzv1.SubjectAccessReview
}

func (r *recordingReviewer) Create(_ context.Context, sar *authzv1.SubjectAccessReview, _ metav1.CreateOptions) (*authzv1.SubjectAccessReview, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reviews = append(r.reviews, sar)
	out := sar.DeepCopy()
	out.Status.Allowed = r.allow(sar.Spec.ResourceAttributes)
	return out, nil
}

func (r *recordingReviewer) last() *authzv1.SubjectAccessReview {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reviews) == 0 {
		return nil
	}
	return r.reviews[len(r.reviews)-1]
}

func testBackend(t *testing.T, rev AccessReviewer, objs ...*sandboxv1alpha1.Sandbox) *Backend {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	fb := fake.NewClientBuilder().WithScheme(scheme)
	for _, o := range objs {
		fb = fb.WithObjects(o)
	}
	return &Backend{
		kube:      fb.Build(),
		authz:     newAuthorizer(rev, "team-a"),
		ns:        "team-a",
		instance:  "mcp-test",
		opts:      Options{MaxSandboxes: 2, IdleTimeout: time.Hour, ReadyTimeout: time.Second, StopTimeout: time.Second},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*entry{},
		stop:      make(chan struct{}),
	}
}

var alice = mcpserver.Caller{
	ID: "kube:system:serviceaccount:team-a:alice", Username: "system:serviceaccount:team-a:alice", UID: "u-1",
	Groups: []string{"system:serviceaccounts", "system:authenticated"}, Extra: map[string][]string{"authentication.kubernetes.io/pod-name": {"p"}},
}

// Every operation asks RBAC for the permission the node API or the API
// server would check, for the caller, before it touches anything.
func TestEachOperationIsReviewed(t *testing.T) {
	rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return false }}
	b := testBackend(t, rev)
	ctx := context.Background()
	for _, tc := range []struct {
		op          string
		call        func() error
		verb, sub   string
		named, deny string
	}{
		{"create", func() error { _, err := b.Create(ctx, alice, mcpserver.CreateRequest{Image: "python:3"}); return err }, "create", "", "", "may not create sandboxes in namespace"},
		{"get", func() error { _, err := b.Get(ctx, alice, "mcp-1"); return err }, "get", "", "mcp-1", "may not get sandboxes"},
		{"list", func() error { _, err := b.List(ctx, alice); return err }, "list", "", "", "may not list sandboxes"},
		{"stop", func() error { return b.Stop(ctx, alice, "mcp-1") }, "delete", "", "mcp-1", "may not delete sandboxes"},
		{"exec", func() error {
			_, err := b.Exec(ctx, alice, "mcp-1", execio.Request{Shell: "true"}, nil)
			return err
		}, "create", "exec", "mcp-1", "may not create sandboxes/exec"},
		{"upload", func() error {
			_, err := b.Upload(ctx, alice, "mcp-1", "/app", strings.NewReader(""), execio.UploadLimits{})
			return err
		}, "create", "files", "mcp-1", "may not create sandboxes/files"},
		{"download", func() error { _, err := b.Download(ctx, alice, "mcp-1", "/app/x", io.Discard, 10); return err }, "get", "files", "mcp-1", "may not get sandboxes/files"},
		{"logs", func() error { _, err := b.Logs(ctx, alice, "mcp-1", mcpserver.LogsOptions{}); return err }, "get", "log", "mcp-1", "may not get sandboxes/log"},
	} {
		t.Run(tc.op, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, mcpserver.ErrInvalid) || !strings.Contains(err.Error(), tc.deny) || !strings.Contains(err.Error(), alice.Username) || !strings.Contains(err.Error(), `"team-a"`) {
				t.Fatalf("error = %v; want a denial naming the user, %q and the namespace", err, tc.deny)
			}
			sar := rev.last()
			ra := sar.Spec.ResourceAttributes
			if ra.Verb != tc.verb || ra.Subresource != tc.sub || ra.Name != tc.named || ra.Namespace != "team-a" ||
				ra.Group != "sandbox.code-sandbox.dev" || ra.Resource != "sandboxes" {
				t.Errorf("review attributes = %+v", ra)
			}
			if sar.Spec.User != alice.Username || sar.Spec.UID != "u-1" || len(sar.Spec.Groups) != 2 || sar.Spec.Extra["authentication.kubernetes.io/pod-name"][0] != "p" {
				t.Errorf("review subject = %+v", sar.Spec)
			}
		})
	}
}

func TestReviewsAreCachedAndSkippedForOtherIdentities(t *testing.T) {
	rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}
	b := testBackend(t, rev)
	ctx := context.Background()
	for range 3 {
		if _, err := b.List(ctx, alice); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(rev.reviews); n != 1 {
		t.Errorf("%d reviews for three lists; want one (cached)", n)
	}
	if _, err := b.List(ctx, mcpserver.Caller{ID: mcpserver.LocalIdentity}); err != nil {
		t.Fatal(err)
	}
	if n := len(rev.reviews); n != 1 {
		t.Errorf("a non-Kubernetes caller was reviewed")
	}
}

func mcpSandbox(name, ownerID string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", Labels: map[string]string{
			LabelManagedBy: ManagedBy, LabelOwner: mcpserver.IdentityHash(ownerID), LabelInstance: "mcp-other",
		}},
		Spec: sandboxv1alpha1.SandboxSpec{Image: "python:3"},
	}
}

func TestOwnership(t *testing.T) {
	rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}
	bob := mcpserver.Caller{ID: "kube:bob", Username: "bob"}
	b := testBackend(t, rev, mcpSandbox("mcp-a1", alice.ID), mcpSandbox("mcp-b1", bob.ID))
	ctx := context.Background()
	if _, err := b.Get(ctx, alice, "mcp-a1"); err != nil {
		t.Errorf("alice cannot get her sandbox: %v", err)
	}
	if _, err := b.Get(ctx, alice, "mcp-b1"); !errors.Is(err, mcpserver.ErrNotFound) {
		t.Errorf("alice got bob's sandbox: %v", err)
	}
	if err := b.Stop(ctx, alice, "mcp-b1"); !errors.Is(err, mcpserver.ErrNotFound) {
		t.Errorf("alice stopped bob's sandbox: %v", err)
	}
	list, err := b.List(ctx, bob)
	if err != nil || len(list) != 1 || list[0].ID != "mcp-b1" {
		t.Errorf("bob's list = %+v, %v", list, err)
	}
	// Quota: MaxSandboxes is 2 and bob has one.
	b.opts.MaxSandboxes = 1
	if _, err := b.Create(ctx, bob, mcpserver.CreateRequest{Image: "python:3"}); !errors.Is(err, mcpserver.ErrQuota) {
		t.Errorf("create past the quota: %v", err)
	}
}

func TestSandboxSpec(t *testing.T) {
	b := testBackend(t, &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }})
	b.opts.NodeName = "n1"
	sbx := b.sandboxSpec(alice, "mcp-x", mcpserver.CreateRequest{
		Image: "python:3", NanoCPUs: 1_500_000_000, MemoryBytes: 256 << 20, Network: mcpserver.NetworkEgress, Lifetime: 90 * time.Second,
	})
	switch {
	case sbx.Spec.Resources.CPU.String() != "1500m", sbx.Spec.Resources.Memory.String() != "256Mi":
		t.Errorf("resources = %v, %v", sbx.Spec.Resources.CPU, sbx.Spec.Resources.Memory)
	case sbx.Spec.Network.Mode != sandboxv1alpha1.NetworkEgress:
		t.Errorf("network = %q", sbx.Spec.Network.Mode)
	case *sbx.Spec.ActiveDeadlineSeconds != 90:
		t.Errorf("activeDeadlineSeconds = %d", *sbx.Spec.ActiveDeadlineSeconds)
	case sbx.Spec.NodeName != "n1":
		t.Errorf("nodeName = %q", sbx.Spec.NodeName)
	case sbx.Labels[LabelOwner] != mcpserver.IdentityHash(alice.ID), sbx.Labels[LabelInstance] != "mcp-test", sbx.Labels[LabelManagedBy] != ManagedBy:
		t.Errorf("labels = %v", sbx.Labels)
	case sbx.Annotations[AnnotationIdentity] != alice.ID:
		t.Errorf("annotations = %v", sbx.Annotations)
	}
}

func TestForwardTarCapsContent(t *testing.T) {
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	for _, name := range []string{"a", "b"} {
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 10, Mode: 0o644})
		_, _ = tw.Write(bytes.Repeat([]byte("x"), 10))
	}
	_ = tw.Close()
	var out bytes.Buffer
	stats, err := forwardTar(bytes.NewReader(archive.Bytes()), &out, 20)
	if err != nil || stats.Files != 2 || stats.Bytes != 20 || !bytes.Equal(out.Bytes(), archive.Bytes()) {
		t.Fatalf("within the cap: %+v, %v (copied %d of %d bytes)", stats, err, out.Len(), archive.Len())
	}
	if _, err := forwardTar(bytes.NewReader(archive.Bytes()), io.Discard, 15); !errors.Is(err, execio.ErrTooLarge) {
		t.Errorf("past the cap: %v", err)
	}
}

func TestSweepDeletesOnlyExpiredMCPSandboxes(t *testing.T) {
	expired := mcpSandbox("mcp-old", "kube:carol")
	expired.Labels[LabelInstance] = "mcp-crashed-instance"
	expired.Status.Conditions = []metav1.Condition{{Type: string(sandboxv1alpha1.SandboxConditionExpired), Status: metav1.ConditionTrue, Reason: "Expired"}}
	live := mcpSandbox("mcp-live", "kube:carol")
	foreign := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "not-ours", Namespace: expired.Namespace},
		Status:     sandboxv1alpha1.SandboxStatus{Conditions: expired.Status.Conditions},
	}
	b := testBackend(t, &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}, expired, live, foreign)
	b.sweepExpired()
	var list sandboxv1alpha1.SandboxList
	if err := b.kube.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "mcp-live,not-ours" {
		t.Errorf("after the sweep: %v; want the expired MCP sandbox gone and the others kept", names)
	}
}
