/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gomegatypes "github.com/onsi/gomega/types"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

const ns = "team"

var (
	scheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		utilMust(clientgoscheme.AddToScheme(s))
		utilMust(sandboxv1alpha1.AddToScheme(s))
		return s
	}()
	// Whole seconds: reservation times go through JSON in the fake client.
	now = time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	// The usage of a Sandbox that sets no resources.
	defaultUsage = sandboxv1alpha1.SandboxQuotaUsage{Sandboxes: 1, CPU: resource.MustParse("1"), Memory: resource.MustParse("512Mi"), Disk: resource.MustParse("256Mi")}
	errBoom      = errors.New("boom")
	quotaGR      = schema.GroupResource{Group: sandboxv1alpha1.GroupVersion.Group, Resource: "sandboxquotas"}
)

func utilMust(err error) {
	if err != nil {
		panic(err)
	}
}

// newQuota is a counted quota (observedGeneration 1) with hard limits and
// current usage.
func newQuota(name string, hard sandboxv1alpha1.SandboxQuotaHard, used sandboxv1alpha1.SandboxQuotaUsage) *sandboxv1alpha1.SandboxQuota {
	return &sandboxv1alpha1.SandboxQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1},
		Spec:       sandboxv1alpha1.SandboxQuotaSpec{Hard: hard},
		Status:     sandboxv1alpha1.SandboxQuotaStatus{Used: used, ObservedGeneration: 1},
	}
}

func usedN(n int64) sandboxv1alpha1.SandboxQuotaUsage {
	return sandboxv1alpha1.SandboxQuotaUsage{Sandboxes: n,
		CPU: *resource.NewQuantity(n, resource.DecimalSI), Memory: *resource.NewQuantity(n*512<<20, resource.BinarySI), Disk: *resource.NewQuantity(n*256<<20, resource.BinarySI)}
}

func newSandbox(name, uid string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: "busybox:1"},
	}
}

func raw(obj any) runtime.RawExtension {
	GinkgoHelper()
	b, err := json.Marshal(obj)
	Expect(err).NotTo(HaveOccurred())
	return runtime.RawExtension{Raw: b}
}

func createRequest(sbx *sandboxv1alpha1.Sandbox, dryRun bool) ctrladmission.Request {
	GinkgoHelper()
	return ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req-" + types.UID(sbx.Name), Operation: admissionv1.Create, Namespace: ns, Name: sbx.Name,
		Object: raw(sbx), DryRun: &dryRun,
	}}
}

func updateRequest(old, sbx *sandboxv1alpha1.Sandbox) ctrladmission.Request {
	GinkgoHelper()
	return ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req-update", Operation: admissionv1.Update, Namespace: ns, Name: sbx.Name,
		Object: raw(sbx), OldObject: raw(old), DryRun: ptr.To(false),
	}}
}

// env is a fake API server: base holds the objects; the validator reads
// through reader and writes through writer, both of which may intercept.
type env struct {
	base      client.WithWatch
	validator *admission.SandboxValidator
	// statusUpdates counts the validator's writes to quota status.
	statusUpdates atomic.Int32
	lists         atomic.Int32
}

type envOptions struct {
	listErr      error
	statusUpdate func(ctx context.Context, e *env, c client.Client, obj client.Object, opts ...client.SubResourceUpdateOption) error
}

func newEnv(opts envOptions, objs ...client.Object) *env {
	e := &env{}
	e.base = fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&sandboxv1alpha1.SandboxQuota{}).
		WithObjects(objs...).Build()
	reader := interceptor.NewClient(e.base, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, o ...client.ListOption) error {
			e.lists.Add(1)
			if opts.listErr != nil {
				return opts.listErr
			}
			return c.List(ctx, list, o...)
		},
	})
	writer := interceptor.NewClient(e.base, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, o ...client.SubResourceUpdateOption) error {
			Expect(sub).To(Equal("status"))
			e.statusUpdates.Add(1)
			if opts.statusUpdate != nil {
				return opts.statusUpdate(ctx, e, c, obj, o...)
			}
			return c.Status().Update(ctx, obj, o...)
		},
	})
	e.validator = admission.NewSandboxValidator(reader, writer, scheme, clocktesting.NewFakePassiveClock(now))
	return e
}

func (e *env) quota(name string) *sandboxv1alpha1.SandboxQuota {
	GinkgoHelper()
	q := &sandboxv1alpha1.SandboxQuota{}
	Expect(e.base.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, q)).To(Succeed())
	return q
}

func reservationUIDs(q *sandboxv1alpha1.SandboxQuota) []types.UID {
	out := []types.UID{}
	for _, r := range q.Status.Reservations {
		out = append(out, r.UID)
	}
	return out
}

func expectAllowed(resp ctrladmission.Response) {
	GinkgoHelper()
	Expect(resp.Allowed).To(BeTrue(), "refused: %+v", resp.Result)
}

// expectDenied checks a refusal: 403 Forbidden, the message word for word,
// and details that name the Sandbox's resource with one cause per refusal,
// whose messages make up the message. It returns the causes' types.
func expectDenied(resp ctrladmission.Response, message string) []metav1.CauseType {
	GinkgoHelper()
	Expect(resp.Allowed).To(BeFalse())
	Expect(resp.Result).NotTo(BeNil())
	Expect(resp.Result.Code).To(Equal(int32(http.StatusForbidden)))
	Expect(resp.Result.Reason).To(Equal(metav1.StatusReasonForbidden))
	Expect(resp.Result.Message).To(Equal(message))
	Expect(resp.Result.Details).NotTo(BeNil())
	Expect(resp.Result.Details.Group).To(Equal(subresource.StatusGroup))
	Expect(resp.Result.Details.Kind).To(Equal(subresource.StatusKind))
	var msgs []string
	var types []metav1.CauseType
	for _, c := range resp.Result.Details.Causes {
		msgs = append(msgs, c.Message)
		types = append(types, c.Type)
	}
	Expect(strings.Join(msgs, "; ")).To(Equal(message))
	return types
}

func expectErrored(resp ctrladmission.Response, code int32, message gomegatypes.GomegaMatcher) {
	GinkgoHelper()
	Expect(resp.Allowed).To(BeFalse())
	Expect(resp.Result).NotTo(BeNil())
	Expect(resp.Result.Code).To(Equal(code))
	Expect(resp.Result.Message).To(message)
}

// expectUncharged checks that the quota is as it was created.
func expectUncharged(e *env, name string, used sandboxv1alpha1.SandboxQuotaUsage) {
	GinkgoHelper()
	q := e.quota(name)
	Expect(q.Status.Reservations).To(BeEmpty())
	Expect(quota.Equal(q.Status.Used, used)).To(BeTrue(), "used %+v, want %+v", q.Status.Used, used)
}

var _ = Describe("SandboxValidator", func() {
	ctx := context.Background()
	limit := func(n int64) sandboxv1alpha1.SandboxQuotaHard {
		return sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To(n)}
	}

	Describe("create", func() {
		It("admits a Sandbox when the namespace has no quota", func() {
			e := newEnv(envOptions{})
			expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)))
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		It("ignores quotas in other namespaces", func() {
			other := newQuota("elsewhere", limit(0), quota.Zero())
			other.Namespace = "other"
			e := newEnv(envOptions{}, other)
			expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)))
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		It("charges a Sandbox that fits and records a reservation", func() {
			hard := sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](3), CPU: resource.NewQuantity(4, resource.DecimalSI)}
			e := newEnv(envOptions{}, newQuota("q", hard, usedN(1)))
			sbx := newSandbox("sbx", "uid-1")
			sbx.Spec.Resources.CPU = ptr.To(resource.MustParse("500m"))

			expectAllowed(e.validator.Handle(ctx, createRequest(sbx, false)))

			q := e.quota("q")
			Expect(q.Status.Used.Sandboxes).To(Equal(int64(2)))
			Expect(q.Status.Used.CPU.String()).To(Equal("1500m"))
			Expect(q.Status.Used.Memory.String()).To(Equal("1Gi"))
			Expect(q.Status.Used.Disk.String()).To(Equal("512Mi"))
			Expect(q.Status.Summary).To(Equal("sandboxes: 2/3, cpu: 1500m/4"))
			Expect(q.Status.Reservations).To(HaveLen(1))
			r := q.Status.Reservations[0]
			Expect(r.Name).To(Equal("sbx"))
			Expect(r.UID).To(Equal(types.UID("uid-1")))
			Expect(r.Time.Time.Equal(now)).To(BeTrue(), "reservation time %v", r.Time)
			Expect(r.Usage.CPU.String()).To(Equal("500m"))
			Expect(quota.Equal(r.Usage, sandboxv1alpha1.SandboxQuotaUsage{Sandboxes: 1, CPU: resource.MustParse("500m"),
				Memory: resource.MustParse("512Mi"), Disk: resource.MustParse("256Mi")})).To(BeTrue())
		})

		It("charges every quota in the namespace", func() {
			e := newEnv(envOptions{}, newQuota("a", limit(5), quota.Zero()), newQuota("b", sandboxv1alpha1.SandboxQuotaHard{}, usedN(2)))
			expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)))
			Expect(reservationUIDs(e.quota("a"))).To(Equal([]types.UID{"uid-1"}))
			Expect(reservationUIDs(e.quota("b"))).To(Equal([]types.UID{"uid-1"}))
			Expect(e.quota("b").Status.Used.Sandboxes).To(Equal(int64(3)))
		})

		It("takes the name and namespace from the request when the object lacks them", func() {
			// A full quota elsewhere: an empty namespace must not list every namespace's quotas.
			elsewhere := newQuota("elsewhere", limit(0), quota.Zero())
			elsewhere.Namespace = "other"
			e := newEnv(envOptions{}, newQuota("q", limit(5), quota.Zero()), elsewhere)
			sbx := newSandbox("", "uid-1")
			sbx.Namespace = ""
			req := createRequest(sbx, false)
			req.Name = "from-request"
			expectAllowed(e.validator.Handle(ctx, req))
			q := e.quota("q")
			Expect(q.Status.Reservations).To(HaveLen(1))
			Expect(q.Status.Reservations[0].Name).To(Equal("from-request"))
		})

		It("refuses while a quota has not counted its usage yet", func() {
			q := newQuota("fresh", limit(100), quota.Zero())
			q.Status.ObservedGeneration = 0
			e := newEnv(envOptions{}, q)
			Expect(expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
				`sandbox quota "fresh" has not counted its usage yet; retry in a few seconds`)).To(Equal([]metav1.CauseType{subresource.CauseQuotaNotCounted}))
			expectUncharged(e, "fresh", quota.Zero())
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		It("refuses a Sandbox that does not fit, saying why", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)))
			Expect(expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
				`sandbox quota "q" exceeded: sandboxes: requested 1, used 2, limit 2 (1 over)`)).To(Equal([]metav1.CauseType{subresource.CauseQuotaExceeded}))
			expectUncharged(e, "q", usedN(2))
		})

		It("refuses a Sandbox once the quota records MaxReservations, however much room is left", func() {
			// A flood of creates (or of forged admission requests) must not
			// grow the quota's status toward etcd's object size limit.
			q := newQuota("q", limit(100000), usedN(admission.MaxReservations))
			for i := range admission.MaxReservations {
				q.Status.Reservations = append(q.Status.Reservations, sandboxv1alpha1.SandboxQuotaReservation{
					Name: fmt.Sprintf("s%d", i), UID: types.UID(fmt.Sprintf("r%d", i)), Time: metav1.NewTime(now), Usage: usedN(1)})
			}
			e := newEnv(envOptions{}, q)
			resp := e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false))
			Expect(expectDenied(resp, fmt.Sprintf(`sandbox quota "q" has %d Sandboxes admitted but not yet counted, the most it records; retry in a few seconds`,
				admission.MaxReservations))).To(Equal([]metav1.CauseType{subresource.CauseQuotaExceeded}))
			Expect(resp.Result.Details.Causes[0].Field).To(Equal("status.reservations"))
			Expect(e.quota("q").Status.Reservations).To(HaveLen(admission.MaxReservations))
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		It("refuses what the rules forbid without charging, even when it would fit", func() {
			q := newQuota("q", limit(10), quota.Zero())
			q.Spec.AllowedImages = []string{"ghcr.io/acme/*"}
			e := newEnv(envOptions{}, q)
			Expect(expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
				`sandbox quota "q" does not allow image "busybox:1" (docker.io/library/busybox:1); allowed images: ghcr.io/acme/*`)).To(Equal([]metav1.CauseType{subresource.CauseQuotaRule}))
			expectUncharged(e, "q", quota.Zero())
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		It("reports the rules of every quota together", func() {
			a := newQuota("a", limit(10), quota.Zero())
			a.Spec.MaxActiveDeadlineSeconds = ptr.To[int64](60)
			b := newQuota("b", limit(10), quota.Zero())
			e := newEnv(envOptions{}, a, b)
			sbx := newSandbox("sbx", "uid-1")
			sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
			resp := e.validator.Handle(ctx, createRequest(sbx, false))
			Expect(expectDenied(resp,
				`sandbox quota "a" does not allow network mode Egress (its allowEgress is false); use network mode None; `+
					`sandbox quota "a" requires spec.activeDeadlineSeconds of at most 60; the Sandbox sets none; `+
					`sandbox quota "b" does not allow network mode Egress (its allowEgress is false); use network mode None`)).
				To(Equal([]metav1.CauseType{subresource.CauseQuotaRule, subresource.CauseQuotaRule, subresource.CauseQuotaRule}))
			// The lifetime rule names its field, so a client can say what to change.
			Expect(resp.Result.Details.Causes[0].Field).To(BeEmpty())
			Expect(resp.Result.Details.Causes[1].Field).To(Equal("spec.activeDeadlineSeconds"))
			Expect(resp.Result.Details.Name).To(Equal("sbx"))
		})

		It("rejects a request without a UID as a bad request, charging nothing", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(10), quota.Zero()))
			expectErrored(e.validator.Handle(ctx, createRequest(newSandbox("sbx", ""), false)),
				http.StatusBadRequest, Equal("the Sandbox in the admission request has no metadata.uid"))
			expectUncharged(e, "q", quota.Zero())
			Expect(e.lists.Load()).To(BeZero())
		})

		DescribeTable("rejects an undecodable object as a bad request",
			func(obj []byte) {
				e := newEnv(envOptions{listErr: errBoom}, newQuota("q", limit(10), quota.Zero()))
				req := createRequest(newSandbox("sbx", "uid-1"), false)
				req.Object = runtime.RawExtension{Raw: obj}
				expectErrored(e.validator.Handle(ctx, req), http.StatusBadRequest, HavePrefix("decoding the Sandbox: "))
				expectUncharged(e, "q", quota.Zero())
				Expect(e.lists.Load()).To(BeZero())
			},
			Entry("not JSON", []byte(`{"apiVersion":`)),
			Entry("empty", nil),
			Entry("wrong field type", []byte(`{"apiVersion":"sandbox.code-sandbox.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"x","uid":"u"},"spec":{"image":7}}`)),
		)

		It("answers 500 naming the namespace when the quotas cannot be listed", func() {
			e := newEnv(envOptions{listErr: errBoom})
			expectErrored(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
				http.StatusInternalServerError, Equal("listing the SandboxQuotas in namespace team: boom"))
		})

		It("charges once when the same request is handled again", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(5), quota.Zero()))
			sbx := newSandbox("sbx", "uid-1")
			for i := 0; i < 3; i++ {
				expectAllowed(e.validator.Handle(ctx, createRequest(sbx, false)))
			}
			q := e.quota("q")
			Expect(reservationUIDs(q)).To(Equal([]types.UID{"uid-1"}))
			Expect(quota.Equal(q.Status.Used, usedN(1))).To(BeTrue(), "used %+v", q.Status.Used)
			Expect(e.statusUpdates.Load()).To(Equal(int32(1)))
		})

		It("admits a retried request even when its own charge filled the quota", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(1), quota.Zero()))
			sbx := newSandbox("sbx", "uid-1")
			expectAllowed(e.validator.Handle(ctx, createRequest(sbx, false)))
			expectAllowed(e.validator.Handle(ctx, createRequest(sbx, false)))
			// Someone else is refused.
			expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("other", "uid-2"), false)),
				`sandbox quota "q" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`)
			Expect(reservationUIDs(e.quota("q"))).To(Equal([]types.UID{"uid-1"}))
		})

		Describe("dry run", func() {
			It("checks without charging", func() {
				e := newEnv(envOptions{}, newQuota("q", limit(1), quota.Zero()))
				expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), true)))
				expectUncharged(e, "q", quota.Zero())
				Expect(e.statusUpdates.Load()).To(BeZero())
			})

			It("still refuses what does not fit", func() {
				e := newEnv(envOptions{}, newQuota("q", limit(1), usedN(1)))
				expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), true)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`)
			})

			It("does not undo other quotas' charges it never made", func() {
				e := newEnv(envOptions{}, newQuota("a", limit(5), quota.Zero()), newQuota("b", limit(0), quota.Zero()))
				expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), true)),
					`sandbox quota "b" exceeded: sandboxes: requested 1, used 0, limit 0 (1 over)`)
				Expect(e.statusUpdates.Load()).To(BeZero())
			})
		})

		Describe("conflicts", func() {
			It("retries a conflicting write and charges exactly once", func() {
				e := newEnv(envOptions{statusUpdate: func(ctx context.Context, e *env, c client.Client, obj client.Object, o ...client.SubResourceUpdateOption) error {
					if e.statusUpdates.Load() == 1 {
						return apierrors.NewConflict(quotaGR, obj.GetName(), errors.New("the object has been modified"))
					}
					return c.Status().Update(ctx, obj, o...)
				}}, newQuota("q", limit(5), usedN(1)))
				expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)))
				Expect(e.statusUpdates.Load()).To(Equal(int32(2)))
				q := e.quota("q")
				Expect(reservationUIDs(q)).To(Equal([]types.UID{"uid-1"}))
				Expect(quota.Equal(q.Status.Used, usedN(2))).To(BeTrue(), "used %+v", q.Status.Used)
			})

			// Another replica charges first; the write here then conflicts for
			// real (stale resourceVersion) and is re-checked against it.
			raceWith := func(other string) func(ctx context.Context, e *env, c client.Client, obj client.Object, o ...client.SubResourceUpdateOption) error {
				return func(ctx context.Context, e *env, c client.Client, obj client.Object, o ...client.SubResourceUpdateOption) error {
					if e.statusUpdates.Load() == 1 {
						fresh := &sandboxv1alpha1.SandboxQuota{}
						Expect(e.base.Get(ctx, client.ObjectKeyFromObject(obj), fresh)).To(Succeed())
						fresh.Status.Used = quota.Add(fresh.Status.Used, defaultUsage)
						fresh.Status.Reservations = append(fresh.Status.Reservations, sandboxv1alpha1.SandboxQuotaReservation{
							Name: other, UID: types.UID(other), Time: metav1.NewTime(now), Usage: defaultUsage})
						Expect(e.base.Status().Update(ctx, fresh)).To(Succeed())
					}
					return c.Status().Update(ctx, obj, o...)
				}
			}

			It("re-checks against the winner's charge and refuses the last unit twice", func() {
				e := newEnv(envOptions{statusUpdate: raceWith("winner")}, newQuota("q", limit(1), quota.Zero()))
				expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`)
				q := e.quota("q")
				Expect(reservationUIDs(q)).To(Equal([]types.UID{"winner"}))
				Expect(q.Status.Used.Sandboxes).To(Equal(int64(1)))
			})

			It("keeps both charges when both fit", func() {
				e := newEnv(envOptions{statusUpdate: raceWith("winner")}, newQuota("q", limit(2), quota.Zero()))
				expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)))
				q := e.quota("q")
				Expect(reservationUIDs(q)).To(Equal([]types.UID{"winner", "uid-1"}))
				Expect(quota.Equal(q.Status.Used, usedN(2))).To(BeTrue(), "used %+v", q.Status.Used)
			})

			It("admits when the quota is deleted between the conflict and the retry", func() {
				e := newEnv(envOptions{statusUpdate: func(ctx context.Context, e *env, c client.Client, obj client.Object, o ...client.SubResourceUpdateOption) error {
					Expect(e.base.Delete(ctx, &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: obj.GetName()}})).To(Succeed())
					return apierrors.NewConflict(quotaGR, obj.GetName(), errors.New("the object has been modified"))
				}}, newQuota("q", limit(5), quota.Zero()))
				expectAllowed(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)))
				Expect(e.statusUpdates.Load()).To(Equal(int32(1)))
			})

			It("gives up with a 500 when conflicts last until the request's context ends", func() {
				runCtx, cancel := context.WithCancel(ctx)
				defer cancel()
				e := newEnv(envOptions{statusUpdate: func(ctx context.Context, e *env, c client.Client, obj client.Object, o ...client.SubResourceUpdateOption) error {
					if e.statusUpdates.Load() == 3 {
						cancel()
					}
					return apierrors.NewConflict(quotaGR, obj.GetName(), errors.New("the object has been modified"))
				}}, newQuota("q", limit(5), quota.Zero()))
				done := make(chan ctrladmission.Response, 1)
				go func() {
					defer GinkgoRecover()
					done <- e.validator.Handle(runCtx, createRequest(newSandbox("sbx", "uid-1"), false))
				}()
				var resp ctrladmission.Response
				Eventually(done).WithTimeout(5 * time.Second).Should(Receive(&resp))
				expectErrored(resp, http.StatusInternalServerError,
					Equal(`sandbox quota "q": could not record usage: gave up after 3 conflicting updates: context canceled`))
				expectUncharged(e, "q", quota.Zero())
			})
		})

		Describe("all quotas or none", func() {
			It("takes back earlier charges when a later quota refuses", func() {
				e := newEnv(envOptions{}, newQuota("a-roomy", limit(10), usedN(3)), newQuota("b-full", limit(1), usedN(1)))
				expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
					`sandbox quota "b-full" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`)
				// a-roomy was charged first (quotas are listed by name), then released.
				Expect(e.statusUpdates.Load()).To(Equal(int32(2)))
				expectUncharged(e, "a-roomy", usedN(3))
				Expect(e.quota("a-roomy").Status.Summary).To(Equal("sandboxes: 3/10"))
				expectUncharged(e, "b-full", usedN(1))
			})

			It("releases only its own reservation", func() {
				a := newQuota("a-roomy", limit(10), usedN(1))
				a.Status.Reservations = []sandboxv1alpha1.SandboxQuotaReservation{{Name: "earlier", UID: "uid-0", Time: metav1.NewTime(now), Usage: defaultUsage}}
				e := newEnv(envOptions{}, a, newQuota("b-full", limit(0), quota.Zero()))
				expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
					`sandbox quota "b-full" exceeded: sandboxes: requested 1, used 0, limit 0 (1 over)`)
				q := e.quota("a-roomy")
				Expect(reservationUIDs(q)).To(Equal([]types.UID{"uid-0"}))
				Expect(quota.Equal(q.Status.Used, usedN(1))).To(BeTrue(), "used %+v", q.Status.Used)
			})

			It("answers 500 naming the quota whose write failed, and takes back the others", func() {
				e := newEnv(envOptions{statusUpdate: func(ctx context.Context, e *env, c client.Client, obj client.Object, o ...client.SubResourceUpdateOption) error {
					if obj.GetName() == "b-broken" {
						return errors.New("etcd down")
					}
					return c.Status().Update(ctx, obj, o...)
				}}, newQuota("a-roomy", limit(10), quota.Zero()), newQuota("b-broken", limit(10), quota.Zero()))
				expectErrored(e.validator.Handle(ctx, createRequest(newSandbox("sbx", "uid-1"), false)),
					http.StatusInternalServerError, Equal(`sandbox quota "b-broken": could not record usage: etcd down`))
				expectUncharged(e, "a-roomy", quota.Zero())
				expectUncharged(e, "b-broken", quota.Zero())
			})
		})
	})

	Describe("update", func() {
		withDeadline := func(d *int64) *sandboxv1alpha1.Sandbox {
			sbx := newSandbox("sbx", "uid-1")
			sbx.Spec.ActiveDeadlineSeconds = d
			return sbx
		}

		DescribeTable("allows an unchanged deadline without reading quotas",
			func(oldD, newD *int64) {
				e := newEnv(envOptions{listErr: errBoom})
				expectAllowed(e.validator.Handle(ctx, updateRequest(withDeadline(oldD), withDeadline(newD))))
				Expect(e.lists.Load()).To(BeZero())
			},
			Entry("both unset", nil, nil),
			Entry("same value", ptr.To[int64](600), ptr.To[int64](600)),
		)

		DescribeTable("reads quotas when the deadline changes",
			func(oldD, newD *int64) {
				e := newEnv(envOptions{listErr: errBoom})
				expectErrored(e.validator.Handle(ctx, updateRequest(withDeadline(oldD), withDeadline(newD))),
					http.StatusInternalServerError, Equal("listing the SandboxQuotas in namespace team: boom"))
			},
			Entry("set", nil, ptr.To[int64](600)),
			Entry("unset", ptr.To[int64](600), nil),
			Entry("changed", ptr.To[int64](600), ptr.To[int64](601)),
		)

		It("checks a changed deadline against every quota, without charging", func() {
			a := newQuota("a", limit(10), usedN(1))
			a.Spec.MaxActiveDeadlineSeconds = ptr.To[int64](3600)
			b := newQuota("b", limit(10), usedN(1))
			b.Spec.MaxActiveDeadlineSeconds = ptr.To[int64](600)
			e := newEnv(envOptions{}, a, b)

			expectAllowed(e.validator.Handle(ctx, updateRequest(withDeadline(ptr.To[int64](300)), withDeadline(ptr.To[int64](600)))))
			expectDenied(e.validator.Handle(ctx, updateRequest(withDeadline(ptr.To[int64](300)), withDeadline(ptr.To[int64](7200)))),
				`sandbox quota "a" allows activeDeadlineSeconds of at most 3600; the Sandbox asks for 7200 (3600 over); `+
					`sandbox quota "b" allows activeDeadlineSeconds of at most 600; the Sandbox asks for 7200 (6600 over)`)
			expectDenied(e.validator.Handle(ctx, updateRequest(withDeadline(ptr.To[int64](300)), withDeadline(nil))),
				`sandbox quota "a" requires spec.activeDeadlineSeconds of at most 3600; the Sandbox sets none; `+
					`sandbox quota "b" requires spec.activeDeadlineSeconds of at most 600; the Sandbox sets none`)
			Expect(e.statusUpdates.Load()).To(BeZero())
			expectUncharged(e, "a", usedN(1))
		})

		It("does not charge or check usage on update, even over the limit", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(1), usedN(5)))
			expectAllowed(e.validator.Handle(ctx, updateRequest(withDeadline(nil), withDeadline(ptr.To[int64](60)))))
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		withEgress := func(hosts ...string) *sandboxv1alpha1.Sandbox {
			sbx := newSandbox("sbx", "uid-1")
			sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
			sbx.Spec.Network.Egress = &sandboxv1alpha1.EgressPolicy{}
			for _, h := range hosts {
				sbx.Spec.Network.Egress.Allow = append(sbx.Spec.Network.Egress.Allow, sandboxv1alpha1.EgressRule{Host: h})
			}
			return sbx
		}

		It("checks a changed egress policy against every quota, naming each host outside it", func() {
			a := newQuota("a", limit(10), usedN(1))
			a.Spec.AllowEgress = true
			a.Spec.Egress = &sandboxv1alpha1.SandboxQuotaEgress{AllowedHosts: []string{"*.example.com"}}
			b := newQuota("b", limit(10), usedN(1))
			b.Spec.AllowEgress = true
			e := newEnv(envOptions{}, a, b)

			expectAllowed(e.validator.Handle(ctx, updateRequest(withEgress("a.example.com"), withEgress("a.example.com", "*.b.example.com"))))
			resp := e.validator.Handle(ctx, updateRequest(withEgress("a.example.com"), withEgress("a.example.com", "evil.org", "example.com")))
			expectDenied(resp, `sandbox quota "a" does not allow egress to host "evil.org"; allowed hosts: *.example.com; `+
				`sandbox quota "a" does not allow egress to host "example.com"; allowed hosts: *.example.com`)
			Expect(resp.Result.Details.Causes[0].Field).To(Equal("spec.network.egress"))
			Expect(e.statusUpdates.Load()).To(BeZero())
		})

		It("does not read quotas when neither the deadline nor the policy changed", func() {
			e := newEnv(envOptions{listErr: errBoom})
			expectAllowed(e.validator.Handle(ctx, updateRequest(withEgress("a.example.com"), withEgress("a.example.com"))))
			Expect(e.lists.Load()).To(BeZero())
		})

		It("refuses an egress policy on create where the quota's list does not hold the host", func() {
			q := newQuota("a", limit(10), usedN(0))
			q.Spec.AllowEgress = true
			q.Spec.Egress = &sandboxv1alpha1.SandboxQuotaEgress{AllowedHosts: []string{"pypi.org"}}
			e := newEnv(envOptions{}, q)
			expectDenied(e.validator.Handle(ctx, createRequest(withEgress("pypi.org", "files.pythonhosted.org"), false)),
				`sandbox quota "a" does not allow egress to host "files.pythonhosted.org"; allowed hosts: pypi.org`)
			noPolicy := withEgress()
			noPolicy.Spec.Network.Egress = nil
			expectDenied(e.validator.Handle(ctx, createRequest(noPolicy, false)),
				`sandbox quota "a" requires an egress policy (spec.network.egress) for network mode Egress: unrestricted egress reaches every public host`)
			expectUncharged(e, "a", usedN(0))
		})

		It("rejects an undecodable old object as a bad request", func() {
			e := newEnv(envOptions{})
			req := updateRequest(withDeadline(nil), withDeadline(nil))
			req.OldObject = runtime.RawExtension{Raw: []byte("{")}
			expectErrored(e.validator.Handle(ctx, req), http.StatusBadRequest, HavePrefix("decoding the old Sandbox: "))
		})
	})

	It("allows other operations without reading quotas", func() {
		e := newEnv(envOptions{listErr: errBoom}, newQuota("q", limit(0), quota.Zero()))
		for _, op := range []admissionv1.Operation{admissionv1.Delete, admissionv1.Connect} {
			req := createRequest(newSandbox("sbx", "uid-1"), false)
			req.Operation = op
			expectAllowed(e.validator.Handle(ctx, req))
		}
		Expect(e.lists.Load()).To(BeZero())
	})
})

// On the wire: the AdmissionReview the webhook answers carries a Status
// whose reason and causes kube-apiserver passes on to the client.
var _ = Describe("SandboxValidator on the wire", func() {
	It("answers a refusal with a Forbidden Status naming the cause", func() {
		e := newEnv(envOptions{}, newQuota("q", sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1)}, usedN(1)))
		srv := httptest.NewServer(&ctrladmission.Webhook{Handler: e.validator})
		defer srv.Close()
		req := createRequest(newSandbox("sbx", "uid-1"), false)
		body, err := json.Marshal(&admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request:  &req.AdmissionRequest,
		})
		Expect(err).NotTo(HaveOccurred())
		resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		var review admissionv1.AdmissionReview
		Expect(json.NewDecoder(resp.Body).Decode(&review)).To(Succeed())
		Expect(review.Response).NotTo(BeNil())
		Expect(review.Response.Allowed).To(BeFalse())
		st := review.Response.Result
		Expect(st).NotTo(BeNil())
		// What kube-apiserver turns it into (its webhook errors package):
		// the same Status, the message prefixed with the webhook's name.
		st.Message = `admission webhook "sandbox-quota.code-sandbox.dev" denied the request: ` + st.Message
		err = &apierrors.StatusError{ErrStatus: *st}
		Expect(apierrors.IsForbidden(err)).To(BeTrue())
		Expect(apierrors.ReasonForError(err)).To(Equal(metav1.StatusReasonForbidden))
		Expect(subresource.HasCause(st, subresource.CauseQuotaExceeded)).To(BeTrue(), "%+v", st)
		Expect(st.Details.Name).To(Equal("sbx"))
		Expect(st.Message).To(HaveSuffix(`sandbox quota "q" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`))
	})
})
