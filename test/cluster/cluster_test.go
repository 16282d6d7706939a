//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

func sandboxSpecs() {
	Describe("a Sandbox from the manager DaemonSet", Ordered, func() {
		const ns = "cluster-e2e"
		var sandboxUID, containerID string

		BeforeAll(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout=120s")
			mustKubectl(ctx, "create", "namespace", ns)
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=90s")
				_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
			}, NodeTimeout(3*time.Minute))
		}, NodeTimeout(3*time.Minute))

		It("runs every operator pod Ready, with its shipped security context, probes and limits", func(ctx SpecContext) {
			out := mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-o", "json")
			var pods struct {
				Items []struct {
					Metadata struct{ Name string }
					Spec     struct {
						NodeName        string `json:"nodeName"`
						SecurityContext struct {
							RunAsNonRoot *bool  `json:"runAsNonRoot"`
							RunAsUser    *int64 `json:"runAsUser"`
							Seccomp      *struct {
								Type string
							} `json:"seccompProfile"`
						} `json:"securityContext"`
						Containers []struct {
							Name            string
							SecurityContext struct {
								AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
								Privileged               *bool
								ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem"`
								Capabilities             struct{ Drop []string }
							} `json:"securityContext"`
							LivenessProbe  *json.RawMessage `json:"livenessProbe"`
							ReadinessProbe *json.RawMessage `json:"readinessProbe"`
							Resources      struct {
								Limits map[string]string
							}
						}
					}
					Status struct {
						Conditions []struct{ Type, Status string }
					}
				}
			}
			Expect(json.Unmarshal([]byte(out), &pods)).To(Succeed())
			seen := map[string]bool{}
			for _, p := range pods.Items {
				if strings.HasPrefix(p.Metadata.Name, prefix+"engine-") {
					// The Engine's pods are privileged by design (a Docker
					// Engine needs it; docs/deploy.md#engine-modes): checked
					// in the engine specs, not here.
					continue
				}
				ready := false
				for _, c := range p.Status.Conditions {
					if c.Type == "Ready" && c.Status == "True" {
						ready = true
					}
				}
				Expect(ready).To(BeTrue(), "pod %s is not Ready\n%s", p.Metadata.Name, describeOperator(ctx))
				if strings.HasPrefix(p.Metadata.Name, prefix+"snapshot-registry-") {
					// The kind deployment's snapshot registry stays on the
					// control plane node, out of the workers' faults
					// (config/components/snapshot-registry).
					Expect(p.Spec.NodeName).NotTo(BeElementOf(workers), p.Metadata.Name)
				} else {
					Expect(p.Spec.NodeName).To(BeElementOf(workers), p.Metadata.Name)
				}
				Expect(p.Spec.SecurityContext.Seccomp).NotTo(BeNil(), p.Metadata.Name)
				Expect(p.Spec.SecurityContext.Seccomp.Type).To(Equal("RuntimeDefault"), p.Metadata.Name)
				for _, c := range p.Spec.Containers {
					seen[c.Name] = true
					sc := c.SecurityContext
					Expect(sc.AllowPrivilegeEscalation).To(HaveValue(BeFalse()), "%s/%s", p.Metadata.Name, c.Name)
					Expect(sc.Privileged == nil || !*sc.Privileged).To(BeTrue(), "%s/%s", p.Metadata.Name, c.Name)
					Expect(sc.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()), "%s/%s", p.Metadata.Name, c.Name)
					Expect(sc.Capabilities.Drop).To(ContainElement("ALL"), "%s/%s", p.Metadata.Name, c.Name)
					Expect(c.LivenessProbe).NotTo(BeNil(), "%s/%s", p.Metadata.Name, c.Name)
					Expect(c.ReadinessProbe).NotTo(BeNil(), "%s/%s", p.Metadata.Name, c.Name)
					Expect(c.Resources.Limits).To(HaveKey("memory"), "%s/%s", p.Metadata.Name, c.Name)
					if c.Name != "manager" {
						// Only the node manager runs as root (the Docker socket).
						Expect(p.Spec.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()), "%s/%s", p.Metadata.Name, c.Name)
					}
				}
			}
			Expect(seen).To(HaveKey("manager"))
			Expect(seen).To(HaveKey("webhook"))
			Expect(seen).To(HaveKey("mcp-server"))
		})

		It("makes a Sandbox Ready from the DaemonSet's manager, as a hardened container on the node's Docker", func(ctx SpecContext) {
			Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: first
  namespace: %s
spec:
  nodeName: %s
  image: %s
  imagePullPolicy: Never
  activeDeadlineSeconds: 1800
`, ns, nodeName, sampleImage))).To(Succeed())
			waitSandboxesReady(ctx, ns, 120*time.Second, "first")
			Expect(mustKubectl(ctx, "get", "sandbox/first", "-n", ns, "-o", "jsonpath={.status.nodeName}")).To(Equal(nodeName))
			sandboxUID = mustKubectl(ctx, "get", "sandbox/first", "-n", ns, "-o", "jsonpath={.metadata.uid}")
			containerID = mustKubectl(ctx, "get", "sandbox/first", "-n", ns, "-o", "jsonpath={.status.containerID}")
			Expect(containerID).NotTo(BeEmpty())

			ids, err := dockerOn(ctx, nodeName, "ps", "-q", "--no-trunc", "--filter", "label="+uidLabel+"="+sandboxUID)
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.Fields(ids)).To(ConsistOf(HavePrefix(strings.TrimPrefix(containerID, "docker://"))))

			out, err := dockerOn(ctx, nodeName, "inspect", strings.Fields(ids)[0])
			Expect(err).NotTo(HaveOccurred())
			var inspect []struct {
				Config struct {
					User   string
					Labels map[string]string
				}
				HostConfig struct {
					Privileged     bool
					CapDrop        []string
					CapAdd         []string
					SecurityOpt    []string
					ReadonlyRootfs bool
					NetworkMode    string
					PidsLimit      *int64
					Memory         int64
					MemorySwap     int64
					NanoCpus       int64 `json:"NanoCpus"`
					Init           *bool
					MaskedPaths    []string
					Binds          []string
					PidMode        string
					IpcMode        string
					UsernsMode     string
					RestartPolicy  struct{ Name string }
					Tmpfs          map[string]string
				}
				Mounts []struct{ Source, Destination string }
			}
			Expect(json.Unmarshal([]byte(out), &inspect)).To(Succeed())
			Expect(inspect).To(HaveLen(1))
			c := inspect[0]
			hc := c.HostConfig
			Expect(hc.Privileged).To(BeFalse())
			Expect(hc.CapDrop).To(ContainElement("ALL"))
			Expect(hc.CapAdd).To(BeEmpty())
			Expect(hc.SecurityOpt).To(ContainElement(HavePrefix("no-new-privileges")))
			for _, o := range hc.SecurityOpt {
				Expect(o).NotTo(ContainSubstring("unconfined"))
			}
			Expect(hc.ReadonlyRootfs).To(BeTrue())
			Expect(hc.NetworkMode).To(Equal("none"))
			Expect(hc.PidsLimit).To(HaveValue(BeNumerically(">", 0)))
			Expect(hc.Memory).To(BeNumerically(">", 0))
			Expect(hc.MemorySwap).To(Equal(hc.Memory), "no swap on top of the memory limit")
			Expect(hc.NanoCpus).To(BeNumerically(">", 0))
			Expect(hc.Init).To(HaveValue(BeTrue()))
			Expect(hc.MaskedPaths).NotTo(BeEmpty(), "Docker's default masked paths apply")
			Expect(hc.PidMode).NotTo(Equal("host"))
			Expect(hc.IpcMode).NotTo(Equal("host"))
			Expect(hc.UsernsMode).NotTo(Equal("host"))
			Expect(hc.RestartPolicy.Name).To(BeElementOf("", "no"))
			for _, m := range c.Mounts {
				Expect(m.Source).NotTo(ContainSubstring("docker.sock"))
			}
			Expect(c.Config.User).NotTo(BeElementOf("", "0", "root", "0:0"))
			Expect(c.Config.Labels).To(HaveKeyWithValue(nodeLabel, nodeName))
		}, NodeTimeout(3*time.Minute))

		It("streams kubectl sandbox exec, cp and logs through the API server and the aggregated API", func(ctx SpecContext) {
			Expect(sandboxUID).NotTo(BeEmpty(), "no Sandbox from the previous spec")
			user := framework.PluginFor(pluginBin, kubeconfig, ns)
			// The scenarios test/e2e runs for each kind of credential.
			framework.ExecScenario(ctx, user, "first")
			framework.CopyFileScenario(ctx, user, ns, "first", GinkgoT().TempDir(), "in.txt")

			_, err := plugin(ctx, nil, "logs", "first", "-n", ns)
			Expect(err).NotTo(HaveOccurred())
			out, err := plugin(ctx, nil, "logs", "first", "-n", ns, "--history")
			if err == nil {
				Expect(out).To(ContainSubstring("cat"))
			}
		}, NodeTimeout(3*time.Minute))

		It("adopts running sandboxes when the DaemonSet recreates a deleted manager pod", func(ctx SpecContext) {
			Expect(sandboxUID).NotTo(BeEmpty(), "no Sandbox from the earlier spec")
			before, err := dockerOn(ctx, nodeName, "ps", "-q", "--no-trunc", "--filter", "label="+nodeLabel+"="+nodeName)
			Expect(err).NotTo(HaveOccurred())
			onNode := "--field-selector=spec.nodeName=" + nodeName
			old := mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", "app.kubernetes.io/component=manager", onNode, "-o", "jsonpath={.items[*].metadata.name}")
			Expect(strings.Fields(old)).To(HaveLen(1))

			mustKubectl(ctx, "delete", "pod", "-n", operatorNS, old, "--wait", "--timeout=60s")
			Eventually(func() (string, error) {
				out, err := kubectl(ctx, "get", "pods", "-n", operatorNS, "-l", "app.kubernetes.io/component=manager", onNode,
					"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
				return strings.TrimSpace(out), err
			}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).
				Should(And(HaveSuffix(" True"), Not(HavePrefix(old+" "))), describeOperator(ctx))

			after, err := dockerOn(ctx, nodeName, "ps", "-q", "--no-trunc", "--filter", "label="+nodeLabel+"="+nodeName)
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.Fields(after)).To(ConsistOf(strings.Fields(before)), "the same containers, none recreated")
			Expect(mustKubectl(ctx, "get", "sandbox/first", "-n", ns, "-o", "jsonpath={.status.containerID}")).To(Equal(containerID))
			Eventually(func() (string, error) {
				return plugin(ctx, nil, "exec", "first", "-n", ns, "--", "echo", "still here")
			}).WithContext(ctx).WithTimeout(90 * time.Second).WithPolling(2 * time.Second).Should(Equal("still here\n"))
		}, NodeTimeout(4*time.Minute))

		It("upgrades in place with make deploy and new image tags: Sandboxes keep their containers and files", func(ctx SpecContext) {
			Expect(sandboxUID).NotTo(BeEmpty(), "no Sandbox from the earlier spec")
			Expect(plugin(ctx, nil, "exec", "first", "-n", ns, "--", "sh", "-c", "echo kept > /app/upgrade-marker")).To(BeEmpty())
			before, err := dockerOn(ctx, nodeName, "ps", "-q", "--no-trunc", "--filter", "label="+nodeLabel+"="+nodeName)
			Expect(err).NotTo(HaveOccurred())

			// A new release is new tags of the images: docs/deploy.md#upgrade.
			tag := fmt.Sprintf("upgrade-%d", GinkgoRandomSeed())
			img, mcpImg := "code-sandbox-operator/manager:"+tag, "code-sandbox-operator/mcp-server:"+tag
			for src, dst := range map[string]string{"code-sandbox-operator/manager:latest": img, "code-sandbox-operator/mcp-server:latest": mcpImg} {
				_, err := docker(ctx, "tag", src, dst)
				Expect(err).NotTo(HaveOccurred())
			}
			images := []string{"IMG=" + img, "MCP_IMG=" + mcpImg, "KUBECONFIG=" + kubeconfig}
			// On kind the images are loaded into the nodes; elsewhere they
			// must already be where the nodes pull from.
			var load []string
			if kindCluster != "" {
				load = []string{"kind-load", "KIND_CLUSTER=" + kindCluster}
			}
			out, err := run(ctx, repoRoot, nil, "make", append(append(load, "deploy"), images...)...)
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(waitOperatorRollout(ctx)).To(Succeed())
			Expect(strings.Fields(mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", "app.kubernetes.io/component=manager",
				"-o", "jsonpath={.items[*].spec.containers[0].image}"))).To(HaveEach(img))

			after, err := dockerOn(ctx, nodeName, "ps", "-q", "--no-trunc", "--filter", "label="+nodeLabel+"="+nodeName)
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.Fields(after)).To(ConsistOf(strings.Fields(before)), "the same containers, none recreated")
			Expect(mustKubectl(ctx, "get", "sandbox/first", "-n", ns, "-o", "jsonpath={.status.containerID}")).To(Equal(containerID))
			Eventually(func() (string, error) {
				return plugin(ctx, nil, "exec", "first", "-n", ns, "--", "cat", "/app/upgrade-marker")
			}).WithContext(ctx).WithTimeout(90 * time.Second).WithPolling(2 * time.Second).Should(Equal("kept\n"))
		}, NodeTimeout(8*time.Minute))

		It("keeps Sandboxes running through kubectl drain of the node (they are Docker containers, not pods)", func(ctx SpecContext) {
			Expect(sandboxUID).NotTo(BeEmpty(), "no Sandbox from the earlier spec")
			DeferCleanup(func(ctx SpecContext) {
				mustKubectl(ctx, "uncordon", nodeName)
				// The drain put both webhook replicas on the other worker,
				// and nothing moves one back: spread them again, as
				// config/webhook/deployment.yaml tells operators to.
				mustKubectl(ctx, "rollout", "restart", "-n", operatorNS, "deployment/"+prefix+"webhook")
				// The same for the MCP server's replicas.
				mustKubectl(ctx, "rollout", "restart", "-n", operatorNS, "deployment/"+prefix+"mcp-server")
				Expect(waitOperatorRollout(ctx)).To(Succeed())
			}, NodeTimeout(4*time.Minute))
			// On one node the webhook's PodDisruptionBudget (minAvailable 1)
			// keeps its last replica: the evicted ones have nowhere to go, so
			// drain gives up on it after the timeout. With another worker
			// they move there and drain completes. The manager and the
			// Engine are DaemonSet pods (--ignore-daemonsets) and stay.
			_, err := kubectl(ctx, "drain", nodeName, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s")
			if len(workers) == 1 {
				Expect(err).To(MatchError(ContainSubstring("disruption budget")))
			} else {
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(mustKubectl(ctx, "get", "sandbox/first", "-n", ns, "-o", `jsonpath={.status.containerID} {.status.conditions[?(@.type=="Ready")].status}`)).
				To(Equal(containerID + " True"))
			out, err := plugin(ctx, nil, "exec", "first", "-n", ns, "--", "echo", "drained")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("drained\n"))
			Eventually(func() ([]string, error) {
				out, err := kubectl(ctx, "get", "pods", "-n", operatorNS, "-l", "app.kubernetes.io/component=webhook",
					"--field-selector=status.phase=Running", "-o", "name")
				return strings.Fields(out), err
			}).WithContext(ctx).WithTimeout(60*time.Second).Should(Not(BeEmpty()), "the PodDisruptionBudget keeps a webhook replica")
		}, NodeTimeout(6*time.Minute))

		It("removes the container when the Sandbox is deleted", func(ctx SpecContext) {
			onNode := func(ctx context.Context, args ...string) (string, error) { return dockerOn(ctx, nodeName, args...) }
			framework.DeleteScenario(ctx, kube(), onNode, ns, "first", sandboxUID)
		}, NodeTimeout(2*time.Minute))
	})
}
