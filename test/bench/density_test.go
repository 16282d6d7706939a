/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// The figures of this file take minutes, so they run only when asked:
//
//	CODE_SANDBOX_BENCH_DENSITY=500      idle (paused) sandboxes on this node, and as
//	CODE_SANDBOX_BENCH_DENSITY_RAW=100  many raw paused containers (default: the same number)
//	CODE_SANDBOX_BENCH_AGENTS=100       agents, each looping exec on its own sandbox
//	CODE_SANDBOX_BENCH_AGENTS_SECONDS=20  per path and round (two rounds, alternating)
//
// Every container they create carries rawNode's label, so that the
// manager's collector leaves it alone and teardown (or the next run's
// setup) removes it should the benchmark die part way.

// envInt reads a positive integer from name, or 0 when it is unset.
func envInt(b *testing.B, name string) int {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// loadavg is /proc/loadavg's first three fields, to print next to a figure.
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// fanOut runs f(i) for i in [0, n) on workers goroutines and returns
// the errors joined.
func fanOut(n, workers int, f func(i int) error) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// fleet is the containers one benchmark made; remove removes them all.
type fleet struct {
	mu  sync.Mutex
	ids []string
}

func (f *fleet) add(id string) {
	f.mu.Lock()
	f.ids = append(f.ids, id)
	f.mu.Unlock()
}

func (f *fleet) remove(e *benchEnv) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f.mu.Lock()
	ids := slices.Clone(f.ids)
	f.ids = nil
	f.mu.Unlock()
	return fanOut(len(ids), 4, func(i int) error { return e.removeRaw(ctx, ids[i]) })
}

// oursIdle creates a sandbox through the runtime and leaves it as a warm
// member is left: its resident helper started and health-checked, then
// frozen.
func (e *benchEnv) oursIdle(ctx context.Context, tag string, pause bool) (string, error) {
	uid := fmt.Sprintf("%s-%s-%d", tag, runID, seq.Add(1))
	ct, err := e.docker.CreateAndStart(ctx, dockerruntime.Spec{
		Owner: dockerruntime.Owner{UID: uid, Namespace: namespace, Name: uid, Node: rawNode},
		Image: e.image,
	})
	if err != nil {
		return ct.ID, err
	}
	if err := e.docker.CheckHealth(ctx, ct.ID); err != nil {
		return ct.ID, err
	}
	if pause {
		return ct.ID, e.docker.Pause(ctx, ct.ID)
	}
	return ct.ID, nil
}

// rawIdle is the baseline: the same container config created, started
// and paused with the plain client, no helper.
func (e *benchEnv) rawIdle(ctx context.Context, tag string, pause bool) (string, error) {
	_, id, err := e.rawCreateToRunning(ctx, fmt.Sprintf("%s-%d", tag, seq.Add(1)))
	if err != nil || !pause {
		return id, err
	}
	return id, e.raw.ContainerPause(ctx, id)
}

// procMem is one process's resident memory from /proc, in bytes.
func procMem(pid int) (rss, pss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			rss = kb << 10
		case "Pss:":
			pss = kb << 10
		}
	}
	return rss, pss, sc.Err()
}

// ppid is a process's parent from /proc/<pid>/stat.
func ppid(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return strconv.Atoi(f[1])
}

func comm(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(data))
}

// memCgroupDir is the cgroup v1 memory directory of pid.
func memCgroupDir(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", parts[2]), nil
		}
	}
	return "", fmt.Errorf("pid %d: no memory cgroup (cgroup v2?)", pid)
}

func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
}

// ctMem is one container's host memory, measured on its processes.
type ctMem struct {
	shimRSS, shimPSS int64 // its containerd-shim
	procRSS, procPSS int64 // every process in its cgroup (init, idle, helper)
	procs            int
	cgUsage          int64 // memory.usage_in_bytes
	cgRSS, cgCache   int64 // memory.stat total_rss, total_cache
}

func (e *benchEnv) containerMem(ctx context.Context, id string) (ctMem, error) {
	var m ctMem
	insp, err := e.raw.ContainerInspect(ctx, id)
	if err != nil {
		return m, err
	}
	if insp.State == nil || insp.State.Pid == 0 {
		return m, fmt.Errorf("container %.12s has no process", id)
	}
	init := insp.State.Pid
	shim, err := ppid(init)
	if err != nil {
		return m, err
	}
	if c := comm(shim); !strings.HasPrefix(c, "containerd-shim") {
		return m, fmt.Errorf("container %.12s: the parent of its init is %q, not a containerd-shim", id, c)
	}
	if m.shimRSS, m.shimPSS, err = procMem(shim); err != nil {
		return m, err
	}
	dir, err := memCgroupDir(init)
	if err != nil {
		return m, err
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return m, err
	}
	for _, p := range strings.Fields(string(procs)) {
		pid, _ := strconv.Atoi(p)
		rss, pss, err := procMem(pid)
		if err != nil {
			continue // gone meanwhile
		}
		m.procRSS += rss
		m.procPSS += pss
		m.procs++
	}
	if m.cgUsage, err = readInt(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
		return m, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(stat), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "total_rss":
			m.cgRSS = v
		case "total_cache":
			m.cgCache = v
		}
	}
	return m, nil
}

// hostMem is the node-wide memory figures a benchmark phase moves.
type hostMem struct {
	available    int64 // MemAvailable
	dockerdRSS   int64
	containerRSS int64 // containerd
	goHeap       int64 // this process: the manager's side (helper connections)
}

func readHostMem() hostMem {
	var h hostMem
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				h.available = kb << 10
			}
		}
	}
	dockerd := 0
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if p, _ := ppid(pid); p == 1 && comm(pid) == "dockerd" {
			dockerd = pid
			h.dockerdRSS, _, _ = procMem(pid)
		}
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || dockerd == 0 {
			continue
		}
		if p, _ := ppid(pid); p == dockerd && comm(pid) == "containerd" {
			h.containerRSS, _, _ = procMem(pid)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.goHeap = int64(ms.HeapInuse)
	return h
}

func mib(v float64) float64 { return v / (1 << 20) }

// memTable is the per-container means and medians of ms.
func memTable(name string, ms []ctMem) string {
	fields := []struct {
		label string
		get   func(ctMem) int64
	}{
		{"shim RSS", func(m ctMem) int64 { return m.shimRSS }},
		{"shim PSS", func(m ctMem) int64 { return m.shimPSS }},
		{"procs RSS", func(m ctMem) int64 { return m.procRSS }},
		{"procs PSS", func(m ctMem) int64 { return m.procPSS }},
		{"cg usage", func(m ctMem) int64 { return m.cgUsage }},
		{"cg rss", func(m ctMem) int64 { return m.cgRSS }},
		{"cg cache", func(m ctMem) int64 { return m.cgCache }},
		{"shim+procs PSS", func(m ctMem) int64 { return m.shimPSS + m.procPSS }},
	}
	var b strings.Builder
	procs := 0
	for _, m := range ms {
		procs += m.procs
	}
	fmt.Fprintf(&b, "  %s (n=%d, %.1f processes each):", name, len(ms), float64(procs)/float64(max(len(ms), 1)))
	for _, f := range fields {
		vals := make([]int64, len(ms))
		var sum int64
		for i, m := range ms {
			vals[i] = f.get(m)
			sum += vals[i]
		}
		slices.Sort(vals)
		med := int64(0)
		if len(vals) > 0 {
			med = vals[len(vals)/2]
		}
		fmt.Fprintf(&b, " %s %.2f/%.2f", f.label, mib(float64(sum)/float64(max(len(ms), 1))), mib(float64(med)))
	}
	b.WriteString(" (MiB, mean/median)\n")
	return b.String()
}

func meanOf(ms []ctMem, get func(ctMem) int64) float64 {
	var sum int64
	for _, m := range ms {
		sum += get(m)
	}
	return float64(sum) / float64(max(len(ms), 1))
}

// BenchmarkDensity creates CODE_SANDBOX_BENCH_DENSITY idle sandboxes
// through the runtime (each as a warm member is left: helper started,
// checked, frozen) and CODE_SANDBOX_BENCH_DENSITY_RAW raw paused
// containers of the same config, all at once on this node, then measures
// the host memory of each on its processes: the containerd-shim's and the
// container's processes' RSS and PSS from /proc, and the memory cgroup's
// usage. It also reports how much dockerd, containerd, this process (the
// manager's side) and MemAvailable moved per container, and thaws a few
// sandboxes at full density to check they still answer. Skipped unless
// the variable is set: 500 sandboxes take minutes.
func BenchmarkDensity(b *testing.B) {
	n := envInt(b, "CODE_SANDBOX_BENCH_DENSITY")
	if n == 0 {
		b.Skip("set CODE_SANDBOX_BENCH_DENSITY=500 (minutes) to run the density benchmark")
	}
	nRaw := envInt(b, "CODE_SANDBOX_BENCH_DENSITY_RAW")
	if nRaw == 0 {
		nRaw = n
	}
	e := env(b)
	b.StopTimer()
	ctx := context.Background()
	var ours, raws fleet
	defer func() {
		if err := errors.Join(ours.remove(e), raws.remove(e)); err != nil {
			b.Errorf("cleanup: %v", err)
		}
	}()
	var report strings.Builder
	fmt.Fprintf(&report, "density: %d idle sandboxes (runtime: helper started, checked, paused) and %d raw paused containers on one node; load %s at start\n", n, nRaw, loadavg())

	h0 := readHostMem()
	t0 := time.Now()
	// Raw first: one phase at a time, so each moves the daemons alone.
	err := fanOut(nRaw, 4, func(i int) error {
		id, err := e.rawIdle(ctx, "dens", true)
		if id != "" {
			raws.add(id)
		}
		return err
	})
	if err != nil {
		b.Fatalf("raw containers: %v", err)
	}
	rawTook := time.Since(t0)
	h1 := readHostMem()
	fmt.Fprintf(&report, "  raw: %d paused in %s (%.1f/s), load %s\n", nRaw, rawTook.Round(time.Second), float64(nRaw)/rawTook.Seconds(), loadavg())
	t0 = time.Now()
	err = fanOut(n, 4, func(i int) error {
		id, err := e.oursIdle(ctx, "dens", true)
		if id != "" {
			ours.add(id)
		}
		if err != nil {
			return fmt.Errorf("sandbox %d: %w", i, err)
		}
		return nil
	})
	oursTook := time.Since(t0)
	if err != nil {
		b.Fatalf("after %d sandboxes in %s: %v", len(ours.ids), oursTook.Round(time.Second), err)
	}
	h2 := readHostMem()
	fmt.Fprintf(&report, "  ours: %d paused in %s (%.1f/s), load %s\n", n, oursTook.Round(time.Second), float64(n)/oursTook.Seconds(), loadavg())

	measure := func(ids []string) ([]ctMem, error) {
		out := make([]ctMem, len(ids))
		err := fanOut(len(ids), 2, func(i int) error {
			m, err := e.containerMem(ctx, ids[i])
			out[i] = m
			return err
		})
		return out, err
	}
	oursMem, err := measure(ours.ids)
	if err != nil {
		b.Fatalf("measuring sandboxes: %v", err)
	}
	rawMem, err := measure(raws.ids)
	if err != nil {
		b.Fatalf("measuring raw containers: %v", err)
	}
	report.WriteString(memTable("ours", oursMem))
	report.WriteString(memTable("raw ", rawMem))
	pssOf := func(m ctMem) int64 { return m.shimPSS + m.procPSS }
	o, r := meanOf(oursMem, pssOf), meanOf(rawMem, pssOf)
	fmt.Fprintf(&report, "  host memory per idle sandbox (shim + container processes, PSS): ours %.2f MiB vs raw %.2f MiB: ratio %.2f\n", mib(o), mib(r), o/r)
	cg := func(m ctMem) int64 { return m.cgUsage }
	fmt.Fprintf(&report, "  memory cgroup usage per idle sandbox: ours %.2f MiB vs raw %.2f MiB: ratio %.2f\n", mib(meanOf(oursMem, cg)), mib(meanOf(rawMem, cg)), meanOf(oursMem, cg)/meanOf(rawMem, cg))
	per := func(a, b int64, k int) float64 { return mib(float64(b-a) / float64(k)) }
	fmt.Fprintf(&report, "  per container, deltas over each phase: raw: dockerd %.2f, containerd %.2f, MemAvailable %.2f MiB; ours: dockerd %.2f, containerd %.2f, this process's Go heap %.3f, MemAvailable %.2f MiB (MemAvailable is node-wide: other helpers move it too)\n",
		per(h0.dockerdRSS, h1.dockerdRSS, nRaw), per(h0.containerRSS, h1.containerRSS, nRaw), per(h1.available, h0.available, nRaw),
		per(h1.dockerdRSS, h2.dockerdRSS, n), per(h1.containerRSS, h2.containerRSS, n), per(h1.goHeap, h2.goHeap, n), per(h2.available, h1.available, n))
	b.ReportMetric(mib(o), "ours-pss-MiB/sandbox")
	b.ReportMetric(mib(r), "raw-pss-MiB/container")

	// At full density: a few claims (thaw + first command), against raw
	// unpause + exec.
	const probes = 10
	var oc, rc []time.Duration
	for i := 0; i < probes && i < n && i < nRaw; i++ {
		id := ours.ids[i*(n/probes)]
		t := time.Now()
		if err := e.docker.BeginUnpause(id)(ctx); err != nil {
			b.Fatalf("thawing %.12s at density: %v", id, err)
		}
		res, err := e.docker.RunCommand(ctx, id, execio.Request{Command: []string{"true"}}, nil, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("a command at density on %.12s: exit %d, %v", id, res.ExitCode, err)
		}
		oc = append(oc, time.Since(t))
		rid := raws.ids[i*(nRaw/probes)]
		t = time.Now()
		if err := e.raw.ContainerUnpause(ctx, rid); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; {
			err := e.rawExec(ctx, rid, []string{"true"}, "")
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "is paused") || time.Now().After(deadline) {
				b.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		rc = append(rc, time.Since(t))
	}
	if len(oc) > 0 {
		fmt.Fprintf(&report, "  claim at full density (thaw + first command), p50 of %d: ours %.1f ms vs raw %.1f ms: ratio %.2f; load %s\n",
			len(oc), ms(percentile(oc, 50)), ms(percentile(rc, 50)), float64(percentile(oc, 50))/float64(percentile(rc, 50)), loadavg())
	}
	fmt.Print(report.String())
	b.Log(report.String())
}

// BenchmarkAgents runs CODE_SANDBOX_BENCH_AGENTS agents at once, each
// looping `true` on its own sandbox through the runtime (the node API's
// and the Docker backend's path), against as many goroutines looping a
// raw `docker exec true` on raw containers, two rounds each, alternating.
// It reports throughput, p50, p99 and p99/p50. Skipped unless the
// variable is set: creating the containers takes minutes here.
func BenchmarkAgents(b *testing.B) {
	n := envInt(b, "CODE_SANDBOX_BENCH_AGENTS")
	if n == 0 {
		b.Skip("set CODE_SANDBOX_BENCH_AGENTS=100 (minutes) to run the agents benchmark")
	}
	secs := envInt(b, "CODE_SANDBOX_BENCH_AGENTS_SECONDS")
	if secs == 0 {
		secs = 20
	}
	e := env(b)
	b.StopTimer()
	ctx := context.Background()
	var ours, raws fleet
	defer func() {
		if err := errors.Join(ours.remove(e), raws.remove(e)); err != nil {
			b.Errorf("cleanup: %v", err)
		}
	}()
	oursIDs := make([]string, n)
	rawIDs := make([]string, n)
	if err := fanOut(n, 4, func(i int) error {
		id, err := e.oursIdle(ctx, "agent", false)
		if id != "" {
			ours.add(id)
			oursIDs[i] = id
		}
		if err != nil {
			return err
		}
		rid, err := e.rawIdle(ctx, "agent", false)
		if rid != "" {
			raws.add(rid)
			rawIDs[i] = rid
		}
		return err
	}); err != nil {
		b.Fatalf("creating the agents' containers: %v", err)
	}

	type result struct {
		lat   []time.Duration
		count int
		took  time.Duration
		load  string
	}
	loop := func(run func(i int) error) (result, error) {
		var (
			mu   sync.Mutex
			res  result
			errs []error
			wg   sync.WaitGroup
		)
		stop := time.Now().Add(time.Duration(secs) * time.Second)
		start := time.Now()
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lat []time.Duration
				for time.Now().Before(stop) {
					t := time.Now()
					if err := run(i); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					lat = append(lat, time.Since(t))
				}
				mu.Lock()
				res.lat = append(res.lat, lat...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		res.took = time.Since(start)
		res.count = len(res.lat)
		res.load = loadavg()
		return res, errors.Join(errs...)
	}
	oursRun := func(i int) error {
		res, err := e.docker.RunCommand(ctx, oursIDs[i], execio.Request{Command: []string{"true"}}, nil, nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	}
	rawRun := func(i int) error { return e.rawExec(ctx, rawIDs[i], []string{"true"}, "") }
	var oursRes, rawRes []result
	for round := 0; round < 2; round++ {
		first, second := oursRun, rawRun
		if round == 1 {
			first, second = rawRun, oursRun
		}
		r1, err := loop(first)
		if err != nil {
			b.Fatalf("round %d: %v", round, err)
		}
		r2, err := loop(second)
		if err != nil {
			b.Fatalf("round %d: %v", round, err)
		}
		if round == 1 {
			r1, r2 = r2, r1
		}
		oursRes, rawRes = append(oursRes, r1), append(rawRes, r2)
	}
	var report strings.Builder
	fmt.Fprintf(&report, "%d agents, each looping `true` on its own container, %d s per path and round, rounds alternating:\n", n, secs)
	line := func(name string, rs []result) (thr float64, p50, p99 time.Duration) {
		var lat []time.Duration
		var took time.Duration
		loads := []string{}
		for _, r := range rs {
			lat = append(lat, r.lat...)
			took += r.took
			loads = append(loads, r.load)
		}
		thr = float64(len(lat)) / took.Seconds()
		p50, p99 = percentile(lat, 50), percentile(lat, 99)
		fmt.Fprintf(&report, "  %-4s %7.1f exec/s, p50 %7.1f ms, p99 %7.1f ms, p99/p50 %.2f, max %7.1f ms (n=%d; load after each round: %s)\n",
			name, thr, ms(p50), ms(p99), float64(p99)/float64(p50), ms(percentile(lat, 100)), len(lat), strings.Join(loads, " | "))
		return thr, p50, p99
	}
	ot, o50, o99 := line("ours", oursRes)
	rt, r50, r99 := line("raw", rawRes)
	fmt.Fprintf(&report, "  ratios ours/raw: throughput %.2f, p50 %.2f, p99 %.2f\n", ot/rt, float64(o50)/float64(r50), float64(o99)/float64(r99))
	b.ReportMetric(ot, "ours-exec/s")
	b.ReportMetric(rt, "raw-exec/s")
	b.ReportMetric(ms(o50), "ours-p50-ms")
	b.ReportMetric(ms(o99), "ours-p99-ms")
	b.ReportMetric(ms(r50), "raw-p50-ms")
	b.ReportMetric(ms(r99), "raw-p99-ms")
	fmt.Print(report.String())
	b.Log(report.String())
}
