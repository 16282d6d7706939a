//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// The in-cluster snapshot registry of config/components/snapshot-registry
// (make kind-deploy): its Service's fixed ClusterIP, and the base the
// managers are given.
const (
	snapshotRegistryDeployment = prefix + "snapshot-registry"
	snapshotRegistryBase       = "10.96.0.50:5000/sandbox-snapshots"
)

// snapshotSpecs: issue 27's "restore on any node" on the kind cluster. A
// snapshot taken on one worker goes to the in-cluster registry over TLS,
// and a Sandbox pinned to the other worker starts from it there.
func snapshotSpecs() {
	Describe("snapshots through the in-cluster registry", Ordered, Label("snapshot", "multinode"), func() {
		const ns = "cluster-snapshot"
		var reg *snapshotstore.Registry

		BeforeAll(func(ctx SpecContext) {
			if len(workers) < 2 {
				Skip(fmt.Sprintf("needs two workers, the cluster has %v (make kind-up makes two)", workers))
			}
			if out, err := kubectl(ctx, "get", "deployment", snapshotRegistryDeployment, "-n", operatorNS, "-o", "name"); err != nil || strings.TrimSpace(out) == "" {
				Skip("no in-cluster snapshot registry (make kind-deploy installs config/kind/deploy): " + out)
			}
			Expect(mustKubectl(ctx, "get", "daemonset", prefix+"controller-manager", "-n", operatorNS, "-o", "jsonpath={.spec.template.spec.containers[0].args}")).
				To(ContainSubstring("--snapshot-registry="+snapshotRegistryBase), "the kind deployment configures the managers")
			// This machine reaches the registry as the managers do: the
			// ClusterIP (routed through the control plane node), over TLS
			// with the CA the managers trust and nothing else.
			pool := x509.NewCertPool()
			Expect(pool.AppendCertsFromPEM([]byte(mustKubectl(ctx, "get", "configmap", prefix+"snapshot-registry-ca", "-n", operatorNS, "-o", `jsonpath={.data.ca\.crt}`)))).To(BeTrue())
			var err error
			reg, err = snapshotstore.NewRegistry(snapshotRegistryBase, snapshotstore.RegistryOptions{RootCAs: pool, SpoolDir: GinkgoT().TempDir()})
			Expect(err).NotTo(HaveOccurred())
			freshNamespace(ctx, ns)
		}, NodeTimeout(5*time.Minute))

		It("takes a snapshot on one worker, restores it on the other with its files, and deleting it removes its registry manifest", func(ctx SpecContext) {
			start := time.Now()
			nodeA, nodeB := workers[0], workers[1]
			Expect(kubectlApply(ctx, sandboxYAML(ns, "src", nodeA, ""))).To(Succeed())
			waitSandboxesReady(ctx, ns, 2*time.Minute, "src")
			out, err := plugin(ctx, nil, "exec", "src", "-n", ns, "--", "sh", "-c",
				"echo hello > /app/a.txt && chmod 640 /app/a.txt && mkdir -p /app/d/e && echo deep > /app/d/e/b && ln -s a.txt /app/l && echo t > /tmp/t.txt")
			Expect(err).NotTo(HaveOccurred(), out)

			Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: SandboxSnapshot
metadata:
  name: s1
  namespace: %s
spec:
  sandboxRef:
    name: src
`, ns))).To(Succeed())
			snapshotState := func(ctx context.Context) (string, error) {
				out, err := kubectl(ctx, "get", "sandboxsnapshot/s1", "-n", ns, "-o",
					`jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason}`)
				return strings.TrimSpace(out), err
			}
			Eventually(snapshotState).WithContext(ctx).WithTimeout(90*time.Second).WithPolling(time.Second).Should(Equal("True/Stored"),
				func() string { out, _ := kubectl(ctx, "get", "sandboxsnapshot/s1", "-n", ns, "-o", "yaml"); return out })
			taken := time.Since(start)
			Expect(mustKubectl(ctx, "get", "sandboxsnapshot/s1", "-n", ns, "-o", "jsonpath={.status.node}")).To(Equal(nodeA))
			uid := mustKubectl(ctx, "get", "sandboxsnapshot/s1", "-n", ns, "-o", "jsonpath={.metadata.uid}")
			ref := mustKubectl(ctx, "get", "sandboxsnapshot/s1", "-n", ns, "-o", "jsonpath={.status.storage}")
			Expect(ref).To(HavePrefix(snapshotRegistryBase+"/sandboxsnapshots/"+ns+"/"+uid+"/"), "stored in the in-cluster registry")
			Expect(ref).To(MatchRegexp(`@sha256:[0-9a-f]{64}$`))
			// The bytes are in the registry, behind its TLS.
			rc, err := reg.Open(ctx, ref)
			Expect(err).NotTo(HaveOccurred())
			Expect(rc.Close()).To(Succeed())
			// Only behind it: the registry speaks no plain HTTP, and a
			// client without its CA is refused, naming the problem.
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.Split(snapshotRegistryBase, "/")[0]+"/v2/", nil)
			Expect(err).NotTo(HaveOccurred())
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			_ = resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "plain HTTP to a TLS listener")
			untrusting, err := snapshotstore.NewRegistry(snapshotRegistryBase, snapshotstore.RegistryOptions{SpoolDir: GinkgoT().TempDir()})
			Expect(err).NotTo(HaveOccurred())
			_, err = untrusting.Open(ctx, ref)
			Expect(err).To(MatchError(snapshotstore.ErrRegistryTLS))
			Expect(err.Error()).To(ContainSubstring("not trusted"))

			// Pinned to the worker that never ran the source.
			restoreStart := time.Now()
			Expect(kubectlApply(ctx, sandboxYAML(ns, "fork-b", nodeB, "  snapshotRef:\n    name: s1\n"))).To(Succeed())
			waitSandboxesReady(ctx, ns, 2*time.Minute, "fork-b")
			restored := time.Since(restoreStart)
			Expect(sandboxNode(ctx, ns, "fork-b")).To(Equal(nodeB))
			Expect(mustKubectl(ctx, "get", "sandbox/fork-b", "-n", ns, "-o",
				`jsonpath={.status.conditions[?(@.type=="SnapshotRestored")].status}`)).To(Equal("True"))
			out, err = plugin(ctx, nil, "exec", "fork-b", "-n", ns, "--", "sh", "-c",
				"cat /app/a.txt /app/d/e/b /tmp/t.txt && stat -c %a /app/a.txt && readlink /app/l && ls /app")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(Equal("hello\ndeep\nt\n640\na.txt\na.txt\nd\nl\n"))
			// Its container is on worker B's Engine only.
			for _, w := range workers {
				out, err := dockerOn(ctx, w, "ps", "-aq", "--filter", "label="+labelPrefix+"sandbox-name=fork-b", "--filter", "label="+namespaceLabel+"="+ns)
				Expect(err).NotTo(HaveOccurred())
				if w == nodeB {
					Expect(strings.Fields(out)).To(HaveLen(1))
				} else {
					Expect(out).To(BeEmpty(), "fork-b has a container on %s", w)
				}
			}

			// Deleting the snapshot deletes its manifest from the registry.
			mustKubectl(ctx, "delete", "sandboxsnapshot/s1", "-n", ns, "--wait", "--timeout=60s")
			_, err = reg.Open(ctx, ref)
			Expect(err).To(MatchError(snapshotstore.ErrNotFound))
			AddReportEntry("snapshot on kind through the in-cluster registry",
				fmt.Sprintf("create-to-Stored (source Sandbox included) %s, restore on the other worker create-to-Ready %s, spec %s",
					taken.Round(time.Millisecond), restored.Round(time.Millisecond), time.Since(start).Round(time.Millisecond)))
		}, NodeTimeout(6*time.Minute))
	})
}
