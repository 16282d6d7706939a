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

const (
	// The labels the pool controller puts on its member Sandboxes
	// (api/v1alpha1 LabelWarmPool and LabelTemplateHash).
	warmPoolLabel     = labelPrefix + "warm-pool"
	templateHashLabel = labelPrefix + "template-hash"
	// The manager labels every container with its Sandbox's namespace.
	namespaceLabel = labelPrefix + "sandbox-namespace"
)

// warmCondition is a status condition as kubectl prints it.
type warmCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func findCondition(conds []warmCondition, typ string) warmCondition {
	for _, c := range conds {
		if c.Type == typ {
			return c
		}
	}
	return warmCondition{Type: typ, Status: "(missing)"}
}

// warmSandbox is the part of a Sandbox, as kubectl prints it in JSON, that
// the warm pool specs look at.
type warmSandbox struct {
	Metadata struct {
		Name              string            `json:"name"`
		UID               string            `json:"uid"`
		Labels            map[string]string `json:"labels"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
		OwnerReferences   []struct {
			Kind       string `json:"kind"`
			Name       string `json:"name"`
			UID        string `json:"uid"`
			Controller *bool  `json:"controller"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		Paused bool `json:"paused"`
	} `json:"spec"`
	Status struct {
		NodeName    string          `json:"nodeName"`
		ContainerID string          `json:"containerID"`
		Conditions  []warmCondition `json:"conditions"`
		WarmPool    *struct {
			Member *struct {
				Name string `json:"name"`
				UID  string `json:"uid"`
			} `json:"member"`
			TemplateHash string `json:"templateHash"`
		} `json:"warmPool"`
	} `json:"status"`
}

// containerID is status.containerID without a runtime prefix.
func (s warmSandbox) containerID() string {
	return strings.TrimPrefix(s.Status.ContainerID, "docker://")
}

// idle is what the pool counts as ready: a live member whose container the
// manager paused.
func (s warmSandbox) idle() bool {
	return s.Metadata.DeletionTimestamp == nil && findCondition(s.Status.Conditions, "Paused").Status == "True"
}

type warmPool struct {
	Metadata struct {
		UID        string `json:"uid"`
		Generation int64  `json:"generation"`
	} `json:"metadata"`
	Spec struct {
		Replicas *int32 `json:"replicas"`
	} `json:"spec"`
	Status struct {
		Replicas           int32           `json:"replicas"`
		ReadyReplicas      int32           `json:"readyReplicas"`
		Selector           string          `json:"selector"`
		ObservedGeneration int64           `json:"observedGeneration"`
		Conditions         []warmCondition `json:"conditions"`
	} `json:"status"`
}

// summary is the pool's status in one comparable line, for Eventually.
func (p warmPool) summary() string {
	ready := findCondition(p.Status.Conditions, "Ready")
	return fmt.Sprintf("replicas=%d readyReplicas=%d Ready=%s/%s current=%t",
		p.Status.Replicas, p.Status.ReadyReplicas, ready.Status, ready.Reason, p.Status.ObservedGeneration == p.Metadata.Generation)
}

// warmPoolSpecs runs a SandboxWarmPool on the deployed operator: the pool
// controller in the webhook Deployment creates the members, the DaemonSet's
// manager provisions and pauses them on the node's Docker and hands one to
// a Sandbox that names the pool (docs/warm-pools.md).
func warmPoolSpecs() {
	Describe("a SandboxWarmPool on the deployed operator", Ordered, Label("warmpool"), func() {
		const (
			ns       = "cluster-warmpool"
			pool     = "pool"
			claimant = "claimant"
			taskID   = "cluster-42"
		)
		var (
			poolUID string
			// Every member seen, by UID: name.
			seen        = map[string]string{}
			claimedUID  string
			claimedName string
			claimedCID  string
		)

		getPool := func(ctx context.Context) (warmPool, error) {
			var p warmPool
			out, err := kubectl(ctx, "get", "sandboxwarmpool", pool, "-n", ns, "-o", "json")
			if err != nil {
				return p, err
			}
			return p, json.Unmarshal([]byte(out), &p)
		}
		// waitPool waits for the pool's status summary to be want.
		waitPool := func(ctx context.Context, want string, timeout time.Duration) {
			GinkgoHelper()
			var last string
			Eventually(func() (string, error) {
				p, err := getPool(ctx)
				last = p.summary()
				return last, err
			}).WithContext(ctx).WithTimeout(timeout).WithPolling(time.Second).Should(Equal(want), func() string {
				return fmt.Sprintf("SandboxWarmPool %s/%s has %q, want %q\n%s", ns, pool, last, want, describePool(ctx, ns, pool))
			})
		}
		getSandbox := func(ctx context.Context, name string) (warmSandbox, error) {
			var s warmSandbox
			out, err := kubectl(ctx, "get", "sandbox", name, "-n", ns, "-o", "json")
			if err != nil {
				return s, err
			}
			return s, json.Unmarshal([]byte(out), &s)
		}
		// members lists the pool's members by the pool's own label (the
		// selector it reports for the scale subresource says the same,
		// checked below), without those being deleted.
		members := func(ctx context.Context) ([]warmSandbox, error) {
			out, err := kubectl(ctx, "get", "sandboxes", "-n", ns, "-l", warmPoolLabel+"="+pool, "-o", "json")
			if err != nil {
				return nil, err
			}
			var list struct{ Items []warmSandbox }
			if err := json.Unmarshal([]byte(out), &list); err != nil {
				return nil, err
			}
			var live []warmSandbox
			for _, s := range list.Items {
				seen[s.Metadata.UID] = s.Metadata.Name
				if s.Metadata.DeletionTimestamp == nil {
					live = append(live, s)
				}
			}
			return live, nil
		}
		// idleMembers waits for want idle members (Paused=True, not being
		// deleted) and no others, and returns them.
		idleMembers := func(ctx context.Context, want int) []warmSandbox {
			GinkgoHelper()
			var got []warmSandbox
			Eventually(func(g Gomega) {
				var err error
				got, err = members(ctx)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(got).To(HaveLen(want), "the pool's live members")
				for _, m := range got {
					g.Expect(m.idle()).To(BeTrue(), "member %s is not idle: %+v", m.Metadata.Name, m.Status.Conditions)
				}
			}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).
				Should(Succeed(), func() string { return describePool(ctx, ns, pool) })
			return got
		}
		// containerState is docker inspect's view of a container on the node.
		containerState := func(ctx context.Context, id string) (string, error) {
			out, err := dockerFind(ctx, "inspect", "--format",
				`running={{.State.Running}} paused={{.State.Paused}} uid={{index .Config.Labels "`+uidLabel+`"}} node={{index .Config.Labels "`+nodeLabel+`"}}`, id)
			return strings.TrimSpace(out), err
		}

		BeforeAll(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout=120s")
			mustKubectl(ctx, "create", "namespace", ns)
			DeferCleanup(func(ctx SpecContext) {
				// The pool first, or its controller replaces the members
				// deleted below.
				_, _ = kubectl(ctx, "delete", "sandboxwarmpools", "--all", "-n", ns, "--wait", "--timeout=60s")
				_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=90s")
				_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
			}, NodeTimeout(3*time.Minute))
		}, NodeTimeout(3*time.Minute))

		It("has the node's manager keep its Lease, held as its node with its Pod-bound token (the Lease policy lets it)", func(ctx SpecContext) {
			// Members spread over the nodes with a live Lease
			// (internal/nodelease); the Lease policy refuses a manager any
			// Lease but its own, so a wrong rendering would leave none.
			for _, node := range workers {
				lease := "code-sandbox-node-" + node
				Eventually(func(ctx context.Context) (string, error) {
					out, err := kubectl(ctx, "get", "lease", lease, "-n", operatorNS, "-o",
						`jsonpath={.spec.holderIdentity} {.metadata.labels.sandbox\.code-sandbox\.dev/node-manager}`)
					return strings.TrimSpace(out), err
				}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Equal(node + " true"))
				renewed := func(ctx context.Context) (string, error) {
					out, err := kubectl(ctx, "get", "lease", lease, "-n", operatorNS, "-o", "jsonpath={.spec.renewTime}")
					return strings.TrimSpace(out), err
				}
				first, err := renewed(ctx)
				Expect(err).NotTo(HaveOccurred())
				// Renewed every 10 s.
				Eventually(renewed).WithContext(ctx).WithTimeout(25 * time.Second).WithPolling(time.Second).ShouldNot(Equal(first))
			}
		}, SpecTimeout(150*time.Second))

		It("fills the pool with paused members bound to the node, Ready/Filled", func(ctx SpecContext) {
			start := time.Now()
			Expect(kubectlApply(ctx, framework.WarmPoolManifest(pool, ns, sampleImage, 2))).To(Succeed())
			waitPool(ctx, "replicas=2 readyReplicas=2 Ready=True/Filled current=true", 2*time.Minute)
			AddReportEntry("warm pool filled", time.Since(start).Round(time.Millisecond).String())

			p, err := getPool(ctx)
			Expect(err).NotTo(HaveOccurred())
			poolUID = p.Metadata.UID
			Expect(p.Status.Selector).To(Equal(warmPoolLabel+"="+pool), "status.selector selects the members (scale subresource)")

			got := idleMembers(ctx, 2)
			for _, m := range got {
				name := m.Metadata.Name
				Expect(name).To(HavePrefix(pool+"-"), "members are named <pool>-<random>")
				Expect(m.Metadata.Labels).To(HaveKey(templateHashLabel), name)
				Expect(m.Metadata.OwnerReferences).To(ContainElement(And(
					HaveField("Kind", "SandboxWarmPool"), HaveField("UID", poolUID), HaveField("Controller", HaveValue(BeTrue())))),
					"member %s is owned by the pool", name)
				Expect(m.Spec.Paused).To(BeTrue(), "member %s has spec.paused", name)
				Expect(m.Status.NodeName).To(BeElementOf(workers), "member %s is bound to a node", name)
				Expect(m.containerID()).NotTo(BeEmpty(), "member %s has no container", name)
				state, err := containerState(ctx, m.containerID())
				Expect(err).NotTo(HaveOccurred(), "member %s's container is not on the node's Docker", name)
				Expect(state).To(Equal(fmt.Sprintf("running=true paused=true uid=%s node=%s", m.Metadata.UID, m.Status.NodeName)),
					"member %s's container is not paused on the node", name)
			}
		}, NodeTimeout(4*time.Minute))

		It("hands a paused member's container to a Sandbox that names the pool, with its env, through the API server", func(ctx SpecContext) {
			Expect(poolUID).NotTo(BeEmpty(), "no pool from the previous spec")
			before, err := members(ctx)
			Expect(err).NotTo(HaveOccurred())
			formerCIDs := map[string]string{} // member UID -> container ID
			for _, m := range before {
				formerCIDs[m.Metadata.UID] = m.containerID()
			}
			Expect(formerCIDs).To(HaveLen(2))

			start := time.Now()
			Expect(kubectlApply(ctx, framework.ClaimManifest(claimant, ns, pool, taskID, 1800))).To(Succeed())
			waitSandboxesReady(ctx, ns, 120*time.Second, claimant)
			AddReportEntry("warm claim apply-to-Ready (kubectl)", time.Since(start).Round(time.Millisecond).String())

			s, err := getSandbox(ctx, claimant)
			Expect(err).NotTo(HaveOccurred())
			claim := findCondition(s.Status.Conditions, "WarmPoolClaim")
			Expect(claim.Status+"/"+claim.Reason).To(Equal("True/WarmPoolClaimed"), func() string {
				return fmt.Sprintf("the claim was not warm (%s)\n%s", claim.Message, describeSandbox(ctx, ns, claimant))
			})
			Expect(s.Status.WarmPool).NotTo(BeNil(), "status.warmPool")
			Expect(s.Status.WarmPool.Member).NotTo(BeNil(), "status.warmPool.member")
			claimedUID, claimedName, claimedCID = s.Status.WarmPool.Member.UID, s.Status.WarmPool.Member.Name, s.containerID()
			Expect(formerCIDs).To(HaveKey(claimedUID), "status.warmPool.member is not one of the pool's idle members")
			Expect(claimedCID).To(Equal(formerCIDs[claimedUID]), "the claimant runs in the member's container")
			Expect(s.Status.WarmPool.TemplateHash).To(Equal(before[0].Metadata.Labels[templateHashLabel]))
			Expect(s.Status.NodeName).To(BeElementOf(workers))

			// The member's container, thawed (the exec below waits for the
			// thaw, a raw docker inspect may catch it just before).
			Eventually(func() (string, error) { return containerState(ctx, claimedCID) }).WithContext(ctx).WithTimeout(30 * time.Second).
				Should(Equal(fmt.Sprintf("running=true paused=false uid=%s node=%s", claimedUID, s.Status.NodeName)))

			out, err := plugin(ctx, nil, "exec", claimant, "-n", ns, "--", "sh", "-c", `printf '%s\n' "$TASK_ID"`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal(taskID+"\n"), "spec.env reaches the exec")
			out, err = plugin(ctx, nil, "exec", claimant, "-n", ns, "--", "find", "/tmp", "/app", "-mindepth", "1")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(BeEmpty(), "nothing was left in /tmp or /app of a warm member")
		}, NodeTimeout(4*time.Minute))

		It("refills to two idle members without the claimed one, whose container stays with the claimant", func(ctx SpecContext) {
			Expect(claimedUID).NotTo(BeEmpty(), "no claim from the previous spec")
			got := idleMembers(ctx, 2)
			for _, m := range got {
				Expect(m.Metadata.UID).NotTo(Equal(claimedUID), "the claimed member is still in the pool")
				Expect(m.containerID()).NotTo(Equal(claimedCID))
			}
			waitPool(ctx, "replicas=2 readyReplicas=2 Ready=True/Filled current=true", time.Minute)
			// The claimed member Sandbox is deleted (member names are
			// random, never reused); its container is not.
			Eventually(func() (string, error) {
				out, err := kubectl(ctx, "get", "sandbox", claimedName, "-n", ns, "--ignore-not-found", "-o", "name")
				return strings.TrimSpace(out), err
			}).WithContext(ctx).WithTimeout(time.Minute).Should(BeEmpty(), "the claimed member Sandbox %s is not deleted", claimedName)
			Expect(containerState(ctx, claimedCID)).To(HavePrefix("running=true paused=false "))
		}, NodeTimeout(4*time.Minute))

		It("scales down through the scale subresource with kubectl scale", func(ctx SpecContext) {
			Expect(poolUID).NotTo(BeEmpty(), "no pool from the first spec")
			mustKubectl(ctx, "scale", "swp/"+pool, "-n", ns, "--replicas=1")
			Expect(mustKubectl(ctx, "get", "sandboxwarmpool", pool, "-n", ns, "-o", "jsonpath={.spec.replicas}")).To(Equal("1"))
			waitPool(ctx, "replicas=1 readyReplicas=1 Ready=True/Filled current=true", time.Minute)
			got := idleMembers(ctx, 1)
			Expect(got[0].Metadata.UID).NotTo(Equal(claimedUID))
			// The scale subresource, as an HPA reads it.
			Expect(mustKubectl(ctx, "get", "sandboxwarmpool", pool, "-n", ns, "--subresource=scale",
				"-o", "jsonpath={.spec.replicas} {.status.replicas} {.status.selector}")).To(Equal("1 1 " + warmPoolLabel + "=" + pool))
			// The member scaled away is gone with its container.
			Eventually(func() ([]string, error) {
				out, err := dockerEach(ctx, "ps", "-aq", "--no-trunc", "--filter", "label="+namespaceLabel+"="+ns)
				return strings.Fields(out), err
			}).WithContext(ctx).WithTimeout(time.Minute).
				Should(ConsistOf(claimedCID, got[0].containerID()), "containers of the namespace: the claimant's and the one member's")
		}, NodeTimeout(3*time.Minute))

		It("deletes its members and their containers when the pool is deleted; the claimant keeps running", func(ctx SpecContext) {
			Expect(claimedUID).NotTo(BeEmpty(), "no claim from the earlier spec")
			mustKubectl(ctx, "delete", "swp/"+pool, "-n", ns, "--wait", "--timeout=60s")
			Eventually(func() (string, error) {
				out, err := kubectl(ctx, "get", "sandboxes", "-n", ns, "-l", warmPoolLabel, "-o", "name")
				return strings.TrimSpace(out), err
			}).WithContext(ctx).WithTimeout(2*time.Minute).Should(BeEmpty(), "member Sandboxes left after the pool was deleted")

			// No container of any member is left, save the one the claimant
			// runs in (it carries the claimed member's labels): the
			// claimant's is the namespace's only container.
			Eventually(func() ([]string, error) {
				out, err := dockerEach(ctx, "ps", "-aq", "--no-trunc", "--filter", "label="+namespaceLabel+"="+ns)
				return strings.Fields(out), err
			}).WithContext(ctx).WithTimeout(time.Minute).
				Should(ConsistOf(claimedCID), "containers of namespace %s other than the claimant's are left", ns)
			Expect(seen).To(HaveKey(claimedUID))
			Expect(len(seen)).To(BeNumerically(">=", 3), "members seen: the two first and a refill")
			for uid, name := range seen {
				out, err := dockerEach(ctx, "ps", "-aq", "--no-trunc", "--filter", "label="+uidLabel+"="+uid)
				Expect(err).NotTo(HaveOccurred())
				if uid == claimedUID {
					Expect(strings.Fields(out)).To(ConsistOf(claimedCID), "the claimed member's container is the claimant's")
				} else {
					Expect(out).To(BeEmpty(), "a container of member %s (%s) is left", name, uid)
				}
			}

			s, err := getSandbox(ctx, claimant)
			Expect(err).NotTo(HaveOccurred())
			ready := findCondition(s.Status.Conditions, "Ready")
			Expect(ready.Status).To(Equal("True"), func() string {
				return fmt.Sprintf("the claimant is not Ready: %s %s\n%s", ready.Reason, ready.Message, describeSandbox(ctx, ns, claimant))
			})
			Expect(s.containerID()).To(Equal(claimedCID))
			Expect(containerState(ctx, claimedCID)).To(HavePrefix("running=true paused=false "))
			out, err := plugin(ctx, nil, "exec", claimant, "-n", ns, "--", "sh", "-c", `printf 'still here %s\n' "$TASK_ID"`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("still here " + taskID + "\n"))
		}, NodeTimeout(4*time.Minute))
	})
}

// describePool is what a platform team would look at when a pool does not
// fill.
func describePool(ctx context.Context, ns, name string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "sandboxwarmpool", name, "-n", ns, "-o", "yaml"},
		{"get", "sandboxes", "-n", ns, "-o", "wide"},
		{"get", "events", "-n", ns, "--sort-by=.lastTimestamp"},
		{"logs", "-n", operatorNS, "-l", "app.kubernetes.io/component=webhook", "--tail=10", "--prefix"},
		{"logs", "-n", operatorNS, "-l", "app.kubernetes.io/component=manager", "--tail=20"},
	} {
		out, err := kubectl(ctx, args...)
		fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}
