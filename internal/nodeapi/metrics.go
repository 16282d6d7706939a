/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// serveMetrics answers one subresource.Metrics. It runs nothing in the
// container and is no activity (serve skips Activity for it): a paused
// Sandbox stays paused, and a dashboard that polls does not keep an idle
// Sandbox awake.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	if !ct.State.Running {
		writeError(w, conflict("sandbox %s/%s: its container %s is %s, not running; it has no metrics",
			sbx.Namespace, sbx.Name, dockerruntime.ShortID(ct.ID), ct.State.Status).Because(subresource.CauseContainerNotRunning, ""))
		return
	}
	st, err := s.cfg.Runtime.Stats(r.Context(), ct.ID)
	if err != nil {
		writeError(w, err)
		return
	}
	m := MetricsFromStats(st)
	m.Namespace, m.Name, m.Node = sbx.Namespace, sbx.Name, s.cfg.NodeName
	if spec, _ := warmpool.Effective(sbx); spec.Network.Mode != sandboxv1alpha1.NetworkEgress {
		m.Network = nil
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}

// MetricsFromStats converts a Docker reading to the wire type; the MCP
// server's Docker backend uses it too.
func MetricsFromStats(st dockerruntime.Stats) subresource.Metrics {
	m := subresource.Metrics{
		Version: subresource.MetricsVersion,
		Time:    st.At,
		Paused:  st.Paused,
		CPU:     subresource.CPUMetrics{Cores: st.CPUCores, LimitCores: st.CPULimitCores},
		Memory:  subresource.UsageMetrics{Used: st.MemoryBytes, Limit: st.MemoryLimitBytes},
		Pids:    subresource.UsageMetrics{Used: st.Pids, Limit: st.PidsLimit},
		Disk:    subresource.DiskMetrics{UsedBytes: st.WritableUsedBytes, Source: st.WritableUsedSource, Paths: []subresource.PathMetrics{}, PathsSource: st.PathsSource},
	}
	if st.CPULimitCores > 0 {
		m.CPU.PercentOfLimit = 100 * st.CPUCores / st.CPULimitCores
	}
	for _, p := range st.WritablePaths {
		pm := subresource.PathMetrics{Path: p.Path, LimitBytes: p.LimitBytes}
		if p.UsedBytes >= 0 {
			pm.UsedBytes = &p.UsedBytes
		}
		m.Disk.Paths = append(m.Disk.Paths, pm)
	}
	if st.HasNetwork {
		m.Network = &subresource.NetworkMetrics{RxBytes: st.NetRxBytes, TxBytes: st.NetTxBytes}
	}
	return m
}

// execLatency is the wall time of execs through the node API, by path:
// running, or resume when the Sandbox was idle-paused and the exec woke it
// (the thaw is part of the exec's time). Per path, never per Sandbox (see
// docs/metrics.md: cardinality).
var execLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "code_sandbox_exec_seconds",
	Help:    "Wall time of execs through the node API (thaw included), by path: running or resume (woke an idle-paused Sandbox).",
	Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
}, []string{"path"})

func init() { metrics.Registry.MustRegister(execLatency) }

// observeExec records an exec that began at start.
func observeExec(sbx *sandboxv1alpha1.Sandbox, start time.Time) {
	path := "running"
	if c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused)); c != nil && c.Status == "True" {
		path = "resume"
	}
	execLatency.WithLabelValues(path).Observe(time.Since(start).Seconds())
}
