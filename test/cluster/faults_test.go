//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

// nodeLostReason is api/v1alpha1.SandboxReasonNodeLost.
const nodeLostReason = "NodeLost"

// containerIndex is every sandbox container on the workers' Engines, by
// Sandbox UID, each with the node it is on.
func containerIndex(ctx context.Context, extraFilters ...string) (map[string][]string, error) {
	byUID := map[string][]string{}
	for _, w := range workers {
		args := append([]string{"ps", "-a", "--format", `{{.Label "` + uidLabel + `"}}`, "--filter", "label=" + labelPrefix + "managed-by=code-sandbox-operator"}, extraFilters...)
		out, err := dockerOn(ctx, w, args...)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", w, err)
		}
		for _, uid := range strings.Fields(out) {
			byUID[uid] = append(byUID[uid], w)
		}
	}
	return byUID, nil
}

// sandboxUIDs is every Sandbox's UID in ns.
func sandboxUIDs(ctx context.Context, ns string) (map[string]string, error) {
	out, err := kubectl(ctx, "get", "sandboxes", "-n", ns, "-o", `jsonpath={range .items[*]}{.metadata.uid} {.metadata.name}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m, nil
}

// waitWorkersBack waits until every node is Ready and the operator's pods
// on it run again, after a kind node was stopped or restarted.
func waitWorkersBack(ctx context.Context) {
	GinkgoHelper()
	_, err := kubectl(ctx, "wait", "--for=condition=Ready", "nodes", "--all", "--timeout=240s")
	Expect(err).NotTo(HaveOccurred())
	Expect(waitOperatorRollout(ctx)).To(Succeed())
	Eventually(func() ([]string, error) {
		return withCondition(ctx, "pods", operatorNS, managerSelector, "Ready", ".spec.nodeName")
	}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(ConsistOf(workers), describeOperator(ctx))
}

// faultSpecs stop and restart kind nodes and kill manager pods. They run
// last before undeploy, and leave every node Ready.
func faultSpecs() {
	Describe("faults on the kind cluster", Ordered, Label("faults"), func() {
		BeforeAll(func() {
			if kindCluster == "" || len(workers) < 2 {
				Skip(fmt.Sprintf("needs a kind cluster with two workers (make kind-up); kind cluster %q, workers %v", kindCluster, workers))
			}
		})

		It("reports a stopped node's Sandboxes NodeLost within 60 s, releases their quota, refills the pool elsewhere; the node comes back with no orphan or duplicate", func(ctx SpecContext) {
			const (
				ns     = "cluster-node-loss"
				poolNS = "cluster-node-loss-pool"
				mcpNS  = "sandboxes"
				pool   = "loss"
			)
			// The webhook's replicas (the control plane, which marks
			// NodeLost) must not all be on the victim. The MCP server's
			// three replicas are on both workers: the one on the victim is
			// lost with it, and the MCP call below goes to another through
			// a new connection.
			survivor, victim := workers[0], workers[1]
			Expect(strings.Fields(mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", "app.kubernetes.io/component=webhook",
				"-o", "jsonpath={.items[*].spec.nodeName}"))).To(ContainElement(survivor), "a control plane replica runs on %s", survivor)
			freshNamespace(ctx, ns)
			freshNamespace(ctx, poolNS)
			freshNamespace(ctx, mcpNS)
			DeferCleanup(func(ctx SpecContext) {
				_, _ = docker(ctx, "start", victim)
				waitWorkersBack(ctx)
			}, NodeTimeout(6*time.Minute))

			Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: SandboxQuota
metadata:
  name: loss
  namespace: %s
spec:
  hard:
    sandboxes: 10
`, ns))).To(Succeed())
			for i := range 2 {
				Expect(kubectlApply(ctx, sandboxYAML(ns, fmt.Sprintf("lost-%d", i), victim, ""))).To(Succeed())
			}
			Expect(kubectlApply(ctx, sandboxYAML(ns, "kept", survivor, ""))).To(Succeed())
			waitSandboxesReady(ctx, ns, 3*time.Minute, "lost-0", "lost-1", "kept")
			used := func(ctx context.Context) (string, error) {
				out, err := kubectl(ctx, "get", "sandboxquota", "loss", "-n", ns, "-o", "jsonpath={.status.used.sandboxes}")
				return strings.TrimSpace(out), err
			}
			Eventually(used).WithContext(ctx).WithTimeout(time.Minute).Should(Equal("3"))

			Expect(kubectlApply(ctx, framework.WarmPoolManifest(pool, poolNS, sampleImage, 2))).To(Succeed())
			idleNodes := func(ctx context.Context) ([]string, error) {
				return withCondition(ctx, "sandboxes", poolNS, warmPoolLabel+"="+pool, "Paused", ".status.nodeName")
			}
			Eventually(idleNodes).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).
				Should(ConsistOf(survivor, victim), func() string { return describePool(ctx, poolNS, pool) })

			// An MCP sandbox on the node to be lost: the MCP server places
			// nothing, so create until one lands there.
			mustKubectl(ctx, "create", "serviceaccount", "agent", "-n", mcpNS)
			mustKubectl(ctx, "create", "rolebinding", "agent-editor", "-n", mcpNS,
				"--clusterrole="+prefix+"sandbox-editor-role", "--serviceaccount="+mcpNS+":agent")
			mcpToken := mustKubectl(ctx, "create", "token", "agent", "-n", mcpNS, "--duration=1h", "--audience", "code-sandbox-mcp")
			sess := connectMCP(ctx, mcpToken)
			var onVictim string
			for range 12 {
				id := mcpInit(ctx, sess)
				out := mustKubectl(ctx, "get", "sandboxes", "-n", mcpNS, "-o", `jsonpath={range .items[*]}{.metadata.name} {.status.nodeName}{"\n"}{end}`)
				if slices.Contains(strings.Split(strings.TrimSpace(out), "\n"), id+" "+victim) {
					onVictim = id
					break
				}
				// Not there: stop it, so that --max-sandboxes (5) does not
				// end the search.
				res := mcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
				Expect(res.IsError).To(BeFalse(), mcpText(res))
			}
			Expect(onVictim).NotTo(BeEmpty(), "no MCP sandbox landed on %s in 12 tries", victim)
			lostUIDs := map[string]bool{}
			for _, n := range []string{"lost-0", "lost-1"} {
				lostUIDs[mustKubectl(ctx, "get", "sandbox/"+n, "-n", ns, "-o", "jsonpath={.metadata.uid}")] = true
			}

			By("stopping the kind node " + victim)
			stopped := time.Now()
			_, err := docker(ctx, "stop", victim)
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() ([]string, error) {
				var got []string
				for _, n := range []string{"lost-0", "lost-1"} {
					r, err := readyOf(ctx, ns, n)
					if err != nil {
						return nil, err
					}
					got = append(got, r)
				}
				return got, nil
			}).WithContext(ctx).WithTimeout(60*time.Second-time.Since(stopped)).WithPolling(time.Second).
				Should(HaveEach("False/"+nodeLostReason), func() string { return describeSandbox(ctx, ns, "lost-0") })
			AddReportEntry("node stopped to NodeLost", time.Since(stopped).Round(time.Second).String())
			Expect(readyOf(ctx, ns, "kept")).To(Equal("True/Running"), "a Sandbox on the other node is untouched")

			Eventually(used).WithContext(ctx).WithTimeout(30*time.Second).Should(Equal("1"), "the lost Sandboxes' quota charge is released")
			Eventually(idleNodes).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).
				Should(ConsistOf(survivor, survivor), func() string { return describePool(ctx, poolNS, pool) })

			// A new client (new connections): a kept-alive connection to the
			// replica on the stopped node would wait for TCP to give up.
			// By now the node is NotReady and its endpoints are out of the
			// Service.
			sess = connectMCP(ctx, mcpToken)
			res := mcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": onVictim, "commands": []string{"echo hi"}})
			Expect(res.IsError).To(BeTrue(), mcpText(res))
			Expect(mcpText(res)).To(ContainSubstring(nodeLostReason), "the model learns why")
			_, err = plugin(ctx, nil, "exec", "lost-0", "-n", ns, "--", "echo", "hi")
			Expect(err).To(MatchError(ContainSubstring(nodeLostReason)))

			By("starting " + victim + " again")
			_, err = docker(ctx, "start", victim)
			Expect(err).NotTo(HaveOccurred())
			waitWorkersBack(ctx)

			// Converged: the lost Sandboxes stay NodeLost (terminal) and
			// have no container anywhere; nothing is duplicated or orphaned.
			Eventually(func(g Gomega) {
				idx, err := containerIndex(ctx)
				g.Expect(err).NotTo(HaveOccurred())
				live := map[string]string{}
				for _, n := range []string{ns, poolNS, mcpNS} {
					m, err := sandboxUIDs(ctx, n)
					g.Expect(err).NotTo(HaveOccurred())
					for uid, name := range m {
						live[uid] = n + "/" + name
					}
				}
				for uid, nodes := range idx {
					g.Expect(nodes).To(HaveLen(1), "Sandbox %s (%s) has containers on %v", uid, live[uid], nodes)
					g.Expect(lostUIDs).NotTo(HaveKey(uid), "a NodeLost Sandbox's container is left on %v", nodes)
				}
				for _, n := range []string{"lost-0", "lost-1"} {
					g.Expect(readyOf(ctx, ns, n)).To(Equal("False/" + nodeLostReason))
				}
				g.Expect(readyOf(ctx, ns, "kept")).To(Equal("True/Running"))
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(3 * time.Second).Should(Succeed())
			_, err = kubectl(ctx, "delete", "sandbox", "lost-0", "lost-1", "-n", ns, "--wait", "--timeout=60s")
			Expect(err).NotTo(HaveOccurred(), "a NodeLost Sandbox deletes")
		}, NodeTimeout(15*time.Minute))

		It("survives churn of 300 Sandboxes with manager pods killed at random and a worker restarted: no duplicate, no leaked container", func(ctx SpecContext) {
			const (
				ns    = "cluster-churn"
				total = 300
				wave  = 30
			)
			freshNamespace(ctx, ns)
			var (
				mu         sync.Mutex
				readyOnce  = map[string]bool{}
				readyAtEnd int
				duplicates = map[string][]string{}
				kills      int
				restarted  string
			)
			faultCtx, stopFaults := context.WithCancel(ctx)
			faultsDone := make(chan struct{})
			go func() {
				defer GinkgoRecover()
				defer close(faultsDone)
				for {
					select {
					case <-faultCtx.Done():
						return
					case <-time.After(time.Duration(10+rand.IntN(15)) * time.Second):
					}
					out, err := kubectl(faultCtx, "get", "pods", "-n", operatorNS, "-l", managerSelector, "-o", "jsonpath={.items[*].metadata.name}")
					if pods := strings.Fields(out); err == nil && len(pods) > 0 {
						if _, err := kubectl(faultCtx, "delete", "pod", "-n", operatorNS, pods[rand.IntN(len(pods))], "--grace-period=0", "--force", "--wait=false"); err == nil {
							mu.Lock()
							kills++
							mu.Unlock()
						}
					}
				}
			}()
			DeferCleanup(func(ctx SpecContext) {
				stopFaults()
				<-faultsDone
				waitWorkersBack(ctx)
			}, NodeTimeout(6*time.Minute))

			start := time.Now()
			for w := range total / wave {
				var b strings.Builder
				for i := range wave {
					fmt.Fprintf(&b, "---\n%s", sandboxYAML(ns, fmt.Sprintf("churn-%03d", w*wave+i), "", ""))
				}
				Expect(kubectlApply(ctx, b.String())).To(Succeed())
				if w == total/wave/2 {
					restarted = workers[rand.IntN(len(workers))]
					By("restarting the kind node " + restarted)
					_, err := docker(ctx, "restart", "--time", "5", restarted)
					Expect(err).NotTo(HaveOccurred())
				}
				// Up to 90 s for the wave; what is Ready by then counts.
				deadline := time.Now().Add(90 * time.Second)
				for time.Now().Before(deadline) {
					names, err := withCondition(ctx, "sandboxes", ns, "", "Ready", ".metadata.name")
					if err == nil {
						n := 0
						for _, name := range names {
							readyOnce[name] = true
							if k, _ := strconv.Atoi(strings.TrimPrefix(name, "churn-")); k/wave == w {
								n++
							}
						}
						if n == wave {
							break
						}
					}
					time.Sleep(2 * time.Second)
				}
				names, _ := withCondition(ctx, "sandboxes", ns, "", "Ready", ".metadata.name")
				for _, name := range names {
					if k, _ := strconv.Atoi(strings.TrimPrefix(name, "churn-")); k/wave == w {
						readyAtEnd++
					}
				}
				if idx, err := containerIndex(ctx, "--filter", "label="+namespaceLabel+"="+ns); err == nil {
					for uid, nodes := range idx {
						if len(nodes) > 1 {
							duplicates[uid] = nodes
						}
					}
				}
				// The previous wave goes; this one stays while the next starts.
				if w > 0 {
					var names []string
					for i := range wave {
						names = append(names, fmt.Sprintf("sandbox/churn-%03d", (w-1)*wave+i))
					}
					_, _ = kubectl(ctx, append([]string{"delete", "-n", ns, "--wait=false", "--ignore-not-found"}, names...)...)
				}
			}
			stopFaults()
			<-faultsDone
			waitWorkersBack(ctx)
			_, err := kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=300s")
			Expect(err).NotTo(HaveOccurred(), describeOperator(ctx))
			var leaked map[string][]string
			Eventually(func() (int, error) {
				var err error
				leaked, err = containerIndex(ctx, "--filter", "label="+namespaceLabel+"="+ns)
				return len(leaked), err
			}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(3*time.Second).Should(BeZero(), "leaked containers")

			mu.Lock()
			report := fmt.Sprintf("created %d in %s, Ready at least once %d, Ready at the end of their wave %d, manager pods killed %d, worker restarted %s, duplicates %d, leaked containers %d",
				total, time.Since(start).Round(time.Second), len(readyOnce), readyAtEnd, kills, restarted, len(duplicates), len(leaked))
			mu.Unlock()
			AddReportEntry("churn with faults", report)
			GinkgoWriter.Println(report)
			Expect(duplicates).To(BeEmpty(), "a Sandbox had containers on two nodes")
			Expect(kills).To(BeNumerically(">", 0), "the fault injector killed no manager pod")
			Expect(len(readyOnce)).To(BeNumerically(">=", total/2), "most Sandboxes became Ready despite the faults")
		}, NodeTimeout(25*time.Minute))
	})
}
