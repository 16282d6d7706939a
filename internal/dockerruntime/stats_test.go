/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/cgroupcpu"
)

var _ = Describe("Stats", dockerLabel, func() {
	It("shows a CPU-bound loop near its CPU limit", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, func(s *Spec) {
			s.NanoCPUs = 500_000_000
			s.Command = []string{"sh", "-c", "while :; do :; done"}
		})
		// The first sample may straddle the loop's start. On a busy host
		// the loop gets less than its limit: then the figure must track
		// what the cgroup really used (cgroupcpu.NearLimit).
		var st Stats
		Eventually(func(g Gomega) {
			var err error
			truth, known := cgroupcpu.During(ct.ID, func() { st, err = rt.Stats(ctx, ct.ID) })
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cgroupcpu.NearLimit(st.CPUCores, 0.5, truth, known)).To(Succeed())
		}).WithContext(ctx).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(st.CPULimitCores).To(BeNumerically("~", 0.5, 0.001))
		Expect(st.Paused).To(BeFalse())
		Expect(st.Pids).To(BeNumerically(">=", 1))
		Expect(st.PidsLimit).To(Equal(DefaultPids))
	}, SpecTimeout(60*time.Second))

	It("shows a memory hog near its memory limit, and tmpfs use as the writable paths' use", func(ctx SpecContext) {
		const limit = 128 << 20
		ct, _ := startSandbox(ctx, func(s *Spec) {
			s.Image = pythonImage
			s.MemoryBytes = limit
			s.Command = []string{"python3", "-c", "import time\nb = bytearray(112 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(3600)"}
		})
		Eventually(func(g Gomega) {
			st, err := rt.Stats(ctx, ct.ID)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.MemoryLimitBytes).To(Equal(int64(limit)))
			g.Expect(st.MemoryBytes).To(BeNumerically(">=", 112<<20))
			g.Expect(st.MemoryBytes).To(BeNumerically("<=", limit))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())

		before, err := rt.Stats(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(before.WritableUsedSource).To(BeElementOf(WritableUsedShmem, WritableUsedCacheNotFile))
		paths := map[string]int64{}
		for _, p := range before.WritablePaths {
			paths[p.Path] = p.LimitBytes
		}
		Expect(paths).To(HaveKeyWithValue("/tmp", DefaultDiskBytes))
		Expect(paths).To(HaveKeyWithValue("/var/tmp", DefaultDiskBytes))
		Expect(paths).To(HaveKey(DefaultWorkingDir))
		out := runCmd(ctx, ct.ID, execio.Request{Command: []string{"dd", "if=/dev/zero", "of=/tmp/f", "bs=1M", "count=8"}})
		Expect(out.Err).NotTo(HaveOccurred())
		Expect(out.Result.ExitCode).To(BeZero(), out.Stderr)
		after, err := rt.Stats(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(after.WritableUsedBytes - before.WritableUsedBytes).To(BeNumerically("~", 8<<20, 1<<20))
	}, SpecTimeout(90*time.Second))

	It("reads a paused container without waking it", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, func(s *Spec) {
			s.NanoCPUs = 500_000_000
			s.Command = []string{"sh", "-c", "while :; do :; done"}
		})
		Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
		// Docker's first CPU sample of a reading may predate the pause by
		// up to its collection interval (a second); the next is all frozen.
		var st Stats
		Eventually(func(g Gomega) {
			var err error
			st, err = rt.Stats(ctx, ct.ID)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.Paused).To(BeTrue())
			g.Expect(st.CPUCores).To(BeNumerically("<", 0.05), "a frozen loop uses no CPU")
		}).WithContext(ctx).WithTimeout(10 * time.Second).Should(Succeed())
		Expect(st.MemoryBytes).To(BeNumerically(">", 0))
		Expect(st.MemoryLimitBytes).To(Equal(DefaultMemoryBytes))
		sample, err := rt.Sample(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(sample.CPUTotalNanos).To(BeNumerically(">", 0), "the loop ran before the pause")
		Expect(sample.MemoryBytes).To(BeNumerically(">", 0))
		again, err := rt.Inspect(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(again.State.Paused).To(BeTrue(), "reading stats must not unpause")
	}, SpecTimeout(60*time.Second))

	It("reads each writable path's use: from the host (also paused), else from the helper while running, never by waking it", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		r := sh(ctx, ct.ID, `dd if=/dev/zero of=/tmp/f bs=1M count=8 2>/dev/null && dd if=/dev/zero of=/app/g bs=1M count=3 2>/dev/null && echo ok`)
		Expect(r.Stdout).To(Equal("ok\n"), r.String())
		used := func(st Stats) map[string]int64 {
			out := map[string]int64{}
			for _, p := range st.WritablePaths {
				out[p.Path] = p.UsedBytes
			}
			return out
		}
		expectFigures := func(m map[string]int64) {
			GinkgoHelper()
			Expect(m["/tmp"]).To(BeNumerically("~", 8<<20, 256<<10))
			Expect(m[DefaultWorkingDir]).To(BeNumerically("~", 3<<20, 256<<10))
			Expect(m["/var/tmp"]).To(BeNumerically("<", 64<<10))
		}
		// This suite runs as root in the Engine's PID namespace: the
		// host side sees the tmpfs mounts.
		st, err := rt.Stats(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.PathsSource).To(Equal(PathsHostStatfs))
		expectFigures(used(st))

		Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
		st, err = rt.Stats(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Paused).To(BeTrue())
		Expect(st.PathsSource).To(Equal(PathsHostStatfs))
		expectFigures(used(st))
		// Where the host cannot see them (the manager's pod, no hostPID),
		// a paused sandbox's paths are unavailable rather than woken.
		paused := Stats{WritablePaths: writablePaths(map[string]string{"/tmp": "size=1", "/app": "size=1", "/var/tmp": "size=1"})}
		rt.pathUsage(ctx, ct.ID, ct.ID, 0, false, &paused)
		Expect(paused.PathsSource).To(Equal(PathsUnavailable))
		Expect(used(paused)).To(HaveKeyWithValue("/tmp", int64(-1)))
		info, err := rt.Inspect(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(info.State.Paused).To(BeTrue(), "reading paths must not unpause")
		Expect(rt.Unpause(ctx, ct.ID)).To(Succeed())

		// Running, without the host's view: the helper's statfs, bounded
		// by each path's limit.
		running := Stats{WritablePaths: writablePaths(map[string]string{"/tmp": "size=67108864", "/app": "size=67108864", "/var/tmp": "size=67108864"})}
		rt.pathUsage(ctx, ct.ID, ct.ID, 0, true, &running)
		Expect(running.PathsSource).To(Equal(PathsHelperStatfs))
		expectFigures(used(running))

		// A PID is only trusted for the container its cgroup names.
		full, err := rt.Docker().ContainerInspect(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		_, ok := hostPathUsage(full.State.Pid, strings.Repeat("f", 64), []string{"/tmp"})
		Expect(ok).To(BeFalse())
		_, ok = hostPathUsage(1, full.ID, []string{"/tmp"})
		Expect(ok).To(BeFalse())
	}, SpecTimeout(60*time.Second))

	It("reports a container that does not exist as not found", func(ctx SpecContext) {
		_, err := rt.Stats(ctx, "0123456789abcdef0123")
		Expect(err).To(MatchError(ErrNotFound))
	})
})
