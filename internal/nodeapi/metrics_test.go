/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/cgroupcpu"
)

var _ = Describe("Node API metrics", func() {
	getMetrics := func(ts *testServer, ns, name string) (int, subresource.Metrics, []byte) {
		GinkgoHelper()
		resp := ts.do(request{method: http.MethodGet, namespace: ns, name: name, subresource: subresource.SubresourceMetrics})
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		var m subresource.Metrics
		if resp.StatusCode == http.StatusOK {
			Expect(resp.Header.Get("Content-Type")).To(Equal("application/json"))
			Expect(json.Unmarshal(body, &m)).To(Succeed(), string(body))
		}
		return resp.StatusCode, m, body
	}

	It("shows a CPU-bound loop near its CPU limit, with the Sandbox's limits", func() {
		ns := newNamespace()
		busy := waitReady(createSandbox(ns, uniqueName("busy"), func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sh", "-c", "while :; do :; done"}
			s.Spec.Resources.CPU = ptr.To(resource.MustParse("500m"))
			s.Spec.Resources.Memory = ptr.To(resource.MustParse("96Mi"))
		}))
		var m subresource.Metrics
		// On a busy host the loop gets less than its limit: then the
		// figure must track what the cgroup really used.
		Eventually(func(g Gomega) {
			var code int
			var body []byte
			truth, known := cgroupcpu.During(busy.Status.ContainerID, func() { code, m, body = getMetrics(api, ns, busy.Name) })
			g.Expect(code).To(Equal(http.StatusOK), string(body))
			g.Expect(cgroupcpu.NearLimit(m.CPU.Cores, 0.5, truth, known)).To(Succeed())
		}, 20*time.Second, 200*time.Millisecond).Should(Succeed())
		Expect(m.Version).To(Equal(subresource.MetricsVersion))
		Expect(m.Namespace).To(Equal(ns))
		Expect(m.Name).To(Equal(busy.Name))
		Expect(m.Node).To(Equal(nodeName))
		Expect(m.CPU.LimitCores).To(BeNumerically("~", 0.5, 0.001))
		Expect(m.CPU.PercentOfLimit).To(BeNumerically("~", 100*m.CPU.Cores/0.5, 0.5))
		Expect(m.Memory.Limit).To(Equal(int64(96 << 20)))
		Expect(m.Pids.Used).To(BeNumerically(">=", 1))
		Expect(m.Pids.Limit).To(BeNumerically(">", 0))
		Expect(m.Disk.Paths).To(HaveLen(3))
		Expect(m.Network).To(BeNil(), "a Sandbox without Egress has no network figures")
	})

	It("reads a paused Sandbox without waking it, and the reading is no activity", func() {
		ns := newNamespace()
		paused := waitReady(createSandbox(ns, uniqueName("paused")))
		setPausedSpec(paused, true)
		Eventually(readyReason(paused), 30*time.Second).Should(Equal("False/Paused"))
		code, m, body := getMetrics(api, ns, paused.Name)
		Expect(code).To(Equal(http.StatusOK), string(body))
		Expect(m.Paused).To(BeTrue())
		Expect(m.CPU.Cores).To(BeNumerically("<", 0.05))
		Expect(m.Memory.Used).To(BeNumerically(">", 0))
		ct, err := docker.Inspect(context.Background(), paused.Status.ContainerID)
		Expect(err).NotTo(HaveOccurred())
		Expect(ct.State.Paused).To(BeTrue(), "reading metrics must not unpause")
		Consistently(func() *metav1.Time { return getSandbox(paused).Status.LastActivityTime }, 2*time.Second, 200*time.Millisecond).
			Should(BeNil(), "reading metrics is not activity")
	})

	It("refuses another container than the Sandbox's own, bad names and methods, with typed errors", func() {
		ns := newNamespace()
		ghostNode := testNodePrefix + "ghost-metrics"
		ghost := newTestServer(serverOptions{node: ghostNode, runtime: docker, reader: k8sClient}).start()
		real := waitReady(createSandbox(ns, uniqueName("real")))
		forged := createSandbox(ns, uniqueName("forged"), func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = ghostNode })
		setStatus(forged, ghostNode, real.Status.ContainerID)
		code, _, body := getMetrics(ghost, ns, forged.Name)
		Expect(code).To(Equal(http.StatusConflict), string(body))
		Expect(string(body)).To(ContainSubstring("not the sandbox's own container"))

		for _, name := range []string{"UPPER", "a..b", "dot.", "x%2Fy"} {
			resp := api.do(request{method: http.MethodGet, namespace: ns, name: name, subresource: subresource.SubresourceMetrics})
			Expect(resp.StatusCode).To(BeElementOf(http.StatusBadRequest, http.StatusNotFound), name)
			st := statusOf(resp)
			Expect(st.Kind).To(Equal("Status"))
		}
		resp := api.do(request{method: http.MethodPost, namespace: ns, name: real.Name, subresource: subresource.SubresourceMetrics})
		Expect(resp.StatusCode).To(Equal(http.StatusMethodNotAllowed))
		Expect(statusOf(resp).Message).To(ContainSubstring("GET"))
		resp = api.do(request{method: http.MethodGet, namespace: ns, name: "missing", subresource: subresource.SubresourceMetrics})
		Expect(resp.StatusCode).To(Equal(http.StatusNotFound))
		resp.Body.Close()
	})
})
