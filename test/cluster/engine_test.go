//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// engineDS is the Engine DaemonSet of config/default (config/engine).
const engineDS = prefix + "engine"

// engineSpecs checks what the Engine Pods promise: the sandboxes run in
// them, an Engine Pod's deletion keeps a running sandbox (a manager rollout
// is multiNodeSpecs') (same container, its files and its processes), and Egress
// sandboxes get their firewall. They run only where config/default is
// deployed (not config/node-docker); the sandbox image must be in every
// Engine (make kind-load-sandbox-images).
func engineSpecs() {
	Describe("the Engine DaemonSet", Ordered, Label("engine"), func() {
		const ns = "cluster-engine"
		var node, containerID, bgPID string

		BeforeAll(func(ctx SpecContext) {
			if _, err := kubectl(ctx, "get", "daemonset", engineDS, "-n", operatorNS); err != nil {
				Skip("no Engine DaemonSet: the operator is deployed with config/node-docker")
			}
			_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout=120s")
			mustKubectl(ctx, "create", "namespace", ns)
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=90s")
				_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
			}, NodeTimeout(3*time.Minute))
		}, NodeTimeout(3*time.Minute))

		It("runs a Ready Engine Pod on every node with a manager, answering on the socket", func(ctx SpecContext) {
			managers := podNodes(ctx, "app.kubernetes.io/name=code-sandbox-operator,app.kubernetes.io/component=manager")
			engines := podNodes(ctx, engineSelector)
			Expect(slices.Sorted(maps.Keys(engines))).To(Equal(slices.Sorted(maps.Keys(managers))), "nodes with an Engine pod and nodes with a manager")
			for n := range engines {
				out, err := dockerOn(ctx, n, "version", "--format", "{{.Server.Version}}")
				Expect(err).NotTo(HaveOccurred(), out)
				out, err = dockerOn(ctx, n, "image", "inspect", "--format", "{{.Id}}", sampleImage)
				Expect(err).NotTo(HaveOccurred(), "%s is not in the Engine on %s: make kind-load-sandbox-images\n%s", sampleImage, n, out)
			}
		}, NodeTimeout(2*time.Minute))

		It("runs a Sandbox in the Engine Pod of its node, with a file and a background process", func(ctx SpecContext) {
			Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: keep
  namespace: %s
spec:
  image: %s
  imagePullPolicy: Never
  activeDeadlineSeconds: 1800
`, ns, sampleImage))).To(Succeed())
			waitSandboxesReady(ctx, ns, 120*time.Second, "keep")
			node = mustKubectl(ctx, "get", "sandbox/keep", "-n", ns, "-o", "jsonpath={.status.nodeName}")
			containerID = strings.TrimPrefix(mustKubectl(ctx, "get", "sandbox/keep", "-n", ns, "-o", "jsonpath={.status.containerID}"), "docker://")
			Expect(containerID).NotTo(BeEmpty())
			out, err := dockerOn(ctx, node, "inspect", "--format", "{{.State.Running}}", containerID)
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(strings.TrimSpace(out)).To(Equal("true"))

			_, err = plugin(ctx, nil, "exec", "keep", "-n", ns, "--", "sh", "-c", "echo before > /tmp/marker")
			Expect(err).NotTo(HaveOccurred())
			// A process in a session of its own, which outlives the exec.
			bgPID, err = plugin(ctx, nil, "exec", "keep", "-n", ns, "--", "python3", "-c",
				"import subprocess; print(subprocess.Popen(['sleep', '100000'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
			Expect(err).NotTo(HaveOccurred())
			bgPID = strings.TrimSpace(bgPID)
			Expect(bgPID).To(MatchRegexp(`^[0-9]+$`))
			expectKept(ctx, ns, "keep", containerID, bgPID)
		}, NodeTimeout(3*time.Minute))

		It("keeps it when its node's Engine Pod is deleted (live-restore)", func(ctx SpecContext) {
			Expect(containerID).NotTo(BeEmpty(), "no Sandbox from the previous spec")
			old := podNodes(ctx, engineSelector)[node]
			mustKubectl(ctx, "delete", "pod", "-n", operatorNS, old, "--wait", "--timeout=120s")
			Eventually(func(g Gomega) {
				pod := podNodes(ctx, engineSelector)[node]
				g.Expect(pod).NotTo(BeEmpty())
				g.Expect(pod).NotTo(Equal(old))
				_, err := kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+pod, "-n", operatorNS, "--timeout=5s")
				g.Expect(err).NotTo(HaveOccurred())
			}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(Succeed(), describeOperator(ctx))
			expectKept(ctx, ns, "keep", containerID, bgPID)
		}, NodeTimeout(5*time.Minute))

		It("creates an Egress sandbox: the firewall is in the Engine's network namespace", func(ctx SpecContext) {
			Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: egress
  namespace: %s
spec:
  image: %s
  imagePullPolicy: Never
  activeDeadlineSeconds: 600
  network:
    mode: Egress
`, ns, sampleImage))).To(Succeed())
			waitSandboxesReady(ctx, ns, 120*time.Second, "egress")
			n := mustKubectl(ctx, "get", "sandbox/egress", "-n", ns, "-o", "jsonpath={.status.nodeName}")
			id := strings.TrimPrefix(mustKubectl(ctx, "get", "sandbox/egress", "-n", ns, "-o", "jsonpath={.status.containerID}"), "docker://")
			out, err := dockerOn(ctx, n, "inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}", id)
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(MatchRegexp(`code-sandbox-egress=10\.213\.[0-9]+\.[0-9]+`), "the Engine's address pool (hack/engine/daemon.json)")
			// The node's netfilter, as the Engine Pod (node network
			// namespace) sees it, holds the manager's chains: the same
			// backend as Docker's.
			out, err = engineExec(ctx, n, "iptables-save")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(ContainSubstring(":CSBX-EGRESS "))
			Expect(out).To(ContainSubstring(":DOCKER-USER "))
			Expect(out).To(ContainSubstring("-A DOCKER-USER -i csbx-egress0 -j CSBX-EGRESS"))
			Expect(out).To(ContainSubstring("csbx-egress0"))
		}, NodeTimeout(3*time.Minute))

		It("runs a gVisor sandbox: runsc is in the Engine image", func(ctx SpecContext) {
			Expect(kubectlApply(ctx, sandboxYAML(ns, "gvisor", "", "  runtime: gvisor\n"))).To(Succeed())
			waitSandboxesReady(ctx, ns, 3*time.Minute, "gvisor")
			n := sandboxNode(ctx, ns, "gvisor")
			id := strings.TrimPrefix(mustKubectl(ctx, "get", "sandbox/gvisor", "-n", ns, "-o", "jsonpath={.status.containerID}"), "docker://")
			out, err := dockerOn(ctx, n, "inspect", "--format", "{{.HostConfig.Runtime}}", id)
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(strings.TrimSpace(out)).To(Equal("runsc"))
			out, err = plugin(ctx, nil, "exec", "gvisor", "-n", ns, "--", "sh", "-c", "dmesg 2>/dev/null | head -5; cat /proc/version")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(ContainSubstring("gVisor"))
		}, NodeTimeout(4*time.Minute))
	})
}

// expectKept checks that Sandbox name still runs the container id, Ready,
// with /tmp/marker and the background process pid.
func expectKept(ctx context.Context, ns, name, id, pid string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(mustKubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)).To(Equal("True"))
	}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(Succeed(), describeSandbox(ctx, ns, name))
	Expect(strings.TrimPrefix(mustKubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o", "jsonpath={.status.containerID}"), "docker://")).To(Equal(id))
	var out string
	Eventually(func() error {
		var err error
		out, err = plugin(ctx, nil, "exec", name, "-n", ns, "--", "cat", "/tmp/marker")
		return err
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	Expect(out).To(Equal("before\n"))
	_, err := plugin(ctx, nil, "exec", name, "-n", ns, "--", "sh", "-c", "kill -0 "+pid)
	Expect(err).NotTo(HaveOccurred(), "the background process %s is gone", pid)
}

// podNodes maps node name to the name of the Pod matching selector there.
func podNodes(ctx context.Context, selector string) map[string]string {
	GinkgoHelper()
	out := mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", selector, "--field-selector=status.phase=Running",
		"-o", `jsonpath={range .items[*]}{.spec.nodeName}{" "}{.metadata.name}{"\n"}{end}`)
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m
}

// engineExec runs a command in the Engine Pod on node.
func engineExec(ctx context.Context, node string, args ...string) (string, error) {
	pod, err := enginePod(ctx, node)
	if err != nil {
		return "", err
	}
	return kubectl(ctx, append([]string{"exec", "-n", operatorNS, pod, "-c", "dockerd", "--"}, args...)...)
}
