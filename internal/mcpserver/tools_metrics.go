package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// metricsTools is sandbox_metrics, registered when the backend reads
// metrics.
func metricsTools(d *deps) []func(*deps) (mcp.Tool, server.ToolHandlerFunc) {
	if _, ok := d.backend.(contract.MetricsBackend); !ok {
		return nil
	}
	return []func(*deps) (mcp.Tool, server.ToolHandlerFunc){sandboxMetricsTool}
}

func sandboxMetricsTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_metrics",
		mcp.WithDescription("Show a sandbox's resource use now against its limits: CPU (cores and % of its limit, over about a second), memory, processes, bytes in its writable paths (all together; each path has its own limit) and, with network access, network bytes. Reading does not wake a paused sandbox and does not count as using it."),
		containerIDProp(),
		mcp.WithOutputSchema[contract.Metrics](),
		annotations("Sandbox metrics", true, false, false, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args containerArgs) (*mcp.CallToolResult, error) {
		m, err := d.backend.(contract.MetricsBackend).Metrics(ctx, caller, args.ContainerID)
		if err != nil {
			return nil, err
		}
		return result(m, metricsText(m)), nil
	})
}

func metricsText(m contract.Metrics) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", m.ContainerID)
	if m.Paused {
		b.WriteString(" (paused)")
	}
	fmt.Fprintf(&b, "\ncpu: %.3f of %g cores (%.0f%%)", m.CPUCores, m.CPULimitCores, m.CPUPercentOfLimit)
	fmt.Fprintf(&b, "\nmemory: %d of %d bytes", m.MemoryBytes, m.MemoryLimitBytes)
	fmt.Fprintf(&b, "\nprocesses: %d of %d", m.Pids, m.PidsLimit)
	paths := make([]string, 0, len(m.WritablePaths))
	for _, p := range m.WritablePaths {
		if p.UsedBytes != nil {
			paths = append(paths, fmt.Sprintf("%s (%d of %d)", p.Path, *p.UsedBytes, p.LimitBytes))
		} else {
			paths = append(paths, fmt.Sprintf("%s (limit %d)", p.Path, p.LimitBytes))
		}
	}
	fmt.Fprintf(&b, "\nwritable paths: %d bytes used in %s", m.DiskUsedBytes, strings.Join(paths, ", "))
	if m.Network != nil {
		fmt.Fprintf(&b, "\nnetwork: %d bytes received, %d sent", m.Network.RxBytes, m.Network.TxBytes)
	}
	return b.String()
}
