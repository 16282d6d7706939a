/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package cgroupcpu reads a Docker container's CPU use from its cgroup on
// this host: the ground truth that the specs of the CPU figures the
// project reports (the Stats of dockerruntime, the metrics subresource,
// sandbox_metrics) check a figure against.
//
// A spec asks a CPU-bound loop to be shown "near its CPU limit". On a busy
// shared machine (a CI run's parallel packages) the loop does not get its
// limit, and the figure is right to say so. NearLimit then checks that the
// figure tracks what the cgroup really used instead.
package cgroupcpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// usageFiles are where a container's cumulative CPU time is, by cgroup
// layout: v1 with the cgroupfs driver (nanoseconds), v2 with the cgroupfs
// or the systemd driver (cpu.stat's usage_usec).
var usageFiles = []string{
	"/sys/fs/cgroup/cpuacct/docker/%s*/cpuacct.usage",
	"/sys/fs/cgroup/cpu,cpuacct/docker/%s*/cpuacct.usage",
	"/sys/fs/cgroup/docker/%s*/cpu.stat",
	"/sys/fs/cgroup/system.slice/docker-%s*.scope/cpu.stat",
}

// usage is the container's cumulative CPU time; false where no cgroup of
// it is found (another layout, a remote Docker).
func usage(id string) (time.Duration, bool) {
	for _, pattern := range usageFiles {
		matches, _ := filepath.Glob(fmt.Sprintf(pattern, id))
		if len(matches) != 1 {
			continue
		}
		data, err := os.ReadFile(matches[0])
		if err != nil {
			continue
		}
		if strings.HasSuffix(matches[0], "cpuacct.usage") {
			ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
			if err == nil {
				return time.Duration(ns), true
			}
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				if us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return time.Duration(us) * time.Microsecond, true
				}
			}
		}
	}
	return 0, false
}

// During runs read and returns how many cores container id (its full ID
// or a unique prefix) used on average meanwhile; ok is false where its
// cgroup is not found.
func During(id string, read func()) (cores float64, ok bool) {
	before, ok1 := usage(id)
	start := time.Now()
	read()
	elapsed := time.Since(start)
	after, ok2 := usage(id)
	if !ok1 || !ok2 || elapsed <= 0 {
		return 0, false
	}
	return float64(after-before) / float64(elapsed), true
}

// NearLimit checks the CPU figure reported for a CPU-bound loop with a
// limit of limitCores: never above the limit (with 20 % for sampling), and
// at least 80 % of it, unless the host gave the loop less than that while
// the figure was read (truth, from During; truthOK false means unknown).
// Then the figure must be within 0.1 core of what the loop really used.
func NearLimit(reported, limitCores, truth float64, truthOK bool) error {
	if reported > 1.2*limitCores {
		return fmt.Errorf("reported %.3f cores, above the limit of %.3f (the CFS quota caps the loop)", reported, limitCores)
	}
	if reported >= 0.8*limitCores {
		return nil
	}
	if !truthOK || truth >= 0.8*limitCores {
		return fmt.Errorf("reported %.3f cores for a CPU-bound loop limited to %.3f (the cgroup shows %.3f, known: %v)", reported, limitCores, truth, truthOK)
	}
	if d := reported - truth; d > 0.1 || d < -0.1 {
		return fmt.Errorf("reported %.3f cores; the host gave the loop only %.3f of its %.3f, and the figure does not track it", reported, truth, limitCores)
	}
	return nil
}
