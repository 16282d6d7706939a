package kubebackend

import (
	"context"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// permMetrics is sandbox_metrics' permission, as kubectl sandbox top's.
var permMetrics = permission{Verb: "get", Subresource: subresource.SubresourceMetrics}

// Metrics implements session.MetricsReader through the metrics
// subresource, which is served for a paused Sandbox without waking it.
func (b *driver) Metrics(ctx context.Context, h session.Handle) (contract.Metrics, error) {
	sbx, err := b.lookup(ctx, h)
	if err != nil {
		return contract.Metrics{}, err
	}
	mctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	m, err := b.nodes.Metrics(mctx, sandboxclient.For(sbx))
	if err != nil {
		return contract.Metrics{}, clientError(err)
	}
	return FromSubresource(m), nil
}

// FromSubresource converts the subresource's Metrics to the MCP contract's.
func FromSubresource(m subresource.Metrics) contract.Metrics {
	out := contract.Metrics{
		Time: m.Time, Paused: m.Paused,
		CPUCores: m.CPU.Cores, CPULimitCores: m.CPU.LimitCores, CPUPercentOfLimit: m.CPU.PercentOfLimit,
		MemoryBytes: m.Memory.Used, MemoryLimitBytes: m.Memory.Limit,
		Pids: m.Pids.Used, PidsLimit: m.Pids.Limit,
		DiskUsedBytes: m.Disk.UsedBytes, WritablePaths: []contract.PathLimit{},
	}
	for _, p := range m.Disk.Paths {
		out.WritablePaths = append(out.WritablePaths, contract.PathLimit{Path: p.Path, LimitBytes: p.LimitBytes})
	}
	if m.Network != nil {
		out.Network = &contract.NetworkBytes{RxBytes: m.Network.RxBytes, TxBytes: m.Network.TxBytes}
	}
	return out
}
