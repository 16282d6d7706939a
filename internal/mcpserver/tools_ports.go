package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// portTools are expose_port and unexpose_port, registered when the server
// serves previews (Config.PreviewBaseURL) and its backend reaches ports.
func portTools(d *deps) []func(*deps) (mcp.Tool, server.ToolHandlerFunc) {
	if d.cfg.PreviewBaseURL == "" {
		return nil
	}
	if _, ok := d.backend.(contract.PortBackend); !ok {
		return nil
	}
	return []func(*deps) (mcp.Tool, server.ToolHandlerFunc){exposePortTool, unexposePortTool}
}

type portArgs struct {
	ContainerID      string `json:"container_id"`
	Port             *int64 `json:"port"`
	ExpiresInSeconds *int64 `json:"expires_in_seconds"`
}

func (a portArgs) containerID() string { return a.ContainerID }

func (a portArgs) port() (int, error) {
	if a.Port == nil {
		return 0, argError("port is required")
	}
	if *a.Port < 1 || *a.Port > 65535 {
		return 0, argError("port %d is out of range: 1 to 65535", *a.Port)
	}
	return int(*a.Port), nil
}

// ExposeResult is expose_port's structured result.
type ExposeResult struct {
	ContainerID string    `json:"container_id"`
	Port        int       `json:"port"`
	URL         string    `json:"url"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// UnexposeResult is unexpose_port's structured result.
type UnexposeResult struct {
	ContainerID string `json:"container_id"`
	Port        int    `json:"port"`
	Revoked     bool   `json:"revoked"`
}

func portProp() mcp.ToolOption {
	return mcp.WithInteger("port", mcp.Required(), mcp.Description("TCP port a server in the sandbox listens on, at 127.0.0.1 or 0.0.0.0 (1-65535)."), mcp.Min(1), mcp.Max(65535))
}

func exposePortTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	maxSecs := int(MaxPreviewExpiry / time.Second)
	tool := mcp.NewTool("expose_port",
		mcp.WithDescription(fmt.Sprintf("Give a server listening on a port inside the sandbox a preview URL that a browser can open (HTTP and WebSocket). Works without network access in the sandbox. The URL is a bearer secret: anyone holding it reaches the port until it expires (default %d s) or unexpose_port revokes it; exposing the port again replaces (revokes) its earlier URL. Stopping the sandbox revokes all.", int(DefaultPreviewExpiry/time.Second))),
		containerIDProp(),
		portProp(),
		mcp.WithInteger("expires_in_seconds", mcp.Description(fmt.Sprintf("Lifetime of the URL in seconds (default %d, maximum %d).", int(DefaultPreviewExpiry/time.Second), maxSecs)), mcp.Min(1), mcp.Max(maxSecs)),
		mcp.WithOutputSchema[ExposeResult](),
		annotations("Expose port", false, false, false, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args portArgs) (*mcp.CallToolResult, error) {
		port, err := args.port()
		if err != nil {
			return nil, err
		}
		ttl := DefaultPreviewExpiry
		if args.ExpiresInSeconds != nil {
			if *args.ExpiresInSeconds < 1 || *args.ExpiresInSeconds > int64(maxSecs) {
				return nil, argError("expires_in_seconds %d is out of range: 1 to %d", *args.ExpiresInSeconds, maxSecs)
			}
			ttl = time.Duration(*args.ExpiresInSeconds) * time.Second
		}
		expires := time.Now().Add(ttl).Truncate(time.Second)
		nonce := randid.Hex(12)
		pb := d.backend.(contract.PortBackend)
		if err := pb.Expose(ctx, caller, args.ContainerID, port, nonce, expires); err != nil {
			return nil, err
		}
		token := signPreview(previewClaims{Owner: contract.IdentityHash(caller.ID), ID: args.ContainerID, Port: port, Expires: expires.Unix(), Nonce: nonce})
		url := strings.TrimSuffix(d.cfg.PreviewBaseURL, "/") + PreviewPrefix + token + "/"
		return result(ExposeResult{ContainerID: args.ContainerID, Port: port, URL: url, ExpiresAt: expires.UTC()},
			fmt.Sprintf("Port %d of sandbox %s is reachable at %s until %s. The URL is a secret: anyone holding it reaches the port.", port, args.ContainerID, url, expires.UTC().Format(time.RFC3339))), nil
	})
}

func unexposePortTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("unexpose_port",
		mcp.WithDescription("Revoke the preview URL of a sandbox's port (expose_port): new requests to it are refused at once; an open WebSocket stays until either end closes it."),
		containerIDProp(),
		portProp(),
		mcp.WithOutputSchema[UnexposeResult](),
		annotations("Unexpose port", false, true, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args portArgs) (*mcp.CallToolResult, error) {
		port, err := args.port()
		if err != nil {
			return nil, err
		}
		if args.ExpiresInSeconds != nil {
			return nil, argError("unexpose_port takes no expires_in_seconds")
		}
		revoked, err := d.backend.(contract.PortBackend).Unexpose(ctx, caller, args.ContainerID, port)
		if err != nil {
			return nil, err
		}
		text := fmt.Sprintf("Port %d of sandbox %s is no longer exposed.", port, args.ContainerID)
		if !revoked {
			text = fmt.Sprintf("Port %d of sandbox %s was not exposed; nothing to revoke.", port, args.ContainerID)
		}
		return result(UnexposeResult{ContainerID: args.ContainerID, Port: port, Revoked: revoked}, text), nil
	})
}
