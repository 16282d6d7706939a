//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

// A SandboxWarmPool driven with kubectl as a user would: the pool controller
// (manager --role control-plane) keeps its members created, started and paused on
// whichever node managers run (nothing is pinned: a member may land on any
// node, and the claimant is claimed by the node that holds an idle member);
// a Sandbox naming the pool takes over an idle member's container, gets its
// env on every exec and a clean /app, /tmp and history; members themselves
// refuse exec; the pool refills, scales to zero and is deleted.
var _ = Describe("warm pools (SandboxWarmPool)", Ordered, func() {
	const (
		namespace = "warm-pool-e2e"
		pool      = "py-pool"
		claimant  = "agent-42"
		poolLabel = framework.LabelPrefix + "warm-pool"
	)
	var (
		// member is the member whose container the claimant took over,
		// memberUID its UID, and containerID the claimant's container.
		member, memberUID, containerID string
	)

	ns := func(args ...string) []string { return append(args, "-n", namespace) }
	get := func(ctx context.Context, what, jsonpath string) (string, error) {
		return kubectl(ctx, ns("get", what, "-o", "jsonpath="+jsonpath)...)
	}
	// members lists the names of the pool's member Sandboxes, sorted.
	members := func(ctx context.Context) ([]string, error) {
		out, err := kubectl(ctx, ns("get", "sandboxes", "-l", poolLabel+"="+pool, "-o", "jsonpath={.items[*].metadata.name}")...)
		names := strings.Fields(out)
		sort.Strings(names)
		return names, err
	}
	// idleMembers lists the members whose Paused condition is True.
	idleMembers := func(ctx context.Context) ([]string, error) {
		out, err := kubectl(ctx, ns("get", "sandboxes", "-l", poolLabel+"="+pool, "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Paused")].status}{"\n"}{end}`)...)
		var idle []string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == "True" {
				idle = append(idle, f[0])
			}
		}
		sort.Strings(idle)
		return idle, err
	}
	describe := func(ctx context.Context) string {
		var b strings.Builder
		for _, args := range [][]string{
			{"get", "sandboxwarmpools", "-o", "yaml"},
			{"get", "sandboxes", "-o", "yaml"},
			{"get", "events"},
		} {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			out, err := kubectl(ctx, ns(args...)...)
			cancel()
			fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
			if err != nil {
				fmt.Fprintf(&b, "(%v)\n", err)
			}
		}
		return b.String()
	}
	// plugin runs kubectl-sandbox as the suite's admin and returns its
	// outputs and exit code.
	plugin := func(ctx context.Context, args ...string) (stdout, stderr string, code int) {
		GinkgoHelper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, pluginBin, append([]string{"--kubeconfig", kubeconfig, "-n", namespace}, args...)...)
		cmd.WaitDelay = 5 * time.Second
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exitErr *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exitErr):
			code = exitErr.ExitCode()
		default:
			Fail(fmt.Sprintf("running kubectl-sandbox %v: %v", args, err))
		}
		return out.String(), errOut.String(), code
	}

	BeforeAll(func(ctx SpecContext) {
		_, err := kubectl(ctx, "create", "namespace", namespace)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			if CurrentSpecReport().Failed() {
				fmt.Fprintln(GinkgoWriter, describe(ctx))
			}
			// The Sandboxes go first, while the managers still run; no
			// wait for the namespace: envtest runs no namespace
			// controller.
			_, _ = kubectl(ctx, ns("delete", "sandbox", claimant, "--ignore-not-found", "--timeout=60s")...)
			_, _ = kubectl(ctx, ns("delete", "sandboxwarmpool", pool, "--ignore-not-found", "--timeout=60s")...)
			_, _ = kubectl(ctx, ns("delete", "sandboxes", "-l", poolLabel+"="+pool, "--ignore-not-found", "--timeout=60s")...)
			_, _ = kubectl(ctx, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
		}, NodeTimeout(4*time.Minute))
	}, NodeTimeout(time.Minute))

	It("fills a pool of two with idle (paused) members and shows it with kubectl get swp", func(ctx SpecContext) {
		Expect(kube().Apply(ctx, framework.WarmPoolManifest(pool, namespace, sampleImage, 2))).To(Succeed())
		Eventually(func() (string, error) {
			return get(ctx, "swp/"+pool, "{.status.readyReplicas}")
		}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal("2"), func() string { return describe(ctx) })
		Expect(idleMembers(ctx)).To(HaveLen(2))

		out, err := kubectl(ctx, ns("get", "swp", pool)...)
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2), out)
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "DESIRED", "READY", "IMAGE", "AGE"}), out)
		Expect(strings.Fields(lines[1])[:4]).To(Equal([]string{pool, "2", "2", sampleImage}), out)
	}, NodeTimeout(3*time.Minute))

	It("hands an idle member's container to a Sandbox that names the pool, with its env and nothing left behind", func(ctx SpecContext) {
		idle, err := idleMembers(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(idle).To(HaveLen(2))
		Expect(kube().Apply(ctx, framework.ClaimManifest(claimant, namespace, pool, "42", 600))).To(Succeed())
		kube().WaitSandboxesReady(ctx, namespace, 90*time.Second, func() string { return describe(ctx) }, claimant)

		out, err := get(ctx, "sandbox/"+claimant,
			`{.status.conditions[?(@.type=="WarmPoolClaim")].status} {.status.conditions[?(@.type=="WarmPoolClaim")].reason} {.status.warmPool.member.name} {.status.warmPool.member.uid} {.status.containerID}`)
		Expect(err).NotTo(HaveOccurred())
		f := strings.Fields(out)
		Expect(f).To(HaveLen(5), out)
		Expect(f[:2]).To(Equal([]string{"True", "WarmPoolClaimed"}), describe(ctx))
		member, memberUID, containerID = f[2], f[3], f[4]
		Expect(idle).To(ContainElement(member), "the claimant took a member that was not idle")
		Expect(containerID).NotTo(BeEmpty())

		// The container is the member's: named and labelled with its UID.
		out, err = docker(ctx, "inspect", "--format", `{{index .Config.Labels "`+uidLabel+`"}} {{.State.Running}} {{.State.Paused}}`, containerID)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal(memberUID + " true false"))

		stdout, stderr, code := plugin(ctx, "exec", claimant, "--", "sh", "-c", "echo $TASK_ID; ls -A /app /tmp")
		Expect(code).To(BeZero(), stderr)
		Expect(stdout).To(Equal("42\n/app:\n\n/tmp:\n"))

		By("the claimant's history holds only that command")
		stdout, stderr, code = plugin(ctx, "logs", claimant, "--history")
		Expect(code).To(BeZero(), stderr)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		Expect(lines).To(HaveLen(1), stdout)
		Expect(lines[0]).To(MatchRegexp(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ exit=0 \S+ sh -c 'echo \$TASK_ID; ls -A /app /tmp'$`))
	}, NodeTimeout(3*time.Minute))

	It("refuses exec on an idle member, naming the warm pool", func(ctx SpecContext) {
		var idle []string
		Eventually(func() ([]string, error) {
			var err error
			idle, err = idleMembers(ctx)
			return idle, err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).ShouldNot(BeEmpty())
		target := idle[0]
		Expect(target).NotTo(Equal(member))

		_, stderr, code := plugin(ctx, "exec", target, "--", "true")
		Expect(code).To(Equal(1), stderr)
		Expect(stderr).To(ContainSubstring("member of warm pool " + pool))
		Expect(stderr).To(ContainSubstring("spec.warmPoolRef.name " + pool))

		By("the refusal is a Conflict with the cause WarmPoolMember, for exec and for files alike")
		client, err := sandboxclient.New(adminConfig, sandboxclient.Options{UserAgent: "e2e-warm-pool"})
		Expect(err).NotTo(HaveOccurred())
		for what, call := range map[string]func() error{
			"exec": func() error {
				_, err := client.Exec(ctx, sandboxclient.Named(namespace, target), execio.Request{Command: []string{"true"}}, nil, nil)
				return err
			},
			"files": func() error {
				_, err := client.UploadFile(ctx, sandboxclient.Named(namespace, target), "/tmp/x", 0o644, strings.NewReader("x"))
				return err
			},
		} {
			err := call()
			var apiErr *sandboxclient.APIError
			Expect(errors.As(err, &apiErr)).To(BeTrue(), "%s: %v", what, err)
			Expect(apiErr.Code).To(BeEquivalentTo(409), what)
			Expect(apiErr.Details).NotTo(BeNil(), what)
			var causes []string
			for _, c := range apiErr.Details.Causes {
				causes = append(causes, string(c.Type))
			}
			Expect(causes).To(ContainElement("WarmPoolMember"), what)
		}

		By("the member is still idle and untouched")
		out, err := get(ctx, "sandbox/"+target, `{.status.conditions[?(@.type=="Paused")].status}`)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("True"))
	}, NodeTimeout(3*time.Minute))

	It("refills the pool and deletes the claimed member, while the claimant keeps its container", func(ctx SpecContext) {
		Eventually(func(g Gomega) {
			ready, err := get(ctx, "swp/"+pool, "{.status.readyReplicas}")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ready).To(Equal("2"))
			names, err := members(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(names).To(HaveLen(2))
			g.Expect(names).NotTo(ContainElements(member, claimant))
			out, err := kubectl(ctx, ns("get", "sandbox", member, "--ignore-not-found", "-o", "name")...)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(BeEmpty(), "the claimed member's Sandbox is still there")
		}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), func() string { return describe(ctx) })

		out, err := get(ctx, "sandbox/"+claimant, `{.status.conditions[?(@.type=="Ready")].status} {.status.containerID}`)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("True " + containerID))
		// Deleting the member did not take the container with it.
		out, err = docker(ctx, "inspect", "--format", "{{.State.Running}} {{.State.Paused}}", containerID)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal("true false"))
		stdout, stderr, code := plugin(ctx, "exec", claimant, "--", "sh", "-c", "echo $TASK_ID")
		Expect(code).To(BeZero(), stderr)
		Expect(stdout).To(Equal("42\n"))
	}, NodeTimeout(3*time.Minute))

	It("scales to zero with kubectl scale, and deletes the pool", func(ctx SpecContext) {
		_, err := kubectl(ctx, ns("scale", "swp", pool, "--replicas", "0")...)
		Expect(err).NotTo(HaveOccurred())
		Eventually(members).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).
			Should(BeEmpty(), func() string { return describe(ctx) })
		Eventually(func() (string, error) {
			return get(ctx, "swp/"+pool, "{.status.replicas} {.status.readyReplicas}")
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("0 0"))
		out, err := kubectl(ctx, ns("get", "swp", pool)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(MatchRegexp(`(?m)^` + regexp.QuoteMeta(pool) + `\s+0\s+0\s+` + regexp.QuoteMeta(sampleImage) + `\s`))

		_, err = kubectl(ctx, ns("delete", "swp", pool, "--timeout=60s")...)
		Expect(err).NotTo(HaveOccurred())
		out, err = kubectl(ctx, ns("get", "swp", "--ignore-not-found", "-o", "name")...)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(BeEmpty())

		By("the claimant outlives its pool, and deleting it removes the container it took over")
		out, err = get(ctx, "sandbox/"+claimant, `{.status.conditions[?(@.type=="Ready")].status}`)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("True"))
		_, err = kubectl(ctx, ns("delete", "sandbox", claimant, "--timeout=60s")...)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() (string, error) {
			return docker(ctx, "ps", "-aq", "--filter", "label="+uidLabel+"="+memberUID)
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeEmpty())
	}, NodeTimeout(4*time.Minute))
})
