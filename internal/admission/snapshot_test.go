/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
)

// The claim check's decisions that need no API server: which status updates
// it passes without reading anything, and what it refuses before decoding.
// The claims themselves are specified against envtest's kube-apiserver in
// controllers/sandboxquota (snapshot_claim_test.go).
var _ = Describe("SnapshotValidator on status updates", func() {
	var (
		reads int
		v     *admission.SnapshotValidator
	)
	BeforeEach(func() {
		reads = 0
		base := fake.NewClientBuilder().WithScheme(scheme).Build()
		counting := interceptor.NewClient(base, interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				reads++
				return errors.New("no read expected")
			},
		})
		v = admission.NewSnapshotValidator(counting, counting, scheme, clock.RealClock{})
	})
	raw := func(node string, pad int) runtime.RawExtension {
		s := &sandboxv1alpha1.SandboxSnapshot{}
		s.Namespace, s.Name = "ns", "snap"
		s.Spec.SandboxRef.Name = "src"
		s.Status.Node = node
		s.Status.ImageID = strings.Repeat("x", pad)
		data, err := json.Marshal(s)
		Expect(err).NotTo(HaveOccurred())
		return runtime.RawExtension{Raw: data}
	}
	update := func(old, cur runtime.RawExtension, nodes ...string) ctrladmission.Request {
		r := ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Update, SubResource: "status", Namespace: "ns", Name: "snap",
			Object: cur, OldObject: old,
		}}
		if nodes != nil {
			r.UserInfo = authenticationv1.UserInfo{Extra: map[string]authenticationv1.ExtraValue{admission.NodeNameExtra: nodes}}
		}
		return r
	}

	It("passes updates that keep status.node without reading anything", func() {
		for _, node := range []string{"", "a"} {
			resp := v.Handle(context.Background(), update(raw(node, 0), raw(node, 10), "b"))
			Expect(resp.Allowed).To(BeTrue(), "node %q", node)
		}
		Expect(reads).To(BeZero())
	})

	It("refuses a move or a cleared node without reading anything", func() {
		for _, to := range []string{"b", ""} {
			resp := v.Handle(context.Background(), update(raw("a", 0), raw(to, 0), "a"))
			Expect(resp.Allowed).To(BeFalse(), "to %q", to)
			Expect(resp.Result.Reason).To(BeEquivalentTo("Forbidden"))
			Expect(resp.Result.Message).To(ContainSubstring("SandboxSnapshot ns/snap is held by node a"))
			Expect(resp.Result.Details.Causes).To(ConsistOf(HaveField("Field", "status.node")))
		}
		Expect(reads).To(BeZero())
	})

	It("reads the source on a claim, and fails (500, not allowed) when it cannot", func() {
		resp := v.Handle(context.Background(), update(raw("", 0), raw("a", 0), "a"))
		Expect(reads).To(Equal(1))
		Expect(resp.Allowed).To(BeFalse())
		Expect(resp.Result.Code).To(BeEquivalentTo(500))
		Expect(resp.Result.Message).To(ContainSubstring("reading the source Sandbox src of SandboxSnapshot ns/snap"))
	})

	It("refuses an oversized or undecodable object before reading anything", func() {
		resp := v.Handle(context.Background(), update(raw("", 0), raw("a", 2<<20), "a"))
		Expect(resp.Allowed).To(BeFalse())
		Expect(resp.Result.Code).To(BeEquivalentTo(400))
		Expect(resp.Result.Message).To(ContainSubstring("is over"))
		resp = v.Handle(context.Background(), update(raw("", 0), runtime.RawExtension{Raw: []byte(`{"status":`)}, "a"))
		Expect(resp.Allowed).To(BeFalse())
		Expect(resp.Result.Code).To(BeEquivalentTo(400))
		Expect(resp.Result.Reason).To(BeEquivalentTo("BadRequest"))
		Expect(reads).To(BeZero())
	})
})
