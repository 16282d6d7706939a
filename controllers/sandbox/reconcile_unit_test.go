/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// The unit tier of the reconciler: Reconcile against fakeRuntime, a fake
// clock and controller-runtime's fake client, with no Docker Engine and no
// API server. The envtest suite (sandbox_controller_test.go) drives the same
// logic against real ones.

const (
	unitNode  = "node-a"
	unitUID   = "uid-1"
	unitGrace = 3 * time.Second
	unitBase  = time.Second
)

var unitKey = types.NamespacedName{Namespace: "ns", Name: "s"}

// unitEnv is one reconciler with its fakes.
type unitEnv struct {
	r       *SandboxReconciler
	c       client.Client
	rt      *fakeRuntime
	clk     *clocktesting.FakeClock
	rec     *events.FakeRecorder
	history *fakeHistory
	// failStatus makes every status write fail with this error.
	failStatus error
}

func unitScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(s)).To(Succeed())
	Expect(sandboxv1alpha1.AddToScheme(s)).To(Succeed())
	return s
}

func newUnitEnv(objs ...client.Object) *unitEnv {
	GinkgoHelper()
	e := &unitEnv{
		rt:      newFakeRuntime(),
		clk:     clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		rec:     events.NewFakeRecorder(100),
		history: &fakeHistory{},
	}
	builder := fake.NewClientBuilder().
		WithScheme(unitScheme()).
		WithStatusSubresource(&sandboxv1alpha1.Sandbox{})
	for field, extract := range sandboxIndexes {
		builder = builder.WithIndex(&sandboxv1alpha1.Sandbox{}, field, extract)
	}
	e.c = builder.
		WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if sub == "status" && e.failStatus != nil {
					return e.failStatus
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
		}).
		Build()
	var err error
	e.r, err = NewSandboxReconciler(e.c, e.c, e.rt, e.rec, e.clk, Options{
		NodeName:         unitNode,
		MaxSandboxes:     2,
		StopGracePeriod:  unitGrace,
		RetryBackoffBase: unitBase,
		RetryBackoffMax:  8 * time.Second,
		History:          e.history,
	})
	Expect(err).NotTo(HaveOccurred())
	return e
}

// reconcile runs one Reconcile of unitKey.
func (e *unitEnv) reconcile() (ctrl.Result, error) {
	return e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: unitKey})
}

func (e *unitEnv) mustReconcile() ctrl.Result {
	GinkgoHelper()
	res, err := e.reconcile()
	Expect(err).NotTo(HaveOccurred())
	return res
}

func (e *unitEnv) get() *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	sbx := &sandboxv1alpha1.Sandbox{}
	Expect(e.c.Get(context.Background(), unitKey, sbx)).To(Succeed())
	return sbx
}

// events returns "Type Reason" of every Event emitted since the last call.
func (e *unitEnv) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			f := strings.Fields(ev)
			out = append(out, f[0]+" "+f[1])
		default:
			return out
		}
	}
}

func (e *unitEnv) owner() dockerruntime.Owner {
	return dockerruntime.Owner{UID: unitUID, Namespace: unitKey.Namespace, Name: unitKey.Name, Node: unitNode}
}

// unitSandbox is the Sandbox under test. bound gives it to unitNode with the
// finalizer stored, as after a claim.
func unitSandbox(bound bool, mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: unitKey.Namespace, Name: unitKey.Name, UID: unitUID, Generation: 1},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: "img:1"},
	}
	if bound {
		sbx.Finalizers = []string{Finalizer}
		sbx.Status.NodeName = unitNode
	}
	for _, m := range mutate {
		m(sbx)
	}
	return sbx
}

// asPoolMember makes the Sandbox a member of warm pool "pool", paused as
// members are created.
func asPoolMember(s *sandboxv1alpha1.Sandbox) {
	s.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
	s.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxWarmPool", Name: "pool", UID: "pool-uid", Controller: ptr.To(true),
	}}
	s.Spec.Paused = true
}

func withReady(status metav1.ConditionStatus, reason string) func(*sandboxv1alpha1.Sandbox) {
	return func(s *sandboxv1alpha1.Sandbox) {
		meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Ready", Status: status, Reason: reason, Message: "m"})
	}
}

func ready(sbx *sandboxv1alpha1.Sandbox) string {
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// reconcileCase is one row of the reconcile table: a stored Sandbox, the
// runtime's state, one Reconcile, and what it must leave behind.
type reconcileCase struct {
	sandbox *sandboxv1alpha1.Sandbox
	// setup seeds the runtime (and may adjust the env) before Reconcile.
	setup func(e *unitEnv)
	// Outcome.
	wantErr        error // errors.Is; nil means no error
	wantReady      string
	wantRequeue    time.Duration // 0: not checked
	wantContainers int
	wantCalls      []string // call prefixes that must appear ("create", "start", "remove")
	wantNoCalls    []string // call prefixes that must not appear
	wantEvents     []string
	check          func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox)
}

var _ = Describe("Reconcile against a fake runtime", Label("unit"), func() {
	DescribeTable("one reconcile",
		func(tc reconcileCase) {
			e := newUnitEnv(tc.sandbox)
			if tc.setup != nil {
				tc.setup(e)
			}
			res, err := e.reconcile()
			if tc.wantErr != nil {
				Expect(err).To(MatchError(tc.wantErr))
			} else {
				Expect(err).NotTo(HaveOccurred())
			}
			sbx := e.get()
			Expect(ready(sbx)).To(Equal(tc.wantReady))
			if tc.wantRequeue != 0 {
				Expect(res.RequeueAfter).To(Equal(tc.wantRequeue))
			}
			Expect(e.rt.ids(unitUID)).To(HaveLen(tc.wantContainers))
			for _, p := range tc.wantCalls {
				Expect(e.rt.callsWith(p)).NotTo(BeEmpty(), "no %q call", p)
			}
			for _, p := range tc.wantNoCalls {
				Expect(e.rt.callsWith(p)).To(BeEmpty(), "unexpected %q call", p)
			}
			Expect(e.events()).To(Equal(tc.wantEvents))
			if tc.check != nil {
				tc.check(e, sbx)
			}
		},
		Entry("claim: binds an unbound Sandbox, stores the finalizer, creates and starts its container", reconcileCase{
			sandbox:        unitSandbox(false),
			wantReady:      "True/Running",
			wantContainers: 1,
			wantCalls:      []string{"create " + unitUID},
			wantEvents:     []string{"Normal Claimed", "Normal Running"},
			check: func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(sbx.Status.NodeName).To(Equal(unitNode))
				Expect(sbx.Finalizers).To(ConsistOf(Finalizer))
				Expect(sbx.Status.ContainerID).To(Equal(e.rt.ids(unitUID)[0]))
				Expect(sbx.Status.StartTime.Time.Equal(e.clk.Now())).To(BeTrue(), "start time %v", sbx.Status.StartTime)
				Expect(sbx.Status.ObservedGeneration).To(BeEquivalentTo(1))
				Expect(e.rt.specs).To(HaveLen(1))
				Expect(e.rt.specs[0].Owner).To(Equal(e.owner()))
				Expect(e.rt.specs[0].StopGracePeriod).To(Equal(unitGrace))
			},
		}),
		Entry("claim: leaves a Sandbox pinned to another node alone", reconcileCase{
			sandbox:     unitSandbox(false, func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = "node-b" }),
			wantReady:   "",
			wantNoCalls: []string{"create"},
			check: func(_ *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(sbx.Status.NodeName).To(BeEmpty())
				Expect(sbx.Finalizers).To(BeEmpty())
			},
		}),
		Entry("claim: leaves a Sandbox bound to another node alone", reconcileCase{
			sandbox:     unitSandbox(false, func(s *sandboxv1alpha1.Sandbox) { s.Status.NodeName = "node-b" }),
			wantReady:   "",
			wantNoCalls: []string{"create"},
		}),
		Entry("create: a bound Sandbox without a container gets one", reconcileCase{
			sandbox:        unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning)),
			wantReady:      "True/Running",
			wantContainers: 1,
			wantCalls:      []string{"create " + unitUID},
			wantEvents:     []string{"Normal Running"},
		}),
		Entry("pause: spec.paused freezes the running container; Ready goes False/Paused and Paused True", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning),
				func(s *sandboxv1alpha1.Sandbox) { s.Spec.Paused = true }),
			setup:          func(e *unitEnv) { e.rt.add(e.owner(), "running") },
			wantReady:      "False/Paused",
			wantContainers: 1,
			wantCalls:      []string{"pause "},
			// Only warm pool members are health-checked before the freeze.
			wantNoCalls: []string{"create", "remove", "unpause", "check"},
			wantEvents:  []string{"Normal Paused"},
			check: func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))).To(BeTrue())
				ct, err := e.rt.Find(context.Background(), unitUID)
				Expect(err).NotTo(HaveOccurred())
				Expect(ct.State.Paused).To(BeTrue())
			},
		}),
		Entry("warm pool member: frozen only after its health check passed", reconcileCase{
			sandbox:        unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning), asPoolMember),
			setup:          func(e *unitEnv) { e.rt.add(e.owner(), "running") },
			wantReady:      "False/Paused",
			wantContainers: 1,
			wantCalls:      []string{"check ", "pause "},
			wantEvents:     []string{"Normal Paused"},
			check: func(e *unitEnv, _ *sandboxv1alpha1.Sandbox) {
				Expect(e.rt.calls).To(HaveLen(2))
				Expect(e.rt.calls[0]).To(HavePrefix("check "), "the check comes before the freeze: %v", e.rt.calls)
			},
		}),
		Entry("warm pool member: a failed health check leaves it running and unclaimable, says why, and checks again after a backoff", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning), asPoolMember),
			setup: func(e *unitEnv) {
				e.rt.add(e.owner(), "running")
				e.rt.unhealthy = errors.New("health check of container c1 failed (exit code 1): cannot write in /app: permission denied")
			},
			wantReady:      "False/HealthCheckFailed",
			wantRequeue:    unitBase,
			wantContainers: 1,
			wantCalls:      []string{"check "},
			wantNoCalls:    []string{"pause", "remove", "create"},
			wantEvents:     []string{"Warning HealthCheckFailed"},
			check: func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
				Expect(c.Message).To(ContainSubstring("cannot write in /app: permission denied"))
				Expect(warmpool.Idle(sbx)).To(BeFalse())
				Expect(sbx.Status.ContainerID).To(Equal(e.rt.ids(unitUID)[0]))
				Expect(sbx.Status.StartTime).NotTo(BeNil(), "its lifetime counts from the start, so it still expires")
				Expect(sbx.Status.StartTime.Time.Equal(e.clk.Now())).To(BeTrue())
			},
		}),
		Entry("warm pool member: one that keeps failing its check still expires at the end of its lifetime", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonHealthCheckFailed), asPoolMember,
				func(s *sandboxv1alpha1.Sandbox) {
					s.Spec.ActiveDeadlineSeconds = ptr.To[int64](60)
					s.Status.StartTime = &metav1.Time{Time: time.Date(2026, 1, 2, 3, 3, 0, 0, time.UTC)}
				}),
			setup: func(e *unitEnv) {
				e.rt.add(e.owner(), "running")
				e.rt.unhealthy = errors.New("health check failed")
			},
			wantReady:   "False/Expired",
			wantCalls:   []string{"remove "},
			wantNoCalls: []string{"pause", "check"},
			wantEvents:  []string{"Warning Expired"},
		}),
		Entry("warm pool member: a failed check is retried no later than its expiry", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonHealthCheckFailed), asPoolMember,
				func(s *sandboxv1alpha1.Sandbox) {
					s.Spec.ActiveDeadlineSeconds = ptr.To[int64](6)
					s.Status.StartTime = &metav1.Time{Time: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
				}),
			setup: func(e *unitEnv) {
				e.rt.add(e.owner(), "running")
				// Backoff already at its cap (8 s); the expiry is 1 s away.
				for range 5 {
					e.r.backoff.next(unitUID)
				}
				e.rt.unhealthy = errors.New("health check failed")
			},
			wantReady:      "False/HealthCheckFailed",
			wantRequeue:    time.Second,
			wantContainers: 1,
		}),
		Entry("warm pool member: Docker failing the check is Docker's failure, not the member's", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning), asPoolMember),
			setup: func(e *unitEnv) {
				e.rt.add(e.owner(), "running")
				e.rt.unhealthy = fmt.Errorf("health check: %w", dockerruntime.ErrNotFound)
			},
			wantReady:      "False/CreateFailed",
			wantContainers: 1,
			wantNoCalls:    []string{"pause"},
			wantEvents:     []string{"Warning CreateFailed"},
		}),
		Entry("pause: a paused container stays paused without another call", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused),
				func(s *sandboxv1alpha1.Sandbox) { s.Spec.Paused = true }),
			setup: func(e *unitEnv) {
				id := e.rt.add(e.owner(), "running")
				Expect(e.rt.Pause(context.Background(), id)).To(Succeed())
				e.rt.calls = nil
			},
			wantReady:      "False/Paused",
			wantContainers: 1,
			wantNoCalls:    []string{"pause", "unpause", "create", "remove"},
		}),
		Entry("resume: spec.paused false thaws the container; Ready True/Running, Paused False/Resumed", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused),
				func(s *sandboxv1alpha1.Sandbox) {
					meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Paused", Status: metav1.ConditionTrue, Reason: "Paused", Message: "m"})
				}),
			setup: func(e *unitEnv) {
				id := e.rt.add(e.owner(), "running")
				Expect(e.rt.Pause(context.Background(), id)).To(Succeed())
			},
			wantReady:      "True/Running",
			wantContainers: 1,
			wantCalls:      []string{"unpause "},
			wantNoCalls:    []string{"create", "remove"},
			wantEvents:     []string{"Normal Running"},
			check: func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
				Expect(c).NotTo(BeNil())
				Expect(c.Status).To(Equal(metav1.ConditionFalse))
				Expect(c.Reason).To(Equal(sandboxv1alpha1.SandboxReasonResumed))
				ct, err := e.rt.Find(context.Background(), unitUID)
				Expect(err).NotTo(HaveOccurred())
				Expect(ct.State.Paused).To(BeFalse())
			},
		}),
		Entry("pause: a Sandbox created paused starts, is frozen, and its lifetime counts from the start", reconcileCase{
			sandbox: unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Paused = true
				s.Spec.ActiveDeadlineSeconds = ptr.To[int64](60)
			}),
			wantReady:      "False/Paused",
			wantContainers: 1,
			wantCalls:      []string{"create " + unitUID, "pause "},
			wantRequeue:    time.Minute,
			wantEvents:     []string{"Normal Paused"},
			check: func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(sbx.Status.StartTime).NotTo(BeNil())
			},
		}),
		Entry("pause: Docker down while pausing is DockerUnavailable with a retry", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning),
				func(s *sandboxv1alpha1.Sandbox) { s.Spec.Paused = true }),
			setup: func(e *unitEnv) {
				e.rt.add(e.owner(), "running")
				e.rt.pauseFails = true
			},
			wantErr:        dockerruntime.ErrUnavailable,
			wantReady:      "False/DockerUnavailable",
			wantContainers: 1,
			wantEvents:     []string{"Warning DockerUnavailable"},
		}),
		Entry("create: an invalid spec is reported, not retried", reconcileCase{
			sandbox:     unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) { s.Spec.Runtime = "kata" }),
			wantReady:   "False/" + sandboxv1alpha1.SandboxReasonCreateFailed,
			wantNoCalls: []string{"create"},
			wantEvents:  []string{"Warning " + sandboxv1alpha1.SandboxReasonCreateFailed},
		}),
		Entry("create: a missing image backs off with the retry base", reconcileCase{
			sandbox: unitSandbox(true),
			setup: func(e *unitEnv) {
				e.rt.createErr = fmt.Errorf("%w: image not found (pulling img:1)", dockerruntime.ErrImageNotFound)
			},
			wantReady:   "False/" + sandboxv1alpha1.SandboxReasonImageNotFound,
			wantRequeue: unitBase,
			wantEvents:  []string{"Warning " + sandboxv1alpha1.SandboxReasonImageNotFound},
		}),
		Entry("adopt: starts a container created by a manager that died before starting it", reconcileCase{
			sandbox:        unitSandbox(true),
			setup:          func(e *unitEnv) { e.rt.add(e.owner(), "created") },
			wantReady:      "",
			wantRequeue:    50 * time.Millisecond,
			wantContainers: 1,
			wantCalls:      []string{"start "},
			wantNoCalls:    []string{"create"},
			check: func(e *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(sbx.Status.ContainerID).To(Equal(e.rt.ids(unitUID)[0]))
			},
		}),
		Entry("adopt: a running container is recorded, not re-created", reconcileCase{
			sandbox:        unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning)),
			setup:          func(e *unitEnv) { e.rt.add(e.owner(), "running") },
			wantReady:      "True/Running",
			wantContainers: 1,
			wantNoCalls:    []string{"create", "start"},
			wantEvents:     []string{"Normal Running"},
		}),
		Entry("adopt: refuses to act on two containers for one Sandbox", reconcileCase{
			sandbox: unitSandbox(true),
			setup: func(e *unitEnv) {
				e.rt.add(e.owner(), "running")
				e.rt.add(e.owner(), "running")
			},
			wantReady:      "False/" + sandboxv1alpha1.SandboxReasonMultipleContainers,
			wantRequeue:    time.Minute,
			wantContainers: 2,
			wantNoCalls:    []string{"create", "start", "remove"},
			wantEvents:     []string{"Warning " + sandboxv1alpha1.SandboxReasonMultipleContainers},
		}),
		Entry("missing container: reported, and re-created only after the backoff", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning), func(s *sandboxv1alpha1.Sandbox) {
				s.Status.ContainerID = "0123456789abcdef"
			}),
			wantReady:   "False/" + sandboxv1alpha1.SandboxReasonContainerMissing,
			wantRequeue: unitBase,
			wantNoCalls: []string{"create"},
			wantEvents:  []string{"Warning " + sandboxv1alpha1.SandboxReasonContainerMissing},
			check: func(_ *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(sbx.Status.ContainerID).To(BeEmpty())
			},
		}),
		Entry("exited container: reported with its exit code, not restarted", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning)),
			setup: func(e *unitEnv) {
				id := e.rt.add(e.owner(), "exited")
				e.rt.setState(id, dockerruntime.ContainerState{Status: "exited", ExitCode: 3})
			},
			wantReady:      "False/" + sandboxv1alpha1.SandboxReasonContainerExited,
			wantContainers: 1,
			wantNoCalls:    []string{"create", "start"},
			wantEvents:     []string{"Warning " + sandboxv1alpha1.SandboxReasonContainerExited},
			check: func(_ *unitEnv, sbx *sandboxv1alpha1.Sandbox) {
				Expect(meta.FindStatusCondition(sbx.Status.Conditions, "Ready").Message).To(Equal("container exited with code 3"))
			},
		}),
		Entry("OOM-killed container: reported with the memory limit", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning)),
			setup: func(e *unitEnv) {
				id := e.rt.add(e.owner(), "exited")
				e.rt.setState(id, dockerruntime.ContainerState{Status: "exited", ExitCode: 137, OOMKilled: true})
			},
			wantReady:      "False/" + sandboxv1alpha1.SandboxReasonOOMKilled,
			wantContainers: 1,
			wantEvents:     []string{"Warning " + sandboxv1alpha1.SandboxReasonOOMKilled},
		}),
		Entry("Docker unavailable: reported, and the error returned for the controller's backoff", reconcileCase{
			sandbox:    unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning)),
			setup:      func(e *unitEnv) { e.rt.setDown(true) },
			wantErr:    dockerruntime.ErrUnavailable,
			wantReady:  "False/" + sandboxv1alpha1.SandboxReasonDockerUnavailable,
			wantEvents: []string{"Warning " + sandboxv1alpha1.SandboxReasonDockerUnavailable},
		}),
		Entry("unchanged status: no write and no Event", reconcileCase{
			sandbox: unitSandbox(true, withReady(metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning)),
			setup: func(e *unitEnv) {
				// Settle first, then count the writes of a second reconcile.
				e.rt.add(e.owner(), "running")
				e.mustReconcile()
				e.events()
				e.failStatus = errors.New("no status write expected")
			},
			wantReady:      "True/Running",
			wantContainers: 1,
		}),
	)

	It("expiry: removes the container when the lifetime has passed on the (fake) clock, and says so once", func() {
		e := newUnitEnv(unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) { s.Spec.ActiveDeadlineSeconds = ptr.To[int64](60) }))
		res := e.mustReconcile()
		Expect(ready(e.get())).To(Equal("True/Running"))
		Expect(res.RequeueAfter).To(Equal(60*time.Second), "the next look is at expiry")
		Expect(e.events()).To(Equal([]string{"Normal Running"}))

		e.clk.Step(30 * time.Second)
		res = e.mustReconcile()
		Expect(res.RequeueAfter).To(BeNumerically("~", 30*time.Second, time.Second))
		Expect(e.rt.ids(unitUID)).To(HaveLen(1), "not yet")

		e.clk.Step(31 * time.Second)
		e.mustReconcile()
		sbx := e.get()
		Expect(ready(sbx)).To(Equal("False/" + sandboxv1alpha1.SandboxReasonExpired))
		Expect(meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired))).To(BeTrue())
		Expect(sbx.Status.ContainerID).To(BeEmpty())
		Expect(e.rt.ids(unitUID)).To(BeEmpty())
		Expect(e.rt.callsWith("remove ")).To(ConsistOf(HaveSuffix(" " + unitGrace.String())))
		Expect(e.events()).To(Equal([]string{"Warning " + sandboxv1alpha1.SandboxReasonExpired}))

		// Expired is final: nothing is created again, nothing more is said.
		e.clk.Step(time.Hour)
		e.mustReconcile()
		Expect(e.rt.callsWith("create ")).To(HaveLen(1))
		Expect(e.events()).To(BeEmpty())
	})

	It("missing container: re-created once the backoff has passed on the (fake) clock", func() {
		e := newUnitEnv(unitSandbox(true))
		e.mustReconcile()
		first := e.rt.ids(unitUID)
		Expect(first).To(HaveLen(1))
		Expect(e.rt.Remove(context.Background(), first[0], 0)).To(Succeed()) // behind our back

		res := e.mustReconcile()
		Expect(ready(e.get())).To(Equal("False/" + sandboxv1alpha1.SandboxReasonContainerMissing))
		Expect(res.RequeueAfter).To(Equal(unitBase))
		res = e.mustReconcile()
		Expect(res.RequeueAfter).To(Equal(unitBase), "still waiting")
		Expect(e.rt.callsWith("create ")).To(HaveLen(1))

		e.clk.Step(unitBase)
		e.mustReconcile()
		Expect(e.rt.callsWith("create ")).To(HaveLen(2))
		Expect(ready(e.get())).To(Equal("True/Running"))
		Expect(e.events()).To(Equal([]string{"Normal Running", "Warning ContainerMissing", "Normal Running"}))
	})

	It("deletion: removes the container with the grace period, then the history, then the finalizer", func() {
		e := newUnitEnv(unitSandbox(true))
		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(HaveLen(1))
		e.events()
		Expect(e.c.Delete(context.Background(), e.get())).To(Succeed())

		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(BeEmpty())
		Expect(e.rt.callsWith("remove ")).To(ConsistOf(HaveSuffix(" " + unitGrace.String())))
		Expect(e.history.keys()).To(Equal([]string{unitUID}))
		err := e.c.Get(context.Background(), unitKey, &sandboxv1alpha1.Sandbox{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the finalizer was dropped: %v", err)
		Expect(e.events()).To(Equal([]string{"Normal ContainerRemoved"}))
	})

	It("deletion with Docker unavailable: keeps the finalizer and says why until Docker is back", func() {
		e := newUnitEnv(unitSandbox(true))
		e.mustReconcile()
		e.events()
		Expect(e.c.Delete(context.Background(), e.get())).To(Succeed())
		e.rt.setDown(true)

		_, err := e.reconcile()
		Expect(err).To(MatchError(dockerruntime.ErrUnavailable))
		sbx := e.get()
		Expect(sbx.Finalizers).To(ConsistOf(Finalizer))
		Expect(ready(sbx)).To(Equal("False/" + sandboxv1alpha1.SandboxReasonDockerUnavailable))
		Expect(e.history.keys()).To(BeEmpty(), "history goes only with the container")
		Expect(e.events()).To(Equal([]string{"Warning " + sandboxv1alpha1.SandboxReasonDockerUnavailable}))

		e.rt.setDown(false)
		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(BeEmpty())
		Expect(apierrors.IsNotFound(e.c.Get(context.Background(), unitKey, &sandboxv1alpha1.Sandbox{}))).To(BeTrue())
	})

	It("NodeLost (the node came back): removes the container, recreates none, writes no status, and finalizes a deletion", func() {
		e := newUnitEnv(unitSandbox(true))
		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(HaveLen(1))
		e.events()
		// What the control plane wrote while this node was away.
		sbx := e.get()
		meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SandboxConditionReady),
			Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonNodeLost, Message: "node node-a is lost"})
		Expect(e.c.Status().Update(context.Background(), sbx)).To(Succeed())
		// The status policy refuses any change of a NodeLost status.
		e.failStatus = errors.New("no status write expected on a NodeLost Sandbox")

		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(BeEmpty())
		Expect(ready(e.get())).To(Equal("False/" + sandboxv1alpha1.SandboxReasonNodeLost))
		e.clk.Step(time.Hour)
		e.mustReconcile()
		Expect(e.rt.callsWith("create ")).To(HaveLen(1), "terminal: never provisioned again")
		Expect(e.events()).To(BeEmpty())

		Expect(e.c.Delete(context.Background(), e.get())).To(Succeed())
		e.mustReconcile()
		Expect(apierrors.IsNotFound(e.c.Get(context.Background(), unitKey, &sandboxv1alpha1.Sandbox{}))).To(BeTrue())
		Expect(e.history.keys()).To(Equal([]string{unitUID}))
	})

	It("NodeLost with Docker unavailable: returns the error, keeps the finalizer, writes no status", func() {
		e := newUnitEnv(unitSandbox(true, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonNodeLost)))
		e.rt.add(e.owner(), "running")
		e.rt.setDown(true)
		e.failStatus = errors.New("no status write expected on a NodeLost Sandbox")
		Expect(e.c.Delete(context.Background(), e.get())).To(Succeed())
		_, err := e.reconcile()
		Expect(err).To(MatchError(dockerruntime.ErrUnavailable))
		Expect(e.get().Finalizers).To(ConsistOf(Finalizer))
		e.rt.setDown(false)
		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(BeEmpty())
		Expect(apierrors.IsNotFound(e.c.Get(context.Background(), unitKey, &sandboxv1alpha1.Sandbox{}))).To(BeTrue())
	})

	It("a vanished Sandbox (finalizer stripped): its container goes at once, without grace", func() {
		e := newUnitEnv()
		id := e.rt.add(e.owner(), "running")
		other := e.rt.add(dockerruntime.Owner{UID: "uid-2", Namespace: "ns", Name: "other", Node: unitNode}, "running")
		e.mustReconcile()
		Expect(e.rt.ids(unitUID)).To(BeEmpty())
		Expect(e.rt.callsWith("remove ")).To(Equal([]string{"remove " + id + " 0s"}))
		Expect(e.rt.ids("uid-2")).To(Equal([]string{other}), "another Sandbox's container stays")
	})

	Describe("Events follow the status write", func() {
		conflict := apierrors.NewConflict(schema.GroupResource{Group: sandboxv1alpha1.GroupVersion.Group, Resource: "sandboxes"}, unitKey.Name, errors.New("stale"))

		DescribeTable("a failed status write emits no Event",
			func(sbx *sandboxv1alpha1.Sandbox, setup func(*unitEnv), writeErr error, wantErr bool) {
				e := newUnitEnv(sbx)
				if setup != nil {
					setup(e)
				}
				e.failStatus = writeErr
				_, err := e.reconcile()
				if wantErr {
					Expect(err).To(MatchError(writeErr))
				} else {
					Expect(err).NotTo(HaveOccurred())
				}
				Expect(e.events()).To(BeEmpty(), "an Event announced a status the API server does not hold")
				Expect(ready(e.get())).To(Equal(ready(sbx)), "nothing was stored")

				// The retry, with a working API server, stores and then tells.
				e.failStatus = nil
				_, _ = e.reconcile()
				Expect(e.events()).NotTo(BeEmpty())
			},
			Entry("Running, on an API server error", unitSandbox(true), nil, errors.New("etcd is down"), true),
			Entry("Running, on a conflict", unitSandbox(true), nil, conflict, false),
			Entry("DockerUnavailable", unitSandbox(true), func(e *unitEnv) { e.rt.setDown(true) }, errors.New("etcd is down"), true),
			Entry("Claimed", unitSandbox(false), nil, errors.New("etcd is down"), true),
			Entry("DockerUnavailable while finalizing", unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) {
				s.DeletionTimestamp = ptr.To(metav1.Now())
			}), func(e *unitEnv) { e.rt.setDown(true) }, errors.New("etcd is down"), true),
		)
	})
})
