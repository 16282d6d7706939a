package dockerbackend

import (
	"context"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

// Metrics implements session.MetricsReader with Docker's stats API, which
// reads the container's cgroup from the host: a paused sandbox (idle pause
// or a warm member still frozen) is read as it is, never thawed.
func (b *driver) Metrics(ctx context.Context, h session.Handle) (contract.Metrics, error) {
	st, err := b.docker.Stats(ctx, h.Ref)
	if err != nil {
		return contract.Metrics{}, mapErr(err)
	}
	return fromStats(st), nil
}

func fromStats(st dockerruntime.Stats) contract.Metrics {
	out := contract.Metrics{
		Time: st.At, Paused: st.Paused,
		CPUCores: st.CPUCores, CPULimitCores: st.CPULimitCores,
		MemoryBytes: st.MemoryBytes, MemoryLimitBytes: st.MemoryLimitBytes,
		Pids: st.Pids, PidsLimit: st.PidsLimit,
		DiskUsedBytes: st.WritableUsedBytes, WritablePaths: []contract.PathLimit{}, PathsSource: st.PathsSource,
	}
	if st.CPULimitCores > 0 {
		out.CPUPercentOfLimit = 100 * st.CPUCores / st.CPULimitCores
	}
	for _, p := range st.WritablePaths {
		pl := contract.PathLimit{Path: p.Path, LimitBytes: p.LimitBytes}
		if p.UsedBytes >= 0 {
			pl.UsedBytes = &p.UsedBytes
		}
		out.WritablePaths = append(out.WritablePaths, pl)
	}
	if st.HasNetwork {
		out.Network = &contract.NetworkBytes{RxBytes: st.NetRxBytes, TxBytes: st.NetTxBytes}
	}
	return out
}
