//go:build e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// A flood of exec requests with command lines of nearly 1 MiB (the largest the node API accepts), through the real
// exec path (API server, aggregated API, node API of a real manager
// process). Linux refuses such an argument (MAX_ARG_STRLEN is 128 KiB), but
// the manager records every request it accepted, so the history gets one
// record per request. Reading that history, and restarting the manager on
// it, must keep the manager's memory (VmHWM of the process, from
// /proc/PID/status) within 64 MiB of what it was before.
var _ = Describe("exec history under a flood of huge command lines", Ordered, func() {
	const (
		node      = "e2e-history-node"
		namespace = "history-memory-e2e"
		box       = "flood"
		floods    = 5
		// The largest command line the node API accepts (execio.MaxArgBytes,
		// with room for "sh -c true " and each string's NUL): a longer one
		// is refused before it is decoded, and never recorded.
		argBytes  = execio.MaxArgBytes - 64
		maxGrowth = 64 << 10 // KiB
	)
	var (
		agent    *managerProcess
		stateDir string
		client   *sandboxclient.Client
	)

	BeforeAll(func(ctx SpecContext) {
		Expect(removeContainersOf(ctx, node)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(removeContainersOf(ctx, node)).To(Succeed())
		}, NodeTimeout(time.Minute))

		stateDir = filepath.Join(workDir, "history-node-state")
		var err error
		agent, err = startLoopbackNode(node, stateDir)
		Expect(err).NotTo(HaveOccurred())
		// agent is replaced when the spec restarts it; stop whichever runs.
		DeferCleanup(func() error { return agent.stop(15 * time.Second) })

		_, err = kubectl(ctx, "create", "namespace", namespace)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "sandbox", box, "-n", namespace, "--ignore-not-found", "--wait="+fmt.Sprint(agent.exitErr() == nil), "--timeout=60s")
			_, _ = kubectl(ctx, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
		}, NodeTimeout(90*time.Second))

		manifest := fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  image: %s
  nodeName: %s
  command: ["sh", "-c", "exec sleep 86400"]
`, box, namespace, sampleImage, node)
		_, err = runWithStdin(ctx, repoRoot, strings.NewReader(manifest), "kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		kube().WaitSandboxesReady(ctx, namespace, 90*time.Second, nil, box)

		client, err = sandboxclient.New(adminConfig, sandboxclient.Options{UserAgent: "e2e-history-memory"})
		Expect(err).NotTo(HaveOccurred())
	}, NodeTimeout(5*time.Minute))

	readHistory := func(ctx context.Context) ([]history.Record, error) {
		var recs []history.Record
		err := client.History(ctx, sandboxclient.Named(namespace, box), sandboxclient.LogOptions{}, func(r history.Record) error {
			recs = append(recs, r)
			return nil
		})
		return recs, err
	}
	hwm := func() int64 {
		GinkgoHelper()
		kib, err := procMemKiB(agent.cmd.Process.Pid, "VmHWM")
		Expect(err).NotTo(HaveOccurred())
		return kib
	}

	It("reads the history, and restarts on it, within 64 MiB of memory growth", func(ctx SpecContext) {
		By("warming up with a small exec and a history read")
		res, err := client.Exec(ctx, sandboxclient.Named(namespace, box), execio.Request{Command: []string{"true"}}, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(Equal(0))
		_, err = readHistory(ctx)
		Expect(err).NotTo(HaveOccurred())

		By(fmt.Sprintf("flooding the history with %d exec requests of a %d KiB command line", floods, argBytes>>10))
		huge := "true " + strings.Repeat("x", argBytes)
		for range floods {
			_, err := client.Exec(ctx, sandboxclient.Named(namespace, box), execio.Request{Command: []string{"sh", "-c", huge}}, io.Discard, io.Discard)
			// The kernel refuses the argument: an error, or a shell that
			// could not start. Either way the manager recorded it.
			GinkgoWriter.Printf("flood exec: %v\n", err)
		}
		recs, err := readHistory(ctx)
		Expect(err).NotTo(HaveOccurred())
		flooded, longest := 0, 0
		for _, r := range recs {
			if len(r.Command) > 2 && strings.HasPrefix(r.Command[2], "true xxxx") {
				flooded++
				longest = max(longest, len(strings.Join(r.Command, "")))
			}
		}
		// recs is dead from here on, so the collector may free it before
		// the measurement. Checked at the end with the memory, so that all are reported.
		GinkgoWriter.Printf("flood records in the history: %d, longest command %d bytes\n", flooded, longest)

		By("reading the whole history again, measuring the manager's peak RSS")
		pid := agent.cmd.Process.Pid
		Expect(resetPeakRSS(pid)).To(Succeed())
		before := hwm()
		for range 3 {
			_, err = readHistory(ctx)
			Expect(err).NotTo(HaveOccurred())
		}
		after := hwm()
		GinkgoWriter.Printf("manager VmHWM around history reads: before %d KiB, after %d KiB, growth %d KiB\n", before, after, after-before)
		AddReportEntry("manager history read VmHWM growth KiB", after-before)
		// Checked at the end, so that both measurements are reported.
		readGrowth := after - before

		By("restarting the manager on the same state directory")
		Expect(agent.stop(15 * time.Second)).To(Succeed())
		agent, err = startLoopbackNode(node, stateDir)
		Expect(err).NotTo(HaveOccurred())
		// Let its startup (caches, reconciling the Sandbox) settle; none
		// of it reads the history.
		time.Sleep(5 * time.Second)
		before = hwm()

		By("running a command (whose record is the first append after the restart) and reading the history")
		Eventually(func(ctx context.Context) error {
			_, err := client.Exec(ctx, sandboxclient.Named(namespace, box), execio.Request{Command: []string{"true"}}, nil, nil)
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		recs, err = readHistory(ctx)
		Expect(err).NotTo(HaveOccurred())
		after = hwm()
		GinkgoWriter.Printf("restarted manager VmHWM: before %d KiB, after exec and history read %d KiB, growth %d KiB\n", before, after, after-before)
		AddReportEntry("manager restart VmHWM growth KiB", after-before)
		Expect(flooded).To(Equal(floods), "every flood request is in the history")
		Expect(len(recs)).To(BeNumerically(">=", floods+2), "the history after the restart has every record")
		Expect(readGrowth).To(BeNumerically("<", maxGrowth), "a history read grew the manager by %d KiB", readGrowth)
		Expect(after-before).To(BeNumerically("<", maxGrowth), "the restarted manager grew by %d KiB", after-before)
		Expect(longest).To(BeNumerically("<=", 8<<10), "the recorded command is cut (to 4 KiB and a marker)")
	})
})
