package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// snapshotTools are sandbox_snapshot, sandbox_fork, list_snapshots and
// delete_snapshot, registered when the backend snapshots sandboxes.
func snapshotTools(d *deps) []func(*deps) (mcp.Tool, server.ToolHandlerFunc) {
	sb, ok := d.backend.(contract.SnapshotBackend)
	if !ok || !sb.SnapshotsSupported() {
		return nil
	}
	return []func(*deps) (mcp.Tool, server.ToolHandlerFunc){sandboxSnapshotTool, sandboxForkTool, listSnapshotsTool, deleteSnapshotTool}
}

// SnapshotResult is sandbox_snapshot's structured result.
type SnapshotResult struct {
	contract.Snapshot
}

// ForkResult is sandbox_fork's structured result.
type ForkResult struct {
	Sandboxes []contract.Sandbox `json:"sandboxes"`
}

// SnapshotListResult is list_snapshots' structured result.
type SnapshotListResult struct {
	Snapshots []contract.Snapshot `json:"snapshots"`
}

// DeleteSnapshotResult is delete_snapshot's structured result.
type DeleteSnapshotResult struct {
	SnapshotID string `json:"snapshot_id"`
	Deleted    bool   `json:"deleted"`
}

const snapshotScope = "the files of its working directory, /tmp and /var/tmp (modes kept; symbolic links are not restored), its image and its CPU, memory and network settings. Running processes and memory are not captured"

func snapshotIDProp(required bool) mcp.ToolOption {
	opts := []mcp.PropertyOption{mcp.Description("A snapshot's ID, as returned by sandbox_snapshot (list_snapshots shows yours).")}
	if required {
		opts = append(opts, mcp.Required())
	}
	return mcp.WithString("snapshot_id", opts...)
}

func sandboxSnapshotTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_snapshot",
		mcp.WithDescription("Take a snapshot of a sandbox: "+snapshotScope+". The sandbox's processes are stopped while its files are read, then continue. Fork it with sandbox_fork; it lasts until delete_snapshot or the server's end."),
		containerIDProp(),
		mcp.WithOutputSchema[SnapshotResult](),
		annotations("Snapshot sandbox", false, false, false, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args containerArgs) (*mcp.CallToolResult, error) {
		snap, err := d.backend.(contract.SnapshotBackend).Snapshot(ctx, caller, args.ContainerID)
		if err != nil {
			return nil, err
		}
		return result(SnapshotResult{snap}, fmt.Sprintf("Snapshot %s of sandbox %s: %d files, %d bytes.", snap.ID, args.ContainerID, snap.Files, snap.Bytes)), nil
	})
}

type forkArgs struct {
	ContainerID string `json:"container_id"`
	SnapshotID  string `json:"snapshot_id"`
	Count       *int64 `json:"count"`
}

func sandboxForkTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_fork",
		mcp.WithDescription(fmt.Sprintf("Make count new sandboxes (1-%d, default 1) that start with the files of a sandbox (container_id, snapshotted now) or of a snapshot (snapshot_id): give exactly one. A fork holds %s: each child is a fresh sandbox with its own hostname, processes and memory, and what one child writes stays out of the others. Each child counts against your sandbox limit.", contract.MaxForkCount, snapshotScope)),
		mcp.WithString("container_id", mcp.Description("The sandbox to fork, as returned by sandbox_initialize.")),
		snapshotIDProp(false),
		mcp.WithInteger("count", mcp.Description(fmt.Sprintf("How many sandboxes to make (1-%d, default 1).", contract.MaxForkCount)), mcp.Min(1), mcp.Max(contract.MaxForkCount)),
		mcp.WithOutputSchema[ForkResult](),
		annotations("Fork sandbox", false, false, false, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args forkArgs) (*mcp.CallToolResult, error) {
		if args.ContainerID != "" {
			if err := checkContainerID(args.ContainerID); err != nil {
				return nil, err
			}
		}
		req := contract.ForkRequest{ContainerID: args.ContainerID, SnapshotID: args.SnapshotID, Count: 1}
		if args.Count != nil {
			if *args.Count < 1 || *args.Count > contract.MaxForkCount {
				return nil, argError("count %d is out of range: 1 to %d", *args.Count, contract.MaxForkCount)
			}
			req.Count = int(*args.Count)
		}
		if err := req.Check(); err != nil {
			return nil, argError("%s", strings.TrimPrefix(err.Error(), contract.ErrInvalid.Error()+": "))
		}
		kids, err := d.backend.(contract.SnapshotBackend).Fork(ctx, caller, req)
		if err != nil {
			return nil, err
		}
		ids := make([]string, len(kids))
		for i, k := range kids {
			ids[i] = k.ID
		}
		return result(ForkResult{Sandboxes: kids}, fmt.Sprintf("Forked %d sandboxes: %s.", len(kids), strings.Join(ids, ", "))), nil
	})
}

func listSnapshotsTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("list_snapshots",
		mcp.WithDescription("List your snapshots with their source sandbox, image, size and age."),
		mcp.WithOutputSchema[SnapshotListResult](),
		annotations("List snapshots", true, false, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, _ struct{}) (*mcp.CallToolResult, error) {
		list, err := d.backend.(contract.SnapshotBackend).ListSnapshots(ctx, caller)
		if err != nil {
			return nil, err
		}
		if list == nil {
			list = []contract.Snapshot{}
		}
		var b strings.Builder
		if len(list) == 0 {
			b.WriteString("No snapshots. Take one with sandbox_snapshot.")
		}
		for _, s := range list {
			fmt.Fprintf(&b, "%s  source=%s  image=%s  files=%d  bytes=%d  created=%s\n", s.ID, s.SourceID, s.Image, s.Files, s.Bytes, s.CreatedAt.UTC().Format(time.RFC3339))
		}
		return result(SnapshotListResult{Snapshots: list}, strings.TrimRight(b.String(), "\n")), nil
	})
}

type snapshotArgs struct {
	SnapshotID string `json:"snapshot_id"`
}

func deleteSnapshotTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("delete_snapshot",
		mcp.WithDescription("Delete a snapshot and its stored files. Sandboxes forked from it are not affected."),
		snapshotIDProp(true),
		mcp.WithOutputSchema[DeleteSnapshotResult](),
		annotations("Delete snapshot", false, true, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args snapshotArgs) (*mcp.CallToolResult, error) {
		if args.SnapshotID == "" {
			return nil, argError(`"snapshot_id" is required: pass the snapshot_id that sandbox_snapshot returned (list_snapshots shows yours)`)
		}
		if err := d.backend.(contract.SnapshotBackend).DeleteSnapshot(ctx, caller, args.SnapshotID); err != nil {
			return nil, err
		}
		return result(DeleteSnapshotResult{SnapshotID: args.SnapshotID, Deleted: true}, fmt.Sprintf("Snapshot %s deleted.", args.SnapshotID)), nil
	})
}
