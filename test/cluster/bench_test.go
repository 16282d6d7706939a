//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// benchSpecs measures Sandbox create-to-Ready through the real cluster
// (kubectl apply, the API server, the webhook, the DaemonSet's manager,
// Docker, the status write, kubectl wait's watch) against a raw `docker
// create` + `docker start` of the same image in the same run, and reports
// the ratio of the medians. The goal is at most 1.3×; it is reported, not
// enforced, because on a shared 2-core machine the noise is larger than
// the margin.
func benchSpecs() {
	Describe("create-to-Ready against raw Docker", Ordered, Label("bench"), func() {
		const (
			ns     = "cluster-bench"
			rounds = 5
		)
		BeforeAll(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout=120s")
			mustKubectl(ctx, "create", "namespace", ns)
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=90s")
				_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
			}, NodeTimeout(3*time.Minute))
		}, NodeTimeout(3*time.Minute))

		It("reports the ratio of the medians", func(ctx SpecContext) {
			var cluster, raw []time.Duration
			for i := range rounds {
				name := fmt.Sprintf("bench-%d", i)
				start := time.Now()
				Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  image: %s
  imagePullPolicy: Never
  activeDeadlineSeconds: 600
`, name, ns, sampleImage))).To(Succeed())
				_, err := kubectl(ctx, "wait", "--for=condition=Ready", "sandbox/"+name, "-n", ns, "--timeout=120s")
				Expect(err).NotTo(HaveOccurred(), describeSandbox(ctx, ns, name))
				cluster = append(cluster, time.Since(start))
				mustKubectl(ctx, "delete", "sandbox/"+name, "-n", ns, "--wait", "--timeout=60s")

				rawName := fmt.Sprintf("code-sandbox-cluster-bench-%d-%d", GinkgoRandomSeed(), i)
				start = time.Now()
				id, err := docker(ctx, "create", "--name", rawName, "--network", "none", "--read-only", "--cap-drop", "ALL",
					"--security-opt", "no-new-privileges", "--pids-limit", "256", "--memory", "512m", "--memory-swap", "512m",
					"--init", "--user", "65534:65534", sampleImage, "sleep", "600")
				Expect(err).NotTo(HaveOccurred())
				_, err = docker(ctx, "start", strings.TrimSpace(id))
				Expect(err).NotTo(HaveOccurred())
				raw = append(raw, time.Since(start))
				_, _ = docker(context.WithoutCancel(ctx), "rm", "-f", rawName)
			}
			mc, mr := median(cluster), median(raw)
			ratio := float64(mc) / float64(mr)
			AddReportEntry("create-to-Ready", fmt.Sprintf("cluster median %v (%v), raw docker create+start median %v (%v), ratio %.2f× (goal ≤ 1.3×)",
				mc.Round(time.Millisecond), cluster, mr.Round(time.Millisecond), raw, ratio))
			fmt.Fprintf(GinkgoWriter, "create-to-Ready: cluster %v, raw %v, ratio %.2f×\n", mc, mr, ratio)
		}, NodeTimeout(10*time.Minute))
	})
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
