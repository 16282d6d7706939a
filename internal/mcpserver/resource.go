package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

const (
	logsURIPrefix = "containers://"
	logsURISuffix = "/logs"
	// logsTailLines, logsMaxBytes and logsHistory bound what one read of
	// the logs resource returns.
	logsTailLines = 2000
	logsMaxBytes  = 1 << 20
	logsHistory   = 200
)

func logsResource(d *deps) (mcp.ResourceTemplate, server.ResourceTemplateHandlerFunc) {
	tmpl := mcp.NewResourceTemplate(logsURIPrefix+"{id}"+logsURISuffix, "Sandbox logs",
		mcp.WithTemplateDescription("A sandbox's own output (its last lines) followed by the history of commands run in it: when, exit code, duration."),
		mcp.WithTemplateMIMEType("text/plain"),
	)
	return tmpl, func(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		caller, ok := contract.CallerFrom(ctx)
		if !ok {
			return nil, errors.New("unauthenticated request: no caller identity")
		}
		uri := req.Params.URI
		id := strings.TrimSuffix(strings.TrimPrefix(uri, logsURIPrefix), logsURISuffix)
		if !strings.HasPrefix(uri, logsURIPrefix) || !strings.HasSuffix(uri, logsURISuffix) {
			return nil, fmt.Errorf("resource %q is not of the form containers://{id}/logs", Truncate(uri, 100))
		}
		if err := checkContainerID(id); err != nil {
			return nil, err
		}
		logs, err := d.backend.Logs(ctx, caller, id, contract.LogsOptions{TailLines: logsTailLines, MaxBytes: logsMaxBytes, HistoryRecords: logsHistory})
		if errors.Is(err, contract.ErrNotFound) {
			return nil, fmt.Errorf("sandbox %q not found (list_sandboxes shows yours): %w", id, err)
		}
		if err != nil {
			return nil, err
		}
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "text/plain", Text: renderLogs(logs)}}, nil
	}
}

func renderLogs(l contract.Logs) string {
	var b strings.Builder
	b.WriteString("== sandbox output ==\n")
	if l.Truncated {
		b.WriteString("[earlier output omitted]\n")
	}
	b.WriteString(strings.ToValidUTF8(l.Output, "\uFFFD"))
	if l.Output != "" && !strings.HasSuffix(l.Output, "\n") {
		b.WriteString("\n")
	}
	b.WriteString("== exec history ==\n")
	if len(l.History) == 0 {
		b.WriteString("(no commands run)\n")
	}
	for _, r := range l.History {
		cmd := r.Shell
		if cmd == "" {
			cmd = strings.Join(r.Command, " ")
		}
		status := fmt.Sprintf("exit=%d", r.ExitCode)
		switch {
		case r.Error != "":
			status = "error=" + r.Error
		case r.TimedOut:
			status = "timed-out"
		}
		trunc := ""
		if r.Truncated {
			trunc = " truncated"
		}
		fmt.Fprintf(&b, "%s %s %dms%s $ %s\n", r.StartedAt.UTC().Format(time.RFC3339), status, r.DurationMillis, trunc, Truncate(cmd, 500))
	}
	return b.String()
}
