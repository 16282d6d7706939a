/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerbackend

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/cgroupcpu"
)

var _ = Describe("sandbox metrics on the Docker backend", Label("docker"), func() {
	It("reads a sandbox's figures, also while it is paused, without waking it, for its owner only", func(ctx SpecContext) {
		b := poolBackend(0)
		caller := contract.Caller{ID: "metrics-test"}
		sb, err := b.Create(ctx, caller, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		m, err := b.Metrics(ctx, caller, sb.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(m.ContainerID).To(Equal(sb.ID))
		Expect(m.Paused).To(BeFalse())
		Expect(m.MemoryLimitBytes).To(BeNumerically(">", 0))
		Expect(m.CPULimitCores).To(BeNumerically(">", 0))
		Expect(m.Pids).To(BeNumerically(">=", 1))
		Expect(m.WritablePaths).To(HaveLen(3))
		Expect(m.Network).To(BeNil(), "a sandbox without network access has no interface to count")

		_, err = b.Metrics(ctx, contract.Caller{ID: "mallory"}, sb.ID)
		Expect(errors.Is(err, contract.ErrNotFound)).To(BeTrue(), "%v", err)

		cts := containersOfRun(ctx, b)
		Expect(cts).To(HaveLen(1))
		// Each writable path's own use, read from the host (this server
		// runs as root beside the Engine), also while paused.
		_, code := shIn(ctx, b, caller, sb.ID, `dd if=/dev/zero of=/tmp/f bs=1M count=4 2>/dev/null`)
		Expect(code).To(Equal(0))
		Expect(b.driver.docker.Pause(ctx, cts[0].ID)).To(Succeed())
		m, err = b.Metrics(ctx, caller, sb.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(m.Paused).To(BeTrue())
		Expect(m.PathsSource).To(Equal("host-statfs"))
		perPath := map[string]int64{}
		for _, p := range m.WritablePaths {
			Expect(p.UsedBytes).NotTo(BeNil(), p.Path)
			perPath[p.Path] = *p.UsedBytes
		}
		Expect(perPath["/tmp"]).To(BeNumerically("~", 4<<20, 256<<10))
		Expect(perPath["/var/tmp"]).To(BeNumerically("<", 64<<10))
		ct, err := b.driver.docker.Inspect(context.Background(), cts[0].ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(ct.State.Paused).To(BeTrue(), "reading metrics must not unpause")
		Expect(b.driver.docker.Unpause(ctx, cts[0].ID)).To(Succeed())
	}, SpecTimeout(2*60e9))

	It("shows a CPU-bound loop near its CPU limit and a memory hog near its memory limit", func(ctx SpecContext) {
		b := poolBackend(0)
		caller := contract.Caller{ID: "metrics-hog"}
		const memLimit = 128 << 20
		sb, err := b.Create(ctx, caller, contract.CreateRequest{Image: testenv.PythonImage, Network: contract.NetworkNone,
			Lifetime: time.Hour, NanoCPUs: 500_000_000, MemoryBytes: memLimit})
		Expect(err).NotTo(HaveOccurred())
		cts := containersOfRun(ctx, b)
		Expect(cts).To(HaveLen(1))
		// The loop and the hog run as one command until /tmp/stop exists
		// (30 s at most); the metrics are read while it runs.
		done := make(chan error, 1)
		go func() {
			_, err := b.Exec(ctx, caller, sb.ID, execio.Request{Command: []string{"python3", "-c",
				"import os, time\nb = bytearray(110 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nend = time.time() + 30\nwhile time.time() < end and not os.path.exists('/tmp/stop'): pass"}}, nil)
			done <- err
		}()
		// On a busy host the loop gets less than its limit: then the
		// figure must track what the cgroup really used.
		Eventually(func(g Gomega) {
			var m contract.Metrics
			var err error
			truth, known := cgroupcpu.During(cts[0].ID, func() { m, err = b.Metrics(ctx, caller, sb.ID) })
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(m.CPULimitCores).To(BeNumerically("~", 0.5, 0.001))
			g.Expect(cgroupcpu.NearLimit(m.CPUCores, 0.5, truth, known)).To(Succeed())
			g.Expect(m.CPUPercentOfLimit).To(BeNumerically("~", 100*m.CPUCores/0.5, 0.5))
			g.Expect(m.MemoryLimitBytes).To(Equal(int64(memLimit)))
			g.Expect(m.MemoryBytes).To(BeNumerically(">=", 110<<20))
			g.Expect(m.MemoryBytes).To(BeNumerically("<=", memLimit))
			GinkgoWriter.Printf("sandbox_metrics: cpu %.3f of %g cores (%.0f%%), memory %d of %d bytes\n",
				m.CPUCores, m.CPULimitCores, m.CPUPercentOfLimit, m.MemoryBytes, m.MemoryLimitBytes)
		}).WithContext(ctx).WithTimeout(25 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		_, code := shIn(ctx, b, caller, sb.ID, "touch /tmp/stop")
		Expect(code).To(Equal(0))
		Expect(<-done).To(Succeed())
	}, SpecTimeout(2*60e9))
})
