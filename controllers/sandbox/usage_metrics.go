/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

// Usage totals and latency histograms on the manager's secured metrics
// endpoint. Series are per namespace (and per path), never per Sandbox:
// Sandboxes come and go by the thousand, and a series per Sandbox would
// grow Prometheus's index without bound and outlive its subject by the
// retention period. Per-Sandbox figures are a call away
// (sandboxes/metrics, kubectl sandbox top, sandbox_metrics), behind RBAC.
var (
	nsSandboxes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "code_sandbox_namespace_sandboxes",
		Help: "Sandbox containers running (paused included) on this node, by namespace.",
	}, []string{"namespace"})
	nsCPU = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "code_sandbox_namespace_cpu_cores",
		Help: "CPU used by this node's Sandbox containers, by namespace, in cores, over the last collection interval.",
	}, []string{"namespace"})
	nsMemory = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "code_sandbox_namespace_memory_bytes",
		Help: "Memory used (without inactive page cache, as docker stats counts it) by this node's Sandbox containers, by namespace.",
	}, []string{"namespace"})
	// startLatency: how long until a Sandbox can be used, by path: cold
	// (create-to-Ready with a container of its own), warm (create-to-Ready
	// of a warm pool claim) and resume (thawing a paused Sandbox: spec.paused
	// set back to false, or an exec waking an idle-paused one).
	startLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "code_sandbox_start_seconds",
		Help:    "Time until a Sandbox is usable, by path: cold and warm (create to Ready), resume (thaw of a paused Sandbox).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120},
	}, []string{"path"})
	// snapshotLatency: taking a SandboxSnapshot on this node (freeze, read
	// the files, store them, thaw), by where the data went.
	snapshotLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "code_sandbox_snapshot_seconds",
		Help:    "Time to take a SandboxSnapshot on this node (files read and stored), by storage: node-local or registry.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
	}, []string{"storage"})
	// restoreLatency: writing a snapshot's files into a restoring
	// Sandbox's container (the part of path="fork" that is the restore).
	restoreLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "code_sandbox_restore_seconds",
		Help:    "Time to write a SandboxSnapshot's files into a restoring Sandbox on this node (fetch included), by storage: node-local or registry.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
	}, []string{"storage"})
	warmClaimLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "code_sandbox_warm_claim_seconds",
		Help:    "Time a warm pool claim takes on this node: the status write and the member's thaw.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5},
	})
)

// Paths of code_sandbox_start_seconds.
const (
	PathCold   = "cold"
	PathWarm   = "warm"
	PathResume = "resume"
	// PathFork: create-to-Ready of a Sandbox restored from a
	// SandboxSnapshot (spec.snapshotRef), files included.
	PathFork = "fork"
)

// Storage label values of the snapshot and restore histograms.
const (
	StorageNodeLocal = "node-local"
	StorageRegistry  = "registry"
)

func init() {
	metrics.Registry.MustRegister(nsSandboxes, nsCPU, nsMemory, startLatency, warmClaimLatency, snapshotLatency, restoreLatency)
}

// startPath is the path of a Sandbox's first start: warm when it took over
// a warm pool member's container.
func startPath(sbx *sandboxv1alpha1.Sandbox) string {
	if sbx.Spec.SnapshotRef != nil {
		return PathFork
	}
	if sbx.ContainerUID() != sbx.UID {
		return PathWarm
	}
	return PathCold
}

// ObserveStart records the time until a Sandbox was usable on path.
func ObserveStart(path string, d time.Duration) {
	startLatency.WithLabelValues(path).Observe(d.Seconds())
}

// ObserveSnapshot records the time a snapshot took, by storage.
func ObserveSnapshot(storage string, d time.Duration) {
	snapshotLatency.WithLabelValues(storage).Observe(d.Seconds())
}

// ObserveRestore records the time a restore's files took, by storage.
func ObserveRestore(storage string, d time.Duration) {
	restoreLatency.WithLabelValues(storage).Observe(d.Seconds())
}

// storageKind is the storage label of ref.
func storageKind(s SnapshotStore, ref string) string {
	if s != nil && s.Shared(ref) {
		return StorageRegistry
	}
	return StorageNodeLocal
}

// UsageSampler is what UsageCollector needs of Docker;
// *dockerruntime.Client implements it.
type UsageSampler interface {
	ListManaged(ctx context.Context, f dockerruntime.ListFilter) ([]dockerruntime.Container, error)
	Sample(ctx context.Context, id string) (dockerruntime.Stats, error)
}

// DefaultUsageInterval is how often UsageCollector samples.
const DefaultUsageInterval = 30 * time.Second

// UsageCollector keeps the per-namespace totals up to date: every interval
// it takes one cheap one-shot reading of each of this node's Sandbox
// containers (a cgroup read on the host: it never wakes a paused one) and
// derives CPU from the previous reading. Each node's manager reports its
// node; sum over the instances for the cluster. A manager.Runnable.
type UsageCollector struct {
	Docker   UsageSampler
	Node     string
	Interval time.Duration

	prev map[string]cpuReading
}

type cpuReading struct {
	nanos uint64
	at    time.Time
}

// Start samples until ctx ends.
func (u *UsageCollector) Start(ctx context.Context) error {
	interval := u.Interval
	if interval <= 0 {
		interval = DefaultUsageInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		u.Collect(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Collect takes one round of readings and sets the gauges.
func (u *UsageCollector) Collect(ctx context.Context) {
	list, err := u.Docker.ListManaged(ctx, dockerruntime.ListFilter{Node: u.Node})
	if err != nil {
		logf.FromContext(ctx).V(1).Info("sandbox usage totals: listing containers", "error", err.Error())
		return
	}
	count, cpu, mem := map[string]float64{}, map[string]float64{}, map[string]float64{}
	next := make(map[string]cpuReading, len(list))
	for _, ct := range list {
		// The list says running or paused (a paused one is not Running
		// there); both hold memory and count.
		if ct.State.Status != "running" && ct.State.Status != "paused" {
			continue
		}
		// The manager wrote this label when it created the container; a
		// sandbox cannot change it.
		ns := ct.Labels[dockerruntime.LabelNamespace]
		st, err := u.Docker.Sample(ctx, ct.ID)
		if err != nil {
			continue
		}
		count[ns]++
		mem[ns] += float64(st.MemoryBytes)
		cur := cpuReading{nanos: st.CPUTotalNanos, at: st.At}
		if p, ok := u.prev[ct.ID]; ok && cur.nanos >= p.nanos && cur.at.After(p.at) {
			cpu[ns] += float64(cur.nanos-p.nanos) / 1e9 / cur.at.Sub(p.at).Seconds()
		}
		next[ct.ID] = cur
	}
	u.prev = next
	nsSandboxes.Reset()
	nsCPU.Reset()
	nsMemory.Reset()
	for ns, n := range count {
		nsSandboxes.WithLabelValues(ns).Set(n)
		nsCPU.WithLabelValues(ns).Set(cpu[ns])
		nsMemory.WithLabelValues(ns).Set(mem[ns])
	}
}

// NeedLeaderElection is false: every node's manager reports its own node.
func (u *UsageCollector) NeedLeaderElection() bool { return false }
