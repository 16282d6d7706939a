package kubebackend

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

func withReady(status metav1.ConditionStatus, reason, message string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "mcp-abc"},
		Status: sandboxv1alpha1.SandboxStatus{
			NodeName:        "n1",
			NodeAPIEndpoint: "https://127.0.0.1:9443",
			Conditions:      []metav1.Condition{{Type: "Ready", Status: status, Reason: reason, Message: message}},
		},
	}
}

var _ = Describe("startStatus", Label("unit"), func() {
	DescribeTable("maps the Ready condition to a start state and error",
		func(sbx *sandboxv1alpha1.Sandbox, wantState startState, kind error, text []string) {
			state, err := startStatus(sbx)
			Expect(state).To(Equal(wantState), "state (err %v)", err)
			if kind != nil {
				Expect(err).To(MatchError(kind), "error %v is not %v", err, kind)
			}
			for _, s := range text {
				Expect(err).To(MatchError(ContainSubstring(s)), "error %v does not mention %q", err, s)
			}
		},
		Entry("no condition yet", &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "mcp-abc"}}, starting, nil, []string{"no manager"}),
		Entry("ready", withReady(metav1.ConditionTrue, "Running", "container abc is running"), started, nil, nil),
		Entry("pending", withReady(metav1.ConditionFalse, "Pending", "nodes at capacity"), starting, nil, []string{"Pending", "nodes at capacity"}),
		Entry("provisioning", withReady(metav1.ConditionFalse, "Provisioning", "pulling"), starting, nil, []string{"Provisioning"}),
		Entry("node at capacity", withReady(metav1.ConditionFalse, "NodeAtCapacity", "full"), starting, nil, []string{"NodeAtCapacity"}),
		Entry("docker unavailable", withReady(metav1.ConditionFalse, "DockerUnavailable", "no answer"), starting, nil, []string{"DockerUnavailable"}),
		Entry("image not found", withReady(metav1.ConditionFalse, "ImageNotFound", "no such image: nope:1"), failed, contract.ErrImageNotFound, []string{"ImageNotFound", "no such image: nope:1", "mcp-abc"}),
		Entry("runtime unavailable", withReady(metav1.ConditionFalse, "RuntimeUnavailable", "runsc"), failed, contract.ErrUnavailable, []string{"RuntimeUnavailable"}),
		Entry("create failed", withReady(metav1.ConditionFalse, "CreateFailed", "docker said no"), failed, contract.ErrInvalid, []string{"CreateFailed", "docker said no"}),
		Entry("exited", withReady(metav1.ConditionFalse, "ContainerExited", "exit code 1"), failed, contract.ErrInvalid, []string{"ContainerExited"}),
		Entry("oom", withReady(metav1.ConditionFalse, "OOMKilled", "memory"), failed, contract.ErrInvalid, []string{"OOMKilled"}),
		Entry("multiple", withReady(metav1.ConditionFalse, "MultipleContainers", "two"), failed, contract.ErrInvalid, []string{"MultipleContainers"}),
		Entry("member invalid", withReady(metav1.ConditionFalse, "WarmPoolMemberInvalid", "not its member"), failed, contract.ErrInvalid, []string{"WarmPoolMemberInvalid"}),
		Entry("expired", withReady(metav1.ConditionFalse, "Expired", "deadline"), failed, contract.ErrInvalid, []string{"Expired"}),
		Entry("node lost", withReady(metav1.ConditionFalse, "NodeLost", "node n1 is lost"), failed, contract.ErrUnavailable, []string{"NodeLost", "node n1 is lost"}),
	)

	It("keeps waiting for the node API when Ready has no endpoint", func() {
		noEndpoint := withReady(metav1.ConditionTrue, "Running", "")
		noEndpoint.Status.NodeAPIEndpoint = ""
		state, err := startStatus(noEndpoint)
		Expect(state).To(Equal(starting), "Ready without endpoint: want starting, waiting for the node API (err %v)", err)
		Expect(err).To(MatchError(ContainSubstring("node API")), "Ready without endpoint: want starting, waiting for the node API")
	})

	It("fails a Sandbox being deleted", func() {
		deleting := withReady(metav1.ConditionFalse, "Provisioning", "")
		deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		state, _ := startStatus(deleting)
		Expect(state).To(Equal(failed), "a Sandbox being deleted is %v, want failed", state)
	})
})

var gr = schema.GroupResource{Group: "sandbox.code-sandbox.dev", Resource: "sandboxes"}

var _ = Describe("apiError", Label("unit"), func() {
	DescribeTable("classifies API server errors and keeps their message",
		func(in, kind error, text string) {
			err := apiError("creating the sandbox", in)
			Expect(err).To(MatchError(kind), "%v is not %v", err, kind)
			Expect(err.Error()).To(ContainSubstring(text), "%q does not carry %q", err, text)
		},
		Entry("rbac", apierrors.NewForbidden(gr, "", errors.New(`User "x" cannot create resource "sandboxes"`)), contract.ErrInvalid, `cannot create resource "sandboxes"`),
		Entry("validation", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "Sandbox"}, "mcp-x", nil), contract.ErrInvalid, "mcp-x"),
		Entry("not found", apierrors.NewNotFound(gr, "mcp-x"), contract.ErrNotFound, "mcp-x"),
		Entry("unavailable", apierrors.NewServiceUnavailable("down"), contract.ErrUnavailable, "down"),
		Entry("no answer", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), contract.ErrUnavailable, "connection refused"),
	)

	// What the API server returns when the SandboxQuota webhook refuses: the
	// webhook's 403 Status, its causes kept, its message prefixed with the
	// webhook's name.
	denied := func(cause metav1.CauseType, field, msg string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: `admission webhook "sandbox-quota.code-sandbox.dev" denied the request: ` + msg,
			Details: &metav1.StatusDetails{Name: "mcp-x", Group: subresource.StatusGroup, Kind: subresource.StatusKind,
				Causes: []metav1.StatusCause{{Type: cause, Field: field, Message: msg}}},
		}}
	}
	DescribeTable("tells quota usage from quota rules by the webhook's causes and keeps the whole message",
		func(in, kind error, text string) {
			err := apiError("creating the sandbox", in)
			Expect(err).To(MatchError(kind), "%v is not %v", err, kind)
			for _, other := range []error{contract.ErrQuota, contract.ErrInvalid, contract.ErrUnavailable} {
				if other != kind {
					Expect(err).NotTo(MatchError(other), "%v is also %v", err, other)
				}
			}
			Expect(err.Error()).To(ContainSubstring("creating the sandbox: "))
			Expect(err.Error()).To(ContainSubstring(text), "%q does not carry %q", err, text)
		},
		Entry("usage", denied(subresource.CauseQuotaExceeded, "", `sandbox quota "team-a" exceeded: sandboxes: requested 1, used 3, limit 3 (1 over)`),
			contract.ErrQuota, `admission webhook "sandbox-quota.code-sandbox.dev" denied the request: sandbox quota "team-a" exceeded: sandboxes: requested 1, used 3, limit 3 (1 over)`),
		Entry("usage of several limits", denied(subresource.CauseQuotaExceeded, "", `sandbox quota "team-a" exceeded: cpu: requested 2, used 3, limit 4 (1 over); memory: requested 1Gi, used 4Gi, limit 4Gi (1Gi over)`),
			contract.ErrQuota, `cpu: requested 2, used 3, limit 4 (1 over); memory: requested 1Gi, used 4Gi, limit 4Gi (1Gi over)`),
		Entry("image rule", denied(subresource.CauseQuotaRule, "", `sandbox quota "team-a" does not allow image "evil/x:1" (docker.io/evil/x:1); allowed images: docker.io/library/python:*, code-sandbox-test/*`),
			contract.ErrInvalid, `does not allow image "evil/x:1" (docker.io/evil/x:1); allowed images: docker.io/library/python:*, code-sandbox-test/*`),
		Entry("image rule naming an image that says exceeded", denied(subresource.CauseQuotaRule, "", `sandbox quota "team-a" does not allow image "quota/exceeded:1" (docker.io/quota/exceeded:1); allowed images: code-sandbox-test/*`),
			contract.ErrInvalid, `"quota/exceeded:1"`),
		Entry("runtime rule", denied(subresource.CauseQuotaRule, "", `sandbox quota "team-a" does not allow runtime "gvisor"; allowed runtimes: runc`),
			contract.ErrInvalid, `does not allow runtime "gvisor"; allowed runtimes: runc`),
		Entry("egress rule", denied(subresource.CauseQuotaRule, "", `sandbox quota "team-a" does not allow network mode Egress (its allowEgress is false); use network mode None`),
			contract.ErrInvalid, "use network mode None"),
		Entry("lifetime required", denied(subresource.CauseQuotaRule, "spec.activeDeadlineSeconds", `sandbox quota "team-a" requires spec.activeDeadlineSeconds of at most 3600; the Sandbox sets none`),
			contract.ErrInvalid, "requires spec.activeDeadlineSeconds of at most 3600; the Sandbox sets none"),
		Entry("lifetime too long", denied(subresource.CauseQuotaRule, "spec.activeDeadlineSeconds", `sandbox quota "team-a" allows activeDeadlineSeconds of at most 3600; the Sandbox asks for 14400 (10800 over)`),
			contract.ErrInvalid, "allows activeDeadlineSeconds of at most 3600; the Sandbox asks for 14400 (10800 over)"),
		Entry("usage not counted yet", denied(subresource.CauseQuotaNotCounted, "", `sandbox quota "team-a" has not counted its usage yet; retry in a few seconds`),
			contract.ErrUnavailable, "has not counted its usage yet; retry in a few seconds"),
		Entry("a refusal whose message reads like a quota but carries no cause (RBAC, ResourceQuota)",
			apierrors.NewForbidden(gr, "mcp-x", errors.New("exceeded quota: sandboxes, requested: count/sandboxes.sandbox.code-sandbox.dev=1, used: count/sandboxes.sandbox.code-sandbox.dev=2, limited: count/sandboxes.sandbox.code-sandbox.dev=2")),
			contract.ErrInvalid, "used: count/sandboxes.sandbox.code-sandbox.dev=2, limited: count/sandboxes.sandbox.code-sandbox.dev=2"),
		Entry("webhook failed to record usage", &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError,
			Message: `admission webhook "sandbox-quota.code-sandbox.dev" denied the request: sandbox quota "team-a": could not record usage: etcdserver: request timed out`,
		}}, contract.ErrUnavailable, "could not record usage"),
		Entry("webhook failed, no reason", &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
			Message: `admission webhook "sandbox-quota.code-sandbox.dev" denied the request: sandbox quota "team-a": could not record usage`,
		}}, contract.ErrUnavailable, "could not record usage"),
		Entry("webhook down (fail closed)", apierrors.NewInternalError(errors.New(`failed calling webhook "sandbox-quota.code-sandbox.dev": failed to call webhook: Post "https://127.0.0.1:9444/validate-sandbox-code-sandbox-dev-v1alpha1-sandbox?timeout=10s": dial tcp 127.0.0.1:9444: connect: connection refused`)),
			contract.ErrUnavailable, "failed calling webhook"),
		Entry("RBAC on quotas is not a quota refusal", apierrors.NewForbidden(schema.GroupResource{Group: gr.Group, Resource: "sandboxquotas"}, "", errors.New(`User "x" cannot list resource "sandboxquotas"`)),
			contract.ErrInvalid, `cannot list resource "sandboxquotas"`),
	)

	It("tells the model that its lifetime is what a deadline rule limits", func() {
		err := apiError("creating the sandbox", denied(subresource.CauseQuotaRule, "spec.activeDeadlineSeconds",
			`sandbox quota "team-a" allows activeDeadlineSeconds of at most 3600; the Sandbox asks for 14400 (10800 over)`))
		Expect(err.Error()).To(ContainSubstring("lifetime"))
	})

	It("keeps cancellation", func() {
		err := apiError("x", context.Canceled)
		Expect(err).To(MatchError(context.Canceled), "cancellation became %v", err)
	})
})

var _ = Describe("clientError", Label("unit"), func() {
	// node is a subresource refusal as sandboxclient decodes it.
	node := func(code int32, reason metav1.StatusReason, msg string, causes ...metav1.CauseType) error {
		ae := &sandboxclient.APIError{Namespace: "ns", Name: "mcp-x", Code: code, Reason: reason, Message: msg, Source: sandboxclient.SourceSubresources}
		if len(causes) > 0 {
			ae.Details = &metav1.StatusDetails{Name: "mcp-x", Group: subresource.StatusGroup, Kind: subresource.StatusKind}
			for _, c := range causes {
				ae.Details.Causes = append(ae.Details.Causes, metav1.StatusCause{Type: c})
			}
		}
		return ae
	}
	DescribeTable("maps every reason and cause to a tool error kind",
		func(in, kind error) {
			err := clientError(in)
			Expect(err).To(MatchError(kind), "%v is not %v", err, kind)
		},
		Entry("sandbox gone (API server)", &sandboxclient.APIError{Code: 404, Reason: metav1.StatusReasonNotFound, Message: "not found", Source: sandboxclient.SourceAPIServer}, contract.ErrNotFound),
		Entry("NotFound", node(404, metav1.StatusReasonNotFound, "sandbox ns/mcp-x not found"), contract.ErrNotFound),
		Entry("NotFound, SandboxNotOnNode", node(404, metav1.StatusReasonNotFound, "not on node", subresource.CauseSandboxNotOnNode), contract.ErrNotFound),
		Entry("NotFound, PathNotFound", node(404, metav1.StatusReasonNotFound, "open nope: no such file or directory", subresource.CausePathNotFound), execio.ErrPathNotFound),
		Entry("NotReadyError", &sandboxclient.NotReadyError{Namespace: "ns", Name: "mcp-x", Reason: "OOMKilled", Message: "memory"}, contract.ErrNotRunning),
		Entry("Conflict, SandboxNotReady", node(409, metav1.StatusReasonConflict, "not Ready", subresource.CauseSandboxNotReady), contract.ErrNotRunning),
		Entry("Conflict, SandboxTerminating", node(409, metav1.StatusReasonConflict, "being deleted", subresource.CauseSandboxTerminating), contract.ErrNotRunning),
		Entry("Conflict, ContainerNotRunning", node(409, metav1.StatusReasonConflict, "container gone", subresource.CauseContainerNotRunning), contract.ErrNotRunning),
		Entry("Conflict without a cause", node(409, metav1.StatusReasonConflict, "container gone"), contract.ErrNotRunning),
		Entry("ServiceUnavailable, RuntimeUnavailable", node(503, metav1.StatusReasonServiceUnavailable, "docker", subresource.CauseRuntimeUnavailable), contract.ErrUnavailable),
		Entry("ServiceUnavailable, NodeAPIUnavailable", node(503, metav1.StatusReasonServiceUnavailable, "node API", subresource.CauseNodeAPIUnavailable), contract.ErrUnavailable),
		Entry("TooManyRequests, ExecLimit", node(429, metav1.StatusReasonTooManyRequests, "too many", subresource.CauseExecLimit), contract.ErrUnavailable),
		Entry("Timeout", node(504, metav1.StatusReasonTimeout, "deadline"), contract.ErrUnavailable),
		Entry("RequestEntityTooLarge", node(413, metav1.StatusReasonRequestEntityTooLarge, "too large"), execio.ErrTooLarge),
		Entry("a download cut off by its cap", &sandboxclient.TransferError{Namespace: "ns", Name: "mcp-x", Path: "/app", Message: "cap", Reason: metav1.StatusReasonRequestEntityTooLarge}, execio.ErrTooLarge),
		Entry("a stream cut off by Docker", &sandboxclient.TransferError{Namespace: "ns", Name: "mcp-x", Message: "docker", Reason: metav1.StatusReasonServiceUnavailable}, contract.ErrUnavailable),
		Entry("an exec cut off by Docker", &sandboxclient.ExecError{Namespace: "ns", Name: "mcp-x", Message: "docker", Reason: metav1.StatusReasonServiceUnavailable}, contract.ErrUnavailable),
		Entry("BadRequest, InvalidPath", node(400, metav1.StatusReasonBadRequest, "invalid path: ../x", subresource.CauseInvalidPath), contract.ErrInvalid),
		Entry("Invalid", node(422, metav1.StatusReasonInvalid, "invalid"), contract.ErrInvalid),
	)

	It("names the server's own credentials for Unauthorized and Forbidden", func() {
		for _, in := range []error{node(401, metav1.StatusReasonUnauthorized, "Unauthorized"), node(403, metav1.StatusReasonForbidden, "forbidden")} {
			Expect(clientError(in).Error()).To(ContainSubstring("the MCP server's own credentials were refused"))
		}
	})

	It("keeps the reason of a not-ready error", func() {
		err := clientError(&sandboxclient.NotReadyError{Name: "mcp-x", Reason: "OOMKilled", Message: "killed"})
		Expect(err.Error()).To(ContainSubstring("OOMKilled"), "not-ready error %q lost its reason", err)
	})
})

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

// testDriver is a driver on a fake API server; Backend() puts a
// session.Manager on it with the driver's options as they are then.
type testDriver struct{ *driver }

func (d testDriver) Backend() *Backend { return newBackend(d.driver) }

func testBackend(rev AccessReviewer, objs ...*sandboxv1alpha1.Sandbox) testDriver {
	GinkgoHelper()
	scheme := runtime.NewScheme()
	Expect(sandboxv1alpha1.AddToScheme(scheme)).To(Succeed())
	Expect(coordinationv1.AddToScheme(scheme)).To(Succeed())
	fb := fake.NewClientBuilder().WithScheme(scheme)
	for _, o := range objs {
		fb = fb.WithObjects(o)
	}
	return testDriver{&driver{
		kube:     fb.Build(),
		authz:    newAuthorizer(rev),
		ns:       "team-a",
		instance: "mcp-test",
		opts:     Options{MaxSandboxes: 2, IdleTimeout: time.Hour, ReadyTimeout: time.Second, StopTimeout: time.Second},
		log:      slog.New(slog.DiscardHandler),
	}}
}

var alice = contract.Caller{
	ID: "kube:system:serviceaccount:team-a:alice", Username: "system:serviceaccount:team-a:alice", UID: "u-1",
	Groups: []string{"system:serviceaccounts", "system:authenticated"}, Extra: map[string][]string{"authentication.kubernetes.io/pod-name": {"p"}},
}

// Every operation asks RBAC for the permission the node API or the API
// server would check, for the caller, before it touches anything.
var _ = Describe("access reviews", Label("unit"), func() {
	DescribeTable("each operation is reviewed for the caller",
		func(call func(b *Backend, ctx context.Context) error, verb, sub, named, deny string) {
			rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return false }}
			b := testBackend(rev).Backend()
			err := call(b, context.Background())
			Expect(err).To(MatchError(contract.ErrInvalid), "want a denial naming the user, %q and the namespace", deny)
			Expect(err.Error()).To(ContainSubstring(deny), "want a denial naming the user, %q and the namespace", deny)
			Expect(err.Error()).To(ContainSubstring(alice.Username), "want a denial naming the user, %q and the namespace", deny)
			Expect(err.Error()).To(ContainSubstring(`"team-a"`), "want a denial naming the user, %q and the namespace", deny)
			sar := rev.last()
			Expect(sar).NotTo(BeNil(), "no review was made")
			ra := sar.Spec.ResourceAttributes
			Expect(ra).NotTo(BeNil(), "review without resource attributes")
			Expect(ra.Verb).To(Equal(verb), "review attributes = %+v", ra)
			Expect(ra.Subresource).To(Equal(sub), "review attributes = %+v", ra)
			Expect(ra.Name).To(Equal(named), "review attributes = %+v", ra)
			Expect(ra.Namespace).To(Equal("team-a"), "review attributes = %+v", ra)
			Expect(ra.Group).To(Equal("sandbox.code-sandbox.dev"), "review attributes = %+v", ra)
			Expect(ra.Resource).To(Equal("sandboxes"), "review attributes = %+v", ra)
			Expect(sar.Spec.User).To(Equal(alice.Username), "review subject = %+v", sar.Spec)
			Expect(sar.Spec.UID).To(Equal("u-1"), "review subject = %+v", sar.Spec)
			Expect(sar.Spec.Groups).To(HaveLen(2), "review subject = %+v", sar.Spec)
			Expect(sar.Spec.Extra["authentication.kubernetes.io/pod-name"][0]).To(Equal("p"), "review subject = %+v", sar.Spec)
		},
		Entry("create", func(b *Backend, ctx context.Context) error {
			_, err := b.Create(ctx, alice, contract.CreateRequest{Image: "python:3"})
			return err
		}, "create", "", "", "may not create sandboxes in namespace"),
		Entry("get", func(b *Backend, ctx context.Context) error { _, err := b.Get(ctx, alice, "mcp-1"); return err }, "get", "", "mcp-1", "may not get sandboxes"),
		Entry("list", func(b *Backend, ctx context.Context) error { _, err := b.List(ctx, alice); return err }, "list", "", "", "may not list sandboxes"),
		Entry("stop", func(b *Backend, ctx context.Context) error { return b.Stop(ctx, alice, "mcp-1") }, "delete", "", "mcp-1", "may not delete sandboxes"),
		Entry("exec", func(b *Backend, ctx context.Context) error {
			_, err := b.Exec(ctx, alice, "mcp-1", execio.Request{Shell: "true"}, nil)
			return err
		}, "create", "exec", "mcp-1", "may not create sandboxes/exec"),
		Entry("upload", func(b *Backend, ctx context.Context) error {
			_, err := b.Upload(ctx, alice, "mcp-1", "/app", strings.NewReader(""), execio.UploadLimits{})
			return err
		}, "create", "files", "mcp-1", "may not create sandboxes/files"),
		Entry("download", func(b *Backend, ctx context.Context) error {
			_, err := b.Download(ctx, alice, "mcp-1", "/app/x", io.Discard, 10)
			return err
		}, "get", "files", "mcp-1", "may not get sandboxes/files"),
		Entry("logs", func(b *Backend, ctx context.Context) error {
			_, err := b.Logs(ctx, alice, "mcp-1", contract.LogsOptions{})
			return err
		}, "get", "log", "mcp-1", "may not get sandboxes/log"),
		Entry("metrics", func(b *Backend, ctx context.Context) error {
			_, err := b.Metrics(ctx, alice, "mcp-1")
			return err
		}, "get", "metrics", "mcp-1", "may not get sandboxes/metrics"),
	)

	It("are cached and skipped for other identities", func() {
		rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}
		b := testBackend(rev).Backend()
		ctx := context.Background()
		for range 3 {
			_, err := b.List(ctx, alice)
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(rev.reviews).To(HaveLen(1), "reviews for three lists; want one (cached)")
		_, err := b.List(ctx, contract.Caller{ID: contract.LocalIdentity})
		Expect(err).NotTo(HaveOccurred())
		Expect(rev.reviews).To(HaveLen(1), "a non-Kubernetes caller was reviewed")
	})
})

func mcpSandbox(name, ownerID string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", Labels: map[string]string{
			LabelManagedBy: ManagedBy, LabelOwner: contract.IdentityHash(ownerID), LabelInstance: "mcp-other",
		}},
		Spec: sandboxv1alpha1.SandboxSpec{Image: "python:3"},
	}
}

var _ = Describe("Backend", Label("unit"), func() {
	It("lets callers see and stop only their own sandboxes, within the quota", func() {
		rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}
		bob := contract.Caller{ID: "kube:bob", Username: "bob"}
		d := testBackend(rev, mcpSandbox("mcp-a1", alice.ID), mcpSandbox("mcp-b1", bob.ID))
		b := d.Backend()
		ctx := context.Background()
		_, err := b.Get(ctx, alice, "mcp-a1")
		Expect(err).NotTo(HaveOccurred(), "alice cannot get her sandbox")
		_, err = b.Get(ctx, alice, "mcp-b1")
		Expect(err).To(MatchError(contract.ErrNotFound), "alice got bob's sandbox")
		err = b.Stop(ctx, alice, "mcp-b1")
		Expect(err).To(MatchError(contract.ErrNotFound), "alice stopped bob's sandbox")
		list, err := b.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred(), "bob's list = %+v", list)
		Expect(list).To(HaveLen(1), "bob's list = %+v", list)
		Expect(list[0].ID).To(Equal("mcp-b1"), "bob's list = %+v", list)
		// Quota: MaxSandboxes is 2 and bob has one.
		d.opts.MaxSandboxes = 1
		_, err = d.Backend().Create(ctx, bob, contract.CreateRequest{Image: "python:3"})
		Expect(err).To(MatchError(contract.ErrQuota), "create past the quota")
		Expect(err.Error()).To(Equal("you already have 1 sandboxes; the limit is 1"))
	})

	It("pauses through spec.paused and resumes by clearing it, waiting until the manager reports Ready", func() {
		rev := &recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}
		sbx := mcpSandbox("mcp-p1", alice.ID)
		d := testBackend(rev, sbx)
		d.opts.ReadyTimeout = 10 * time.Second
		ctx := context.Background()
		h := session.Handle{ID: "mcp-p1", Caller: alice}
		get := func() *sandboxv1alpha1.Sandbox {
			var got sandboxv1alpha1.Sandbox
			Expect(d.kube.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "mcp-p1"}, &got)).To(Succeed())
			return &got
		}
		setReady := func(status metav1.ConditionStatus, reason string) {
			got := get()
			got.Status.NodeAPIEndpoint = "https://node:9443"
			meta.SetStatusCondition(&got.Status.Conditions, metav1.Condition{Type: "Ready", Status: status, Reason: reason, Message: "m"})
			// The fake API server has no status subresource here.
			Expect(d.kube.Update(ctx, got)).To(Succeed())
		}
		setReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning)

		Expect(d.Pause(ctx, h)).To(Succeed())
		Expect(get().Spec.Paused).To(BeTrue())
		Expect(get().Spec.Image).To(Equal("python:3"), "only spec.paused changed")
		setReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused)

		// The manager thaws it a moment after spec.paused is cleared.
		go func() {
			defer GinkgoRecover()
			Eventually(func() bool { return get().Spec.Paused }).Should(BeFalse())
			time.Sleep(200 * time.Millisecond)
			setReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning)
		}()
		start := time.Now()
		Expect(d.Resume(ctx, h)).To(Succeed())
		Expect(time.Since(start)).To(BeNumerically(">=", 200*time.Millisecond), "Resume returned before the Sandbox was Ready")
		Expect(get().Spec.Paused).To(BeFalse())

		// A Sandbox paused by someone else is resumed the same way before
		// an exec; one that never becomes Ready fails the exec clearly.
		d.opts.ReadyTimeout = 500 * time.Millisecond
		Expect(d.Pause(ctx, h)).To(Succeed())
		setReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused)
		_, err := d.Exec(ctx, h, execio.Request{Shell: "true"}, nil)
		Expect(err).To(MatchError(contract.ErrUnavailable))
		Expect(err.Error()).To(ContainSubstring("did not become ready"))
		Expect(get().Spec.Paused).To(BeFalse(), "the exec cleared spec.paused")
	})

	It("builds the Sandbox spec from the request", func() {
		b := testBackend(&recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }})
		b.opts.NodeName = "n1"
		sbx := b.sandboxSpec(alice, "mcp-x", contract.CreateRequest{
			Image: "python:3", NanoCPUs: 1_500_000_000, MemoryBytes: 256 << 20, Network: contract.NetworkEgress, Lifetime: 90 * time.Second,
		})
		Expect(sbx.Spec.Resources.CPU.String()).To(Equal("1500m"), "resources")
		Expect(sbx.Spec.Resources.Memory.String()).To(Equal("256Mi"), "resources")
		Expect(sbx.Spec.Network.Mode).To(Equal(sandboxv1alpha1.NetworkEgress), "network")
		Expect(sbx.Spec.ActiveDeadlineSeconds).NotTo(BeNil(), "activeDeadlineSeconds")
		Expect(*sbx.Spec.ActiveDeadlineSeconds).To(Equal(int64(90)), "activeDeadlineSeconds")
		Expect(sbx.Spec.NodeName).To(Equal("n1"), "nodeName")
		Expect(sbx.Labels[LabelOwner]).To(Equal(contract.IdentityHash(alice.ID)), "labels = %v", sbx.Labels)
		Expect(sbx.Labels[LabelInstance]).To(Equal("mcp-test"), "labels = %v", sbx.Labels)
		Expect(sbx.Labels[LabelManagedBy]).To(Equal(ManagedBy), "labels = %v", sbx.Labels)
		Expect(sbx.Annotations[AnnotationIdentity]).To(Equal(alice.ID), "annotations = %v", sbx.Annotations)
	})

	It("writes egress_allow into spec.network.egress, and nothing without it", func() {
		b := testBackend(&recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }})
		sbx := b.sandboxSpec(alice, "mcp-x", contract.CreateRequest{Image: "python:3", Network: contract.NetworkEgress,
			EgressAllow: []string{"pypi.org", "*.pythonhosted.org"}})
		Expect(sbx.Spec.Network).To(Equal(sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkEgress,
			Egress: &sandboxv1alpha1.EgressPolicy{Allow: []sandboxv1alpha1.EgressRule{{Host: "pypi.org"}, {Host: "*.pythonhosted.org"}}}}))
		open := b.sandboxSpec(alice, "mcp-y", contract.CreateRequest{Image: "python:3", Network: contract.NetworkEgress})
		Expect(open.Spec.Network.Egress).To(BeNil(), "no egress_allow: unrestricted, as before")
	})

	It("sweeps only expired MCP sandboxes", func() {
		expired := mcpSandbox("mcp-old", "kube:carol")
		expired.Labels[LabelInstance] = "mcp-crashed-instance"
		expired.Status.Conditions = []metav1.Condition{{Type: string(sandboxv1alpha1.SandboxConditionExpired), Status: metav1.ConditionTrue, Reason: "Expired"}}
		live := mcpSandbox("mcp-live", "kube:carol")
		foreign := &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Name: "not-ours", Namespace: expired.Namespace},
			Status:     sandboxv1alpha1.SandboxStatus{Conditions: expired.Status.Conditions},
		}
		b := testBackend(&recordingReviewer{allow: func(*authzv1.ResourceAttributes) bool { return true }}, expired, live, foreign)
		b.sweepExpired(context.Background())
		var list sandboxv1alpha1.SandboxList
		Expect(b.kube.List(context.Background(), &list)).To(Succeed())
		var names []string
		for _, s := range list.Items {
			names = append(names, s.Name)
		}
		Expect(strings.Join(names, ",")).To(Equal("mcp-live,not-ours"), "after the sweep; want the expired MCP sandbox gone and the others kept")
	})
})

// With NamespaceFromServiceAccount one server serves many teams: each
// ServiceAccount's Sandboxes, access reviews and hence SandboxQuotas are
// those of its own namespace.
var _ = Describe("namespace per ServiceAccount", Label("unit"), func() {
	perSA := func(rev AccessReviewer) testDriver {
		b := testBackend(rev)
		b.ns = "shared"
		b.opts.NamespaceFromServiceAccount = true
		return b
	}
	allowAll := func(*authzv1.ResourceAttributes) bool { return true }

	It("puts a ServiceAccount's Sandboxes in its own namespace and reviews access there", func() {
		rev := &recordingReviewer{allow: allowAll}
		b := perSA(rev)
		Expect(b.namespaceFor(alice)).To(Equal("team-a"))
		Expect(b.sandboxSpec(alice, "mcp-x", contract.CreateRequest{Image: "busybox"}).Namespace).To(Equal("team-a"))
		_, err := b.Backend().List(context.Background(), alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(rev.last().Spec.ResourceAttributes.Namespace).To(Equal("team-a"))
	})

	It("finds a ServiceAccount's Sandbox in its namespace and not in another", func() {
		own := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: NamePrefix + "aaaa",
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelOwner: contract.IdentityHash(alice.ID)}}}
		elsewhere := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "shared", Name: NamePrefix + "bbbb",
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelOwner: contract.IdentityHash(alice.ID)}}}
		b := testBackend(&recordingReviewer{allow: allowAll}, own, elsewhere)
		b.ns = "shared"
		b.opts.NamespaceFromServiceAccount = true
		bk := b.Backend()
		_, err := bk.Get(context.Background(), alice, own.Name)
		Expect(err).NotTo(HaveOccurred())
		_, err = bk.Get(context.Background(), alice, elsewhere.Name)
		Expect(err).To(MatchError(contract.ErrNotFound))
		list, err := bk.List(context.Background(), alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(1))
		Expect(list[0].ID).To(Equal(own.Name))
	})

	It("keeps other callers, and every caller when it is off, in --namespace", func() {
		b := perSA(&recordingReviewer{allow: allowAll})
		user := contract.Caller{ID: "kube:bob", Username: "bob", Groups: []string{"system:authenticated"}}
		Expect(b.namespaceFor(user)).To(Equal("shared"))
		for _, name := range []string{"system:serviceaccount:", "system:serviceaccount:Bad_NS:x", "system:serviceaccount:no-name"} {
			odd := contract.Caller{ID: "kube:" + name, Username: name}
			Expect(b.namespaceFor(odd)).To(Equal("shared"), name)
		}
		token := contract.Caller{ID: "token:ci"}
		Expect(b.namespaceFor(token)).To(Equal("shared"), "a static-token caller has no ServiceAccount")
		b.opts.NamespaceFromServiceAccount = false
		Expect(b.namespaceFor(alice)).To(Equal("shared"))
	})
})
