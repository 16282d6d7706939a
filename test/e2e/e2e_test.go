//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

// The sample is the first thing a new user applies, so it is what the
// lifecycle test drives, through the same commands the README shows.
var _ = Describe("The sample Sandbox", Ordered, func() {
	var name, uid, containerID string

	AfterAll(func(ctx SpecContext) {
		// Leaves nothing behind for the other specs when one above failed
		// half-way; the suite's cleanup removes stray containers. Waiting
		// only makes sense while a manager can release the finalizer.
		wait := "--wait=" + fmt.Sprint(manager.exitErr() == nil)
		_, _ = kubectl(ctx, "delete", "-f", samplesDir, "--ignore-not-found", wait, "--timeout=60s")
	}, NodeTimeout(90*time.Second))

	It("becomes Ready after kubectl apply", func(ctx SpecContext) {
		out, err := kubectl(ctx, "apply", "-f", samplesDir, "-o", "name")
		Expect(err).NotTo(HaveOccurred())
		// The README's quick start applies them all: a Sandbox, a
		// SandboxQuota, a SandboxWarmPool and a Sandbox claimed from it.
		Expect(strings.Fields(out)).To(ConsistOf(
			"sandbox.sandbox.code-sandbox.dev/sandbox-sample",
			"sandbox.sandbox.code-sandbox.dev/sandbox-from-pool",
			"sandboxquota.sandbox.code-sandbox.dev/sandboxquota-sample",
			"sandboxwarmpool.sandbox.code-sandbox.dev/sandboxwarmpool-sample",
		), "config/samples:\n%s", out)
		name = "sandbox-sample"

		for _, sbx := range []string{name, "sandbox-from-pool"} {
			kube().WaitSandboxesReady(ctx, "", 60*time.Second, nil, sbx)
		}
		_, err = kubectl(ctx, "wait", "--for=jsonpath={.status.readyReplicas}=2", "sandboxwarmpool/sandboxwarmpool-sample", "--timeout=60s")
		Expect(err).NotTo(HaveOccurred(), "the sample warm pool did not fill")

		uid, err = kubectl(ctx, "get", "sandbox/"+name, "-o", "jsonpath={.metadata.uid}")
		Expect(err).NotTo(HaveOccurred())
		Expect(uid).NotTo(BeEmpty())
		containerID, err = kubectl(ctx, "get", "sandbox/"+name, "-o", "jsonpath={.status.containerID}")
		Expect(err).NotTo(HaveOccurred())
		Expect(containerID).NotTo(BeEmpty(), "a Ready Sandbox should report status.containerID")
	}, NodeTimeout(2*time.Minute))

	It("is listed by kubectl get with its status, image and node", func(ctx SpecContext) {
		out, err := kubectl(ctx, "get", "sandbox", name)
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2), "expected a header and one row:\n%s", out)
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "READY", "REASON", "IMAGE", "NODE", "AGE"}))
		row := strings.Fields(lines[1])
		Expect(row).To(HaveLen(6), "every column should be filled in:\n%s", out)
		Expect(row[:5]).To(Equal([]string{name, "True", "Running", sampleImage, nodeName}))
	}, NodeTimeout(time.Minute))

	It("runs as exactly one container labelled with the Sandbox's UID", func(ctx SpecContext) {
		out, err := docker(ctx, "ps", "--no-trunc", "--filter", "label="+uidLabel+"="+uid, "--format", "{{.ID}} {{.Label \""+nodeLabel+"\"}}")
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(1), "expected exactly one running container for UID %s:\n%s", uid, out)
		fields := strings.Fields(lines[0])
		Expect(fields).To(HaveLen(2))
		Expect(fields[0]).To(HavePrefix(containerID), "status.containerID should name the running container")
		Expect(fields[1]).To(Equal(nodeName))
	}, NodeTimeout(time.Minute))

	It("runs Python as nobody", func(ctx SpecContext) {
		out, err := docker(ctx, "exec", containerID, "python3", "-c", "print(1+1)")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal("2"))

		out, err = docker(ctx, "exec", containerID, "id", "-u")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal("65534"))
	}, NodeTimeout(time.Minute))

	It("is gone with its container after kubectl delete", func(ctx SpecContext) {
		_, err := kubectl(ctx, "delete", "-f", samplesDir, "--wait", "--timeout=60s")
		Expect(err).NotTo(HaveOccurred(), "deleting the Sandbox failed:\n%s", describeSandbox(ctx, name))
		// The finalizer is only released once the container is gone, so
		// there is nothing to wait for here.
		framework.ExpectSandboxGone(ctx, kube(), docker, "", name, uid)
	}, NodeTimeout(2*time.Minute))
})

// The API server rejects these (the CRD's schema and CEL rules), so the user
// gets the error from kubectl and nothing is created.
var _ = Describe("An invalid Sandbox", func() {
	const name = "invalid-sandbox"

	DescribeTable("is refused by kubectl apply with the offending field named",
		func(ctx SpecContext, spec, field string) {
			manifest := fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: default
spec: %s
`, name, spec)
			_, err := runWithStdin(ctx, repoRoot, strings.NewReader(manifest), "kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-")
			Expect(err).To(HaveOccurred(), "kubectl apply accepted:\n%s", manifest)
			var exitErr *exec.ExitError
			Expect(errors.As(err, &exitErr)).To(BeTrue(), "kubectl did not run: %v", err)
			Expect(exitErr.ExitCode()).NotTo(BeZero())
			Expect(err.Error()).To(ContainSubstring(field))

			_, err = kubectl(ctx, "get", "sandbox/"+name, "-n", "default")
			Expect(err).To(MatchError(ContainSubstring("NotFound")), "the invalid Sandbox was stored")
		},
		Entry("memory that is not a quantity", `{image: code-sandbox-test/busybox:1, resources: {memory: lots}}`, "spec.resources.memory"),
		Entry("an unknown runtime", `{image: code-sandbox-test/busybox:1, runtime: docker}`, "spec.runtime"),
		Entry("root as the user", `{image: code-sandbox-test/busybox:1, user: "0:0"}`, "spec.user"),
		Entry("no image", `{}`, "spec.image"),
	)
})

// describeSandbox gathers what a user would look at when a Sandbox in the
// kubeconfig's namespace misbehaves.
func describeSandbox(ctx context.Context, name string) string {
	return kube().DescribeSandbox(ctx, "", name)
}
