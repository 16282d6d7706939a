/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
)

// Stats is one reading of a container's resource use against its limits.
// Every figure comes from the host side (Docker's stats API, which reads the
// container's cgroup files, and its inspect record): reading them never
// runs anything in the container, so it neither wakes a paused container
// nor is refused for one.
type Stats struct {
	// At is when Docker took the reading.
	At time.Time
	// Paused is true when the cgroup freezer held the container; its CPU
	// use is then zero.
	Paused bool
	// CPUCores is the CPU used over Docker's sampling interval (about a
	// second), in cores; CPULimitCores is the container's limit (zero: no
	// limit).
	CPUCores      float64
	CPULimitCores float64
	// CPUTotalNanos is the CPU time the container used since it started
	// (a counter), from which a sampler computes rates.
	CPUTotalNanos uint64
	// MemoryBytes is the memory in use as `docker stats` counts it (usage
	// without the inactive page cache); MemoryLimitBytes is the cgroup
	// limit.
	MemoryBytes      int64
	MemoryLimitBytes int64
	// Pids and PidsLimit are the tasks in the container's pids cgroup.
	Pids      int64
	PidsLimit int64
	// Network sums every interface's counters; HasNetwork is false when
	// the container has no network interface with counters (network
	// none).
	HasNetwork         bool
	NetRxBytes         int64
	NetTxBytes         int64
	WritablePaths      []WritablePath
	WritableUsedBytes  int64
	WritableUsedSource string
	// PathsSource says how WritablePaths' UsedBytes were read.
	PathsSource string
}

// WritablePath is one of the container's tmpfs mounts (the working
// directory, /tmp, /var/tmp) and its size limit.
type WritablePath struct {
	Path       string
	LimitBytes int64
	// UsedBytes is the bytes used in this path, -1 when it could not be
	// read without waking the sandbox (see Stats.PathsSource).
	UsedBytes int64
}

// PathsSource values: how each WritablePath's UsedBytes was read.
const (
	// PathsHostStatfs: statfs(2) of the tmpfs through /proc/<pid>/root
	// on the host, where this process can see the container's init; the
	// sandbox is not touched, paused or not.
	PathsHostStatfs = "host-statfs"
	// PathsHelperStatfs: statfs(2) by the in-sandbox helper (an exec),
	// only for a running sandbox; a paused one is never woken for it.
	PathsHelperStatfs = "helper-statfs"
	// PathsUnavailable: neither (a paused sandbox seen from a process
	// without the host's PID namespace, such as the manager's pod); the
	// paths' total is still WritableUsedBytes.
	PathsUnavailable = "unavailable"
)

// WritableUsedSource values: where Stats.WritableUsedBytes comes from.
const (
	// WritableUsedShmem: the memory cgroup's shmem counter (cgroup v2),
	// which counts the pages of every tmpfs of the container (its writable
	// paths and /dev/shm) together. tmpfs pages live in the cgroup's
	// memory, so the counter is exact; it cannot tell the paths apart.
	WritableUsedShmem = "cgroup-shmem"
	// WritableUsedCacheNotFile: cgroup v1 has no shmem counter in Docker's
	// reply; tmpfs pages are the page cache that is not on the file LRU
	// lists (they are swap-backed), so cache - active_file - inactive_file.
	WritableUsedCacheNotFile = "cgroup-v1-cache-minus-file"
)

// Stats reads the container's resource use. It takes about a second:
// Docker samples the CPU counters twice to compute a rate.
func (c *Client) Stats(ctx context.Context, id string) (Stats, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	insp, err := c.docker.ContainerInspect(ctx, id)
	if err != nil {
		return Stats{}, classify(err, "inspecting container "+ShortID(id))
	}
	var out Stats
	if insp.ContainerJSONBase != nil && insp.State != nil {
		out.Paused = insp.State.Paused
	}
	if insp.ContainerJSONBase != nil && insp.HostConfig != nil {
		out.CPULimitCores = float64(insp.HostConfig.NanoCPUs) / 1e9
		out.WritablePaths = writablePaths(insp.HostConfig.Tmpfs)
	}
	running := insp.ContainerJSONBase != nil && insp.State != nil && insp.State.Running
	pid := 0
	if running {
		pid = insp.State.Pid
	}
	c.pathUsage(ctx, id, insp.ID, pid, running && !out.Paused, &out)
	// stream=false without one-shot: Docker takes two samples a second
	// apart, so the reply carries precpu_stats to compute a rate from.
	resp, err := c.docker.ContainerStats(ctx, id, false)
	if err != nil {
		return Stats{}, classify(err, "reading stats of container "+ShortID(id))
	}
	defer func() { _ = resp.Body.Close() }()
	var st container.StatsResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return Stats{}, fmt.Errorf("decoding stats of container %s: %w", ShortID(id), err)
	}
	fillStats(&out, &st)
	return out, nil
}

// pathUsage fills each writable path's UsedBytes without waking the
// sandbox: from the host when its tmpfs mounts are visible there, else
// from the helper when the sandbox runs (not paused), else not at all.
func (c *Client) pathUsage(ctx context.Context, id, fullID string, pid int, awake bool, out *Stats) {
	paths := make([]string, len(out.WritablePaths))
	for i := range out.WritablePaths {
		out.WritablePaths[i].UsedBytes = -1
		paths[i] = out.WritablePaths[i].Path
	}
	out.PathsSource = PathsUnavailable
	if len(paths) == 0 {
		return
	}
	if used, ok := hostPathUsage(pid, fullID, paths); ok {
		for i := range out.WritablePaths {
			out.WritablePaths[i].UsedBytes = used[out.WritablePaths[i].Path]
		}
		out.PathsSource = PathsHostStatfs
		return
	}
	if !awake {
		return
	}
	argv := []string{HelperPath, "statfs"}
	for _, p := range paths {
		argv = append(argv, "--root="+p)
	}
	stdout := &boundedBuffer{max: 4096}
	res, err := c.Exec(ctx, id, ExecOptions{Cmd: argv}, stdout, io.Discard)
	if err != nil || res.ExitCode != 0 {
		return
	}
	// The helper runs inside the sandbox, so its figures are the
	// sandbox's word: each is bounded by its path's limit.
	got := map[string]int64{}
	for line := range strings.SplitSeq(stdout.buf.String(), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		if n, err := strconv.ParseInt(f[1], 10, 64); err == nil && n >= 0 {
			got[f[0]] = n
		}
	}
	for i, wp := range out.WritablePaths {
		if n, ok := got[wp.Path]; ok && (wp.LimitBytes == 0 || n <= wp.LimitBytes) {
			out.WritablePaths[i].UsedBytes = n
			out.PathsSource = PathsHelperStatfs
		}
	}
}

// fillStats computes the figures from Docker's reply (cgroup v1 or v2).
func fillStats(out *Stats, st *container.StatsResponse) {
	out.At = st.Read
	out.CPUTotalNanos = st.CPUStats.CPUUsage.TotalUsage
	cpuDelta := float64(st.CPUStats.CPUUsage.TotalUsage) - float64(st.PreCPUStats.CPUUsage.TotalUsage)
	wall := st.Read.Sub(st.PreRead).Seconds()
	if st.PreCPUStats.CPUUsage.TotalUsage > 0 && cpuDelta > 0 && wall > 0 && !st.PreRead.IsZero() {
		// TotalUsage is in nanoseconds of CPU time.
		out.CPUCores = cpuDelta / 1e9 / wall
	}
	ms := st.MemoryStats
	used := int64(ms.Usage)
	// As the docker CLI: cgroup v1 subtracts total_inactive_file, v2
	// inactive_file.
	if v, ok := ms.Stats["total_inactive_file"]; ok && int64(v) < used {
		used -= int64(v)
	} else if v, ok := ms.Stats["inactive_file"]; ok && int64(v) < used {
		used -= int64(v)
	}
	out.MemoryBytes = used
	out.MemoryLimitBytes = int64(ms.Limit)
	if v, ok := ms.Stats["shmem"]; ok {
		out.WritableUsedBytes, out.WritableUsedSource = int64(v), WritableUsedShmem
	} else if c, ok := ms.Stats["total_cache"]; ok {
		file := int64(ms.Stats["total_active_file"] + ms.Stats["total_inactive_file"])
		out.WritableUsedBytes, out.WritableUsedSource = max(int64(c)-file, 0), WritableUsedCacheNotFile
	}
	out.Pids = int64(st.PidsStats.Current)
	out.PidsLimit = int64(st.PidsStats.Limit)
	for _, n := range st.Networks {
		out.HasNetwork = true
		out.NetRxBytes += int64(n.RxBytes)
		out.NetTxBytes += int64(n.TxBytes)
	}
}

// writablePaths reads the size= option of each tmpfs mount.
func writablePaths(tmpfs map[string]string) []WritablePath {
	out := make([]WritablePath, 0, len(tmpfs))
	for path, opts := range tmpfs {
		wp := WritablePath{Path: path}
		for o := range strings.SplitSeq(opts, ",") {
			if v, ok := strings.CutPrefix(o, "size="); ok {
				wp.LimitBytes, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out = append(out, wp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Sample is a cheap reading for periodic collection (the manager's
// Prometheus totals): one-shot, without Docker's second CPU sample and
// without an inspect, so CPUCores, CPULimitCores and WritablePaths are
// zero; a sampler derives CPU from CPUTotalNanos between two samples.
func (c *Client) Sample(ctx context.Context, id string) (Stats, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	resp, err := c.docker.ContainerStatsOneShot(ctx, id)
	if err != nil {
		return Stats{}, classify(err, "reading stats of container "+ShortID(id))
	}
	defer func() { _ = resp.Body.Close() }()
	var st container.StatsResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return Stats{}, fmt.Errorf("decoding stats of container %s: %w", ShortID(id), err)
	}
	var out Stats
	fillStats(&out, &st)
	out.CPUCores = 0
	return out, nil
}
