//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

// sandboxYAML is a Sandbox of the sample image, pinned to node unless it is
// empty.
func sandboxYAML(ns, name, node, extra string) string {
	pin := ""
	if node != "" {
		pin = "  nodeName: " + node + "\n"
	}
	return fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
%s  image: %s
  imagePullPolicy: Never
  activeDeadlineSeconds: 3600
%s`, name, ns, pin, sampleImage, extra)
}

// freshNamespace deletes ns if a previous run left it, creates it, and
// deletes its Sandboxes and itself after the container.
func freshNamespace(ctx context.Context, ns string) {
	GinkgoHelper()
	_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout=180s")
	mustKubectl(ctx, "create", "namespace", ns)
	DeferCleanup(func(ctx SpecContext) {
		_, _ = kubectl(ctx, "delete", "sandboxwarmpools", "--all", "-n", ns, "--wait", "--timeout=60s")
		_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=180s")
		_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
	}, NodeTimeout(5*time.Minute))
}

// readyOf is a Sandbox's Ready condition as "Status/Reason".
func readyOf(ctx context.Context, ns, name string) (string, error) {
	out, err := kubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o",
		`jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason}`)
	return strings.TrimSpace(out), err
}

// multiNodeSpecs run where the operator has at least two workers (the kind
// cluster of make kind-up): placement, warm pools over both, a manager
// rollout, egress, the loss of a node and churn with faults.
func multiNodeSpecs() {
	Describe("two workers", Ordered, Label("multinode"), func() {
		const ns = "cluster-multinode"
		var pinned []string // one pinned Sandbox per worker, by worker

		BeforeAll(func(ctx SpecContext) {
			if len(workers) < 2 {
				Skip(fmt.Sprintf("needs two workers, the cluster has %v (make kind-up makes two)", workers))
			}
			freshNamespace(ctx, ns)
		}, NodeTimeout(5*time.Minute))

		It("places Sandboxes pinned to each worker and unpinned ones on the workers; exec, cp, logs and history reach each node", func(ctx SpecContext) {
			var names []string
			for i, w := range workers {
				name := fmt.Sprintf("pinned-%d", i)
				pinned = append(pinned, name)
				names = append(names, name)
				Expect(kubectlApply(ctx, sandboxYAML(ns, name, w, ""))).To(Succeed())
			}
			for i := range 4 {
				name := fmt.Sprintf("free-%d", i)
				names = append(names, name)
				Expect(kubectlApply(ctx, sandboxYAML(ns, name, "", ""))).To(Succeed())
			}
			waitSandboxesReady(ctx, ns, 3*time.Minute, names...)
			for i, w := range workers {
				Expect(sandboxNode(ctx, ns, pinned[i])).To(Equal(w))
			}
			dir := GinkgoT().TempDir()
			for _, name := range names {
				node := sandboxNode(ctx, ns, name)
				Expect(node).To(BeElementOf(workers), name)
				// The container is on that node's Engine and no other.
				for _, w := range workers {
					out, err := dockerOn(ctx, w, "ps", "-aq", "--filter", "label="+labelPrefix+"sandbox-name="+name, "--filter", "label="+namespaceLabel+"="+ns)
					Expect(err).NotTo(HaveOccurred())
					if w == node {
						Expect(strings.Fields(out)).To(HaveLen(1), "%s's container on its node %s", name, w)
					} else {
						Expect(out).To(BeEmpty(), "%s has a container on %s, not its node", name, w)
					}
				}
				out, err := plugin(ctx, nil, "exec", name, "-n", ns, "--", "sh", "-c", "echo $((6*7)) from "+name)
				Expect(err).NotTo(HaveOccurred(), name)
				Expect(out).To(Equal("42 from " + name + "\n"))
				src := filepath.Join(dir, name)
				Expect(os.WriteFile(src, []byte("for "+name+"\n"), 0o644)).To(Succeed())
				_, err = plugin(ctx, nil, "cp", src, ns+"/"+name+":/tmp/in.txt")
				Expect(err).NotTo(HaveOccurred(), name)
				back := src + ".back"
				_, err = plugin(ctx, nil, "cp", ns+"/"+name+":/tmp/in.txt", back)
				Expect(err).NotTo(HaveOccurred(), name)
				Expect(os.ReadFile(back)).To(Equal([]byte("for " + name + "\n")))
				_, err = plugin(ctx, nil, "logs", name, "-n", ns)
				Expect(err).NotTo(HaveOccurred(), name)
				out, err = plugin(ctx, nil, "logs", name, "-n", ns, "--history")
				Expect(err).NotTo(HaveOccurred(), name)
				Expect(out).To(ContainSubstring("from "+name), "%s's exec history", name)
			}
		}, NodeTimeout(6*time.Minute))

		It("spreads a warm pool's members over both workers and claims one on each", func(ctx SpecContext) {
			const pool = "spread"
			Expect(kubectlApply(ctx, framework.WarmPoolManifest(pool, ns, sampleImage, len(workers)))).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "swp/"+pool, "-n", ns, "--wait", "--timeout=60s")
			}, NodeTimeout(2*time.Minute))
			memberNodes := func(ctx context.Context) ([]string, error) {
				return withCondition(ctx, "sandboxes", ns, warmPoolLabel+"="+pool, "Paused", ".status.nodeName")
			}
			Eventually(memberNodes).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).
				Should(ConsistOf(workers), func() string { return describePool(ctx, ns, pool) })

			for i, w := range workers {
				name := fmt.Sprintf("claim-%d", i)
				Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  nodeName: %s
  warmPoolRef:
    name: %s
  activeDeadlineSeconds: 1800
`, name, ns, w, pool))).To(Succeed())
				waitSandboxesReady(ctx, ns, 2*time.Minute, name)
				Expect(sandboxNode(ctx, ns, name)).To(Equal(w))
				claim := mustKubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o",
					`jsonpath={.status.conditions[?(@.type=="WarmPoolClaim")].status}/{.status.conditions[?(@.type=="WarmPoolClaim")].reason}`)
				Expect(claim).To(Equal("True/WarmPoolClaimed"), "the claim on %s took the idle member there\n%s", w, describeSandbox(ctx, ns, name))
				out, err := plugin(ctx, nil, "exec", name, "-n", ns, "--", "echo", "claimed on", w)
				Expect(err).NotTo(HaveOccurred())
				Expect(out).To(Equal("claimed on " + w + "\n"))
			}
			// And the pool refills on both.
			Eventually(memberNodes).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).
				Should(ConsistOf(workers), func() string { return describePool(ctx, ns, pool) })
		}, NodeTimeout(10*time.Minute))

		It("loses nothing in a rollout of the manager DaemonSet: same containers, files, and background processes on both workers", func(ctx SpecContext) {
			Expect(pinned).To(HaveLen(len(workers)), "no pinned Sandboxes from the first spec")
			type before struct{ containerID, pid string }
			was := map[string]before{}
			for _, name := range pinned {
				out, err := plugin(ctx, nil, "exec", name, "-n", ns, "--", "sh", "-c",
					"echo kept > /tmp/rollout-marker; sleep 86400 >/dev/null 2>&1 & echo $!")
				Expect(err).NotTo(HaveOccurred())
				was[name] = before{
					containerID: mustKubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o", "jsonpath={.status.containerID}"),
					pid:         strings.TrimSpace(out),
				}
				Expect(was[name].pid).To(MatchRegexp(`^[0-9]+$`))
			}
			engines := mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", engineSelector, "-o", "jsonpath={.items[*].metadata.uid}")

			mustKubectl(ctx, "rollout", "restart", "-n", operatorNS, "daemonset/"+prefix+"controller-manager")
			_, err := kubectl(ctx, "rollout", "status", "-n", operatorNS, "daemonset/"+prefix+"controller-manager", "--timeout=240s")
			Expect(err).NotTo(HaveOccurred(), describeOperator(ctx))
			Expect(mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", engineSelector, "-o", "jsonpath={.items[*].metadata.uid}")).
				To(Equal(engines), "a manager rollout must not restart the Engine pods")

			for _, name := range pinned {
				Expect(mustKubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o", "jsonpath={.status.containerID}")).To(Equal(was[name].containerID), name)
				Eventually(func() (string, error) {
					return plugin(ctx, nil, "exec", name, "-n", ns, "--", "sh", "-c",
						"cat /tmp/rollout-marker; kill -0 "+was[name].pid+" && echo alive")
				}).WithContext(ctx).WithTimeout(90*time.Second).WithPolling(2*time.Second).Should(Equal("kept\nalive\n"), name)
				Expect(readyOf(ctx, ns, name)).To(Equal("True/Running"), name)
			}
		}, NodeTimeout(8*time.Minute))

		It("lets an Egress sandbox on kind reach an internet host, but not its node, the node API or a peer sandbox", func(ctx SpecContext) {
			if kindCluster == "" || os.Geteuid() != 0 {
				Skip("needs the kind cluster and root on this machine (a network namespace stands in for the internet)")
			}
			inet := newFakeInternet(ctx)
			for i := range 2 {
				Expect(kubectlApply(ctx, sandboxYAML(ns, fmt.Sprintf("egress-%d", i), workers[0], "  network:\n    mode: Egress\n"))).To(Succeed())
			}
			waitSandboxesReady(ctx, ns, 3*time.Minute, "egress-0", "egress-1")
			fetch := func(url string) (string, error) {
				return plugin(ctx, nil, "exec", "egress-0", "-n", ns, "--", "python3", "-c",
					"import sys,urllib.request\ntry:\n print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode().strip())\nexcept Exception as e:\n print('blocked', type(e).__name__)", url)
			}
			Expect(fetch("http://" + inet + ":8080/")).To(Equal("hello from the internet\n"))

			nodeIP := mustKubectl(ctx, "get", "node", workers[0], "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)
			peer := mustKubectl(ctx, "get", "sandbox/egress-1", "-n", ns, "-o", "jsonpath={.metadata.uid}")
			peerIP, err := dockerOn(ctx, workers[0], "ps", "-q", "--filter", "label="+uidLabel+"="+peer)
			Expect(err).NotTo(HaveOccurred())
			peerIP, err = dockerOn(ctx, workers[0], "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", strings.TrimSpace(peerIP))
			Expect(err).NotTo(HaveOccurred())
			peerIP = strings.TrimSpace(peerIP)
			Expect(peerIP).NotTo(BeEmpty())
			// A listener in the peer, so a refusal is the firewall's.
			_, err = plugin(ctx, nil, "exec", "egress-1", "-n", ns, "--", "sh", "-c",
				"cd /tmp && python3 -m http.server 8000 >/dev/null 2>&1 & sleep 1")
			Expect(err).NotTo(HaveOccurred())
			for what, url := range map[string]string{
				"the node (kubelet)":  "http://" + nodeIP + ":10250/",
				"the node API":        "https://" + nodeIP + ":9443/",
				"a peer sandbox":      "http://" + peerIP + ":8000/",
				"the metadata server": "http://169.254.169.254/",
			} {
				out, err := fetch(url)
				Expect(err).NotTo(HaveOccurred(), what)
				Expect(out).To(HavePrefix("blocked"), "%s (%s) must be unreachable from an Egress sandbox", what, url)
			}
		}, NodeTimeout(6*time.Minute))
	})
}

// newFakeInternet starts an HTTP server on a public-looking address
// (203.0.113.10, TEST-NET-3) in a network namespace of this machine, routed
// from the kind nodes' Docker network through the host, and removes it
// after the spec. It returns the address.
func newFakeInternet(ctx context.Context) string {
	GinkgoHelper()
	const (
		netns    = "csbx-kind-inet"
		hostIf   = "csbxki0"
		nsIf     = "csbxki1"
		hostAddr = "198.51.100.1"
		inetAddr = "203.0.113.10"
	)
	sh := func(args ...string) {
		GinkgoHelper()
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%v: %s", args, out)
	}
	cleanup := func() {
		_ = exec.Command("ip", "netns", "del", netns).Run()
		_ = exec.Command("ip", "link", "del", hostIf).Run()
		_ = exec.Command("iptables", "-w", "5", "-D", "FORWARD", "-o", hostIf, "-j", "ACCEPT").Run()
		_ = exec.Command("iptables", "-w", "5", "-D", "FORWARD", "-i", hostIf, "-j", "ACCEPT").Run()
	}
	cleanup()
	DeferCleanup(cleanup)
	sh("ip", "netns", "add", netns)
	sh("ip", "link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	sh("ip", "link", "set", nsIf, "netns", netns)
	sh("ip", "addr", "add", hostAddr+"/32", "dev", hostIf)
	sh("ip", "link", "set", hostIf, "up")
	sh("ip", "route", "add", inetAddr+"/32", "dev", hostIf)
	in := func(args ...string) { GinkgoHelper(); sh(append([]string{"ip", "netns", "exec", netns}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	in("ip", "addr", "add", inetAddr+"/32", "dev", nsIf)
	in("ip", "link", "set", nsIf, "up")
	in("ip", "route", "add", hostAddr+"/32", "dev", nsIf)
	in("ip", "route", "add", "default", "via", hostAddr)
	sh("sysctl", "-qw", "net.ipv4.ip_forward=1")
	// Docker's FORWARD policy is DROP; let the kind network's traffic to
	// and from the namespace through (the kind bridge's own rules accept it
	// leaving the bridge; this accepts it on the way back).
	sh("iptables", "-w", "5", "-I", "FORWARD", "-o", hostIf, "-j", "ACCEPT")
	sh("iptables", "-w", "5", "-I", "FORWARD", "-i", hostIf, "-j", "ACCEPT")

	root := GinkgoT().TempDir()
	Expect(os.WriteFile(filepath.Join(root, "index.html"), []byte("hello from the internet\n"), 0o644)).To(Succeed())
	httpd := exec.Command("ip", "netns", "exec", netns, "busybox", "httpd", "-f", "-p", "8080", "-h", root)
	Expect(httpd.Start()).To(Succeed())
	DeferCleanup(func() { _ = httpd.Process.Kill(); _ = httpd.Wait() })
	return inetAddr
}
