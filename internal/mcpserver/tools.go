package mcpserver

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/docker/go-units"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// rawArgs returns a call's arguments as JSON.
func rawArgs(req mcp.CallToolRequest) []byte {
	if len(req.Params.RawArguments) > 0 {
		return req.Params.RawArguments
	}
	b, err := json.Marshal(req.Params.Arguments)
	if err != nil {
		return nil
	}
	return b
}

func containerIDProp() mcp.ToolOption {
	return mcp.WithString("container_id", mcp.Required(), mcp.Description("The sandbox's ID, as returned by sandbox_initialize."))
}

// InitializeResult is sandbox_initialize's structured result.
type InitializeResult struct {
	ContainerID string    `json:"container_id"`
	Image       string    `json:"image"`
	Network     string    `json:"network"`
	WorkingDir  string    `json:"working_dir"`
	ExpiresAt   time.Time `json:"expires_at"`
}

func sandboxInitializeTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	networks := []string{NetworkNone}
	if d.cfg.AllowEgress {
		networks = append(networks, NetworkEgress)
	}
	tool := mcp.NewTool("sandbox_initialize",
		mcp.WithDescription(fmt.Sprintf("Create a new hardened sandbox and return its container_id. Default image: %s. The sandbox has no network unless network is \"egress\" (when this server allows it), runs as a non-root user with a read-only root filesystem, and its working directory (/app), /tmp and /var/tmp are writable. It is removed after a period without use, at the end of its lifetime, on sandbox_stop, or when this server exits.", d.cfg.DefaultImage)),
		mcp.WithString("image", mcp.Description("Container image to run; it must already be present on the host unless the server's pull policy allows pulling. Default: "+d.cfg.DefaultImage)),
		mcp.WithNumber("cpu", mcp.Description("CPU cores (default 1)."), mcp.Min(0.01), mcp.Max(float64(d.cfg.MaxNanoCPUs)/1e9)),
		mcp.WithString("memory", mcp.Description(`Memory limit, for example "512Mi" or "1g" (default 512Mi; swap is off).`)),
		mcp.WithString("network", mcp.Description(`"none" (default; loopback only) or "egress" (outbound network, only if the server allows it).`), mcp.Enum(networks...)),
		mcp.WithInteger("lifetime_seconds", mcp.Description("Maximum lifetime in seconds; default and maximum "+fmt.Sprint(int64(d.cfg.MaxLifetime/time.Second))+"."), mcp.Min(1), mcp.Max(int(d.cfg.MaxLifetime/time.Second))),
		mcp.WithOutputSchema[InitializeResult](),
		annotations("Create sandbox", false, false, false, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args initializeArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		creq, err := args.createRequest(d.cfg)
		if err != nil {
			return d.toolError("", err), nil
		}
		sb, err := d.backend.Create(ctx, caller, creq)
		if err != nil {
			return d.toolError("", err), nil
		}
		res := InitializeResult{ContainerID: sb.ID, Image: sb.Image, Network: sb.Network, WorkingDir: sb.WorkingDir, ExpiresAt: sb.ExpiresAt}
		text := fmt.Sprintf("Sandbox created. container_id: %s\nimage: %s, network: %s, working directory: %s, expires at %s.",
			sb.ID, sb.Image, sb.Network, sb.WorkingDir, sb.ExpiresAt.UTC().Format(time.RFC3339))
		return result(res, text), nil
	}
}

// CommandResult is the outcome of one command of sandbox_exec.
type CommandResult struct {
	Command    string `json:"command"`
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	Truncated  bool   `json:"truncated"`
	TimedOut   bool   `json:"timed_out"`
	// Error says why the command could not run to completion (the
	// sandbox disappeared, the backend failed…).
	Error string `json:"error,omitempty"`
}

// ExecResult is sandbox_exec's structured result.
type ExecResult struct {
	ContainerID string          `json:"container_id"`
	Success     bool            `json:"success"`
	Results     []CommandResult `json:"results"`
	// NotRun counts the commands skipped after a failure.
	NotRun int `json:"not_run"`
}

// capBuffer keeps at most max bytes; the backend already caps each
// stream, so this only guards the server's memory against a backend that
// does not.
type capBuffer struct {
	buf bytes.Buffer
	max int
}

func (c *capBuffer) Write(p []byte) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
}

func (c *capBuffer) String() string { return strings.ToValidUTF8(c.buf.String(), "\uFFFD") }

func sandboxExecTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_exec",
		mcp.WithDescription(fmt.Sprintf("Run shell commands in a sandbox, in order, each with `sh -c`. Stops at the first command that fails (non-zero exit or timeout) and reports it as an error. Each command gets its own timeout (default %s) after which its whole process tree is killed; stdout and stderr are each capped at %s. Output streams while the command runs as progress notifications (when the request has a progress token) and log messages.", d.cfg.CommandTimeout, units.BytesSize(float64(d.cfg.OutputLimit)))),
		containerIDProp(),
		mcp.WithArray("commands", mcp.Required(), mcp.Description("Shell command lines, for example [\"cd /app && python3 main.py\"]."), mcp.WithStringItems(), mcp.MinItems(1), mcp.MaxItems(MaxCommandsPerExec)),
		mcp.WithInteger("timeout_seconds", mcp.Description(fmt.Sprintf("Timeout per command in seconds (default %d, maximum %d).", int64(d.cfg.CommandTimeout/time.Second), int64(d.cfg.MaxTimeout/time.Second))), mcp.Min(1), mcp.Max(int(d.cfg.MaxTimeout/time.Second))),
		mcp.WithString("workdir", mcp.Description("Absolute working directory for the commands (default: the sandbox's working directory).")),
		mcp.WithObject("env", mcp.Description("Extra environment variables, as {\"NAME\": \"value\"}."), mcp.AdditionalProperties(map[string]any{"type": "string"})),
		mcp.WithOutputSchema[ExecResult](),
		annotations("Run commands", false, true, false, d.cfg.AllowEgress),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args execArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		reqs, err := args.requests(d.cfg)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		stream := newOutputStreamer(ctx, req, args.ContainerID)
		out := ExecResult{ContainerID: args.ContainerID, Success: true}
		var text strings.Builder
		for i, r := range reqs {
			stream.begin(i, r.Shell)
			stdout := &capBuffer{max: int(r.OutputLimitBytes) + 4096}
			stderr := &capBuffer{max: int(r.OutputLimitBytes) + 4096}
			res, err := d.backend.Exec(ctx, caller, args.ContainerID, r, func(s string, p []byte) {
				if s == "stderr" {
					stderr.Write(p)
				} else {
					stdout.Write(p)
				}
				stream.write(s, p)
			})
			if err != nil && i == 0 && stdout.buf.Len() == 0 && stderr.buf.Len() == 0 {
				stream.close()
				return d.toolError(args.ContainerID, err), nil
			}
			cr := CommandResult{
				Command:    r.Shell,
				ExitCode:   res.ExitCode,
				Stdout:     stdout.String(),
				Stderr:     stderr.String(),
				DurationMS: res.DurationMillis,
				Truncated:  res.Truncated(),
				TimedOut:   res.TimedOut,
			}
			if err != nil {
				cr.Error = d.toolError(args.ContainerID, err).Content[0].(mcp.TextContent).Text
				cr.ExitCode = -1
			}
			out.Results = append(out.Results, cr)
			renderCommand(&text, cr, r.TimeoutSeconds)
			if err != nil || res.ExitCode != 0 || res.TimedOut {
				out.Success = false
				out.NotRun = len(reqs) - i - 1
				break
			}
		}
		stream.close()
		if !out.Success {
			last := out.Results[len(out.Results)-1]
			fmt.Fprintf(&text, "Command %d of %d failed", len(out.Results), len(reqs))
			switch {
			case last.Error != "":
				fmt.Fprintf(&text, ": %s", last.Error)
			case last.TimedOut:
				text.WriteString(" (timed out)")
			default:
				fmt.Fprintf(&text, " (exit code %d)", last.ExitCode)
			}
			if out.NotRun > 0 {
				fmt.Fprintf(&text, "; the remaining %d command(s) were not run", out.NotRun)
			}
			text.WriteString(".")
			res := result(out, text.String())
			res.IsError = true
			return res, nil
		}
		return result(out, strings.TrimRight(text.String(), "\n")), nil
	}
}

func renderCommand(b *strings.Builder, r CommandResult, timeoutSeconds int64) {
	fmt.Fprintf(b, "$ %s\n", r.Command)
	if r.Stdout != "" {
		b.WriteString(r.Stdout)
		if !strings.HasSuffix(r.Stdout, "\n") {
			b.WriteString("\n")
		}
	}
	if r.Stderr != "" {
		b.WriteString("[stderr]\n")
		b.WriteString(r.Stderr)
		if !strings.HasSuffix(r.Stderr, "\n") {
			b.WriteString("\n")
		}
	}
	switch {
	case r.Error != "":
		fmt.Fprintf(b, "[error after %d ms: %s]\n", r.DurationMS, r.Error)
	case r.TimedOut:
		fmt.Fprintf(b, "[timed out after %d s; the command's processes were killed]\n", timeoutSeconds)
	default:
		fmt.Fprintf(b, "[exit code %d, %d ms]\n", r.ExitCode, r.DurationMS)
	}
	if r.Truncated {
		b.WriteString("[output truncated at the per-stream cap]\n")
	}
}

// TransferResult is the structured result of the tools that move files.
type TransferResult struct {
	ContainerID string   `json:"container_id"`
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Files       int      `json:"files"`
	Dirs        int      `json:"dirs"`
	Bytes       int64    `json:"bytes"`
	Skipped     []string `json:"skipped,omitempty"`
}

func (t TransferResult) text(verb string) string {
	s := fmt.Sprintf("%s %d file(s) and %d directorie(s), %s, from %s to %s.", verb, t.Files, t.Dirs, units.HumanSize(float64(t.Bytes)), t.Source, t.Destination)
	if len(t.Skipped) > 0 {
		shown := t.Skipped
		if len(shown) > 10 {
			shown = shown[:10]
		}
		s += fmt.Sprintf(" Skipped %d entr(ies) that are not regular files or directories (symlinks are never followed): %s", len(t.Skipped), strings.Join(shown, ", "))
	}
	return s
}

// upload streams a tar produced by produce into the sandbox. A producer
// error (a cap, a vanished file) is reported in preference to the
// backend's error it causes.
func (d *deps) upload(ctx context.Context, caller Caller, id, destDir string, limits execio.UploadLimits, produce func(io.Writer) error) (execio.TransferStats, error) {
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := produce(pw)
		pw.CloseWithError(err)
		produced <- err
	}()
	stats, err := d.backend.Upload(ctx, caller, id, destDir, pr, limits)
	// Unblock the producer if the backend stopped reading early.
	pr.CloseWithError(errors.New("upload ended"))
	perr := <-produced
	if perr != nil && !errors.Is(perr, io.ErrClosedPipe) && perr.Error() != "upload ended" {
		return stats, perr
	}
	return stats, err
}

func copyProjectTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("copy_project",
		mcp.WithDescription(fmt.Sprintf("Copy the contents of a host directory into a sandbox directory. Only regular files and directories are copied; symlinks are skipped, never followed. The host directory must lie inside a directory this server allows (%s). Limits: %s, %d entries.", describeRoots(d.cfg.HostRoots), units.BytesSize(float64(d.cfg.MaxUploadBytes)), d.cfg.MaxUploadEntries)),
		containerIDProp(),
		mcp.WithString("local_src_dir", mcp.Required(), mcp.Description("Absolute path of the host directory to copy.")),
		mcp.WithString("dest_dir", mcp.Description("Sandbox directory that receives the contents: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory. Default: the working directory.")),
		mcp.WithOutputSchema[TransferResult](),
		annotations("Copy host directory into sandbox", false, true, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args copyProjectArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkContainerID(args.ContainerID); err != nil {
			return d.toolError("", err), nil
		}
		dest := args.DestDir
		if dest == "" {
			dest = "."
		}
		if err := checkSandboxPath("dest_dir", dest, true); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		root, rel, err := d.cfg.HostRoots.openExisting("local_src_dir", args.LocalSrcDir)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		defer root.Close()
		scan, err := scanHostTree(root, rel, d.cfg.MaxUploadBytes, d.cfg.MaxUploadEntries)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		stats, err := d.upload(ctx, caller, args.ContainerID, dest, execio.UploadLimits{MaxBytes: d.cfg.MaxUploadBytes, MaxEntries: d.cfg.MaxUploadEntries}, func(w io.Writer) error {
			return writeHostTree(root, rel, w, d.cfg.MaxUploadBytes)
		})
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: args.LocalSrcDir, Destination: dest, Files: stats.Files, Dirs: stats.Dirs, Bytes: stats.Bytes, Skipped: scan.Skipped}
		return result(res, res.text("Copied")), nil
	}
}

func describeRoots(h *HostRoots) string {
	if h == nil || len(h.roots) == 0 {
		return "none: host file access is disabled; start the server with --allow-host-dir to enable it"
	}
	return strings.Join(h.roots, ", ")
}

func copyFileTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("copy_file",
		mcp.WithDescription(fmt.Sprintf("Copy one host file into a sandbox. The host file must lie inside a directory this server allows (%s); limit %s.", describeRoots(d.cfg.HostRoots), units.BytesSize(float64(d.cfg.MaxFileBytes)))),
		containerIDProp(),
		mcp.WithString("local_src_file", mcp.Required(), mcp.Description("Absolute path of the host file.")),
		mcp.WithString("dest_path", mcp.Description("Path of the file in the sandbox: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory. Default: the file's name in the working directory.")),
		mcp.WithOutputSchema[TransferResult](),
		annotations("Copy host file into sandbox", false, true, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args copyFileArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkContainerID(args.ContainerID); err != nil {
			return d.toolError("", err), nil
		}
		root, rel, err := d.cfg.HostRoots.openExisting("local_src_file", args.LocalSrcFile)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		defer root.Close()
		destPath := args.DestPath
		if destPath == "" {
			destPath = path.Base(rel)
		}
		dir, base, err := sandboxFilePath("dest_path", destPath)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		f, err := root.Open(rel)
		if err != nil {
			return d.toolError(args.ContainerID, argError("opening local_src_file: %v", err)), nil
		}
		defer f.Close()
		info, err := f.Stat()
		switch {
		case err != nil:
			return d.toolError(args.ContainerID, argError("local_src_file: %v", err)), nil
		case info.IsDir():
			return d.toolError(args.ContainerID, argError("local_src_file %q is a directory; use copy_project", args.LocalSrcFile)), nil
		case !info.Mode().IsRegular():
			return d.toolError(args.ContainerID, argError("local_src_file %q is not a regular file", args.LocalSrcFile)), nil
		case info.Size() > d.cfg.MaxFileBytes:
			return d.toolError(args.ContainerID, argError("local_src_file is %s; the limit is %s", units.BytesSize(float64(info.Size())), units.BytesSize(float64(d.cfg.MaxFileBytes)))), nil
		}
		stats, err := d.upload(ctx, caller, args.ContainerID, dir, execio.UploadLimits{MaxBytes: d.cfg.MaxFileBytes, MaxEntries: 1}, func(w io.Writer) error {
			return singleFileTar(w, base, int64(info.Mode().Perm()), f, info.Size())
		})
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: args.LocalSrcFile, Destination: path.Join(dir, base), Files: stats.Files, Bytes: stats.Bytes}
		return result(res, res.text("Copied")), nil
	}
}

func writeFileTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	limit := min(d.cfg.MaxFileBytes, MaxFileContents)
	tool := mcp.NewTool("write_file",
		mcp.WithDescription(fmt.Sprintf("Write a text file into a sandbox, creating missing directories and replacing an existing file. Limit %s.", units.BytesSize(float64(limit)))),
		containerIDProp(),
		mcp.WithString("file_name", mcp.Required(), mcp.Description("File name, or a path relative to dest_dir.")),
		mcp.WithString("file_contents", mcp.Required(), mcp.Description("The file's contents.")),
		mcp.WithString("dest_dir", mcp.Description("Directory for the file: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory. Default: the working directory.")),
		mcp.WithOutputSchema[TransferResult](),
		annotations("Write file in sandbox", false, true, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args writeFileArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkContainerID(args.ContainerID); err != nil {
			return d.toolError("", err), nil
		}
		if args.FileContents == nil {
			return d.toolError(args.ContainerID, argError(`"file_contents" is required (it may be an empty string)`)), nil
		}
		if int64(len(*args.FileContents)) > limit {
			return d.toolError(args.ContainerID, argError("file_contents is %d bytes; the limit is %d", len(*args.FileContents), limit)), nil
		}
		if err := checkSandboxPath("file_name", args.FileName, true); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		if err := checkSandboxPath("dest_dir", args.DestDir, false); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		target := args.FileName
		if args.DestDir != "" && !path.IsAbs(args.FileName) {
			target = path.Join(args.DestDir, args.FileName)
		} else if args.DestDir != "" {
			return d.toolError(args.ContainerID, argError("file_name %q is absolute; give a relative file_name with dest_dir, or an absolute file_name alone", args.FileName)), nil
		}
		dir, base, err := sandboxFilePath("file_name", target)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		contents := *args.FileContents
		stats, err := d.upload(ctx, caller, args.ContainerID, dir, execio.UploadLimits{MaxBytes: max(limit, 1), MaxEntries: 1}, func(w io.Writer) error {
			return singleFileTar(w, base, 0o644, strings.NewReader(contents), int64(len(contents)))
		})
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: "file_contents", Destination: path.Join(dir, base), Files: stats.Files, Bytes: stats.Bytes}
		return result(res, fmt.Sprintf("Wrote %d bytes to %s in sandbox %s.", len(contents), res.Destination, args.ContainerID)), nil
	}
}

func copyFileFromSandboxTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("copy_file_from_sandbox",
		mcp.WithDescription(fmt.Sprintf("Copy a file (or directory tree) from a sandbox to the host. The host destination must lie inside a directory this server allows (%s); host symlinks are never followed out of it, and only regular files and directories are written. Limit %s.", describeRoots(d.cfg.HostRoots), units.BytesSize(float64(d.cfg.MaxFileBytes)))),
		containerIDProp(),
		mcp.WithString("container_src_path", mcp.Required(), mcp.Description("Path in the sandbox: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory.")),
		mcp.WithString("local_dest_path", mcp.Required(), mcp.Description("Absolute host path to write. An existing directory receives the file inside it.")),
		mcp.WithOutputSchema[TransferResult](),
		annotations("Copy file from sandbox to host", false, true, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args copyFromSandboxArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkContainerID(args.ContainerID); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkSandboxPath("container_src_path", args.ContainerSrcPath, true); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		root, rel, err := d.cfg.HostRoots.openDest("local_dest_path", args.LocalDestPath)
		if err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		defer root.Close()
		if _, err := d.backend.Get(ctx, caller, args.ContainerID); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		pr, pw := io.Pipe()
		downloaded := make(chan error, 1)
		go func() {
			_, err := d.backend.Download(ctx, caller, args.ContainerID, args.ContainerSrcPath, pw, d.cfg.MaxFileBytes)
			pw.CloseWithError(err)
			downloaded <- err
		}()
		st, xerr := extractToHost(root, rel, pr, d.cfg.MaxFileBytes)
		pr.CloseWithError(errors.New("extraction ended"))
		derr := <-downloaded
		if derr != nil && !strings.Contains(derr.Error(), "extraction ended") {
			return d.toolError(args.ContainerID, derr), nil
		}
		if xerr != nil {
			return d.toolError(args.ContainerID, xerr), nil
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: args.ContainerSrcPath, Destination: hostJoin(args.LocalDestPath, rel, st.Path), Files: st.Files, Dirs: st.Dirs, Bytes: st.Bytes, Skipped: st.Skipped}
		return result(res, res.text("Copied")), nil
	}
}

// hostJoin names where a download landed: the requested path, or a file
// inside it when it was an existing directory.
func hostJoin(requested, rel, landed string) string {
	if landed == rel || landed == "" {
		return requested
	}
	return strings.TrimRight(requested, "/\\") + "/" + path.Base(landed)
}

// ReadFileResult is read_file's structured result.
type ReadFileResult struct {
	ContainerID string `json:"container_id"`
	Path        string `json:"path"`
	Size        int64  `json:"size"`
	// Encoding is "utf-8" (Content is the text) or "base64" (binary).
	Encoding string `json:"encoding"`
	Content  string `json:"content"`
}

// boundedWriter fails once more than max bytes are written, so a backend
// that ignores its own cap cannot make read_file buffer without bound.
type boundedWriter struct {
	buf bytes.Buffer
	max int
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > b.max {
		return 0, fmt.Errorf("%w: more than %d bytes", execio.ErrTooLarge, b.max)
	}
	return b.buf.Write(p)
}

func readFileTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("read_file",
		mcp.WithDescription(fmt.Sprintf("Read a file from a sandbox. UTF-8 text is returned as is; anything else as base64. Limit %s; use copy_file_from_sandbox or sandbox_exec (head, tail, grep) for larger files.", units.BytesSize(float64(d.cfg.MaxReadBytes)))),
		containerIDProp(),
		mcp.WithString("path", mcp.Required(), mcp.Description("Path in the sandbox: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory.")),
		mcp.WithOutputSchema[ReadFileResult](),
		annotations("Read file from sandbox", true, false, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args readFileArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkContainerID(args.ContainerID); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkSandboxPath("path", args.Path, true); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		w := &boundedWriter{max: int(d.cfg.MaxReadBytes) + 64<<10}
		if _, err := d.backend.Download(ctx, caller, args.ContainerID, args.Path, w, d.cfg.MaxReadBytes); err != nil {
			if errors.Is(err, execio.ErrTooLarge) {
				err = fmt.Errorf("%w: %q is larger than read_file's limit of %s; use copy_file_from_sandbox, or sandbox_exec with head/tail", execio.ErrTooLarge, args.Path, units.BytesSize(float64(d.cfg.MaxReadBytes)))
			}
			return d.toolError(args.ContainerID, err), nil
		}
		tr := tar.NewReader(&w.buf)
		hdr, err := tr.Next()
		if err != nil {
			return d.toolError(args.ContainerID, fmt.Errorf("reading the sandbox's archive: %w", err)), nil
		}
		if hdr.Typeflag == tar.TypeDir {
			return d.toolError(args.ContainerID, argError("%q is a directory; list it with sandbox_exec (ls -la)", args.Path)), nil
		}
		if hdr.Typeflag != tar.TypeReg {
			return d.toolError(args.ContainerID, argError("%q is not a regular file", args.Path)), nil
		}
		data, err := io.ReadAll(io.LimitReader(tr, d.cfg.MaxReadBytes+1))
		if err != nil {
			return d.toolError(args.ContainerID, fmt.Errorf("reading the sandbox's archive: %w", err)), nil
		}
		if int64(len(data)) > d.cfg.MaxReadBytes {
			return d.toolError(args.ContainerID, fmt.Errorf("%w: %q is larger than %d bytes", execio.ErrTooLarge, args.Path, d.cfg.MaxReadBytes)), nil
		}
		res := ReadFileResult{ContainerID: args.ContainerID, Path: args.Path, Size: int64(len(data))}
		if utf8.Valid(data) {
			res.Encoding, res.Content = "utf-8", string(data)
			return result(res, res.Content), nil
		}
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(data)
		return result(res, fmt.Sprintf("%q is binary (%d bytes); base64:\n%s", args.Path, len(data), res.Content)), nil
	}
}

// ListResult is list_sandboxes' structured result.
type ListResult struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

func listSandboxesTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("list_sandboxes",
		mcp.WithDescription("List your sandboxes with their image, status, network and expiry."),
		mcp.WithOutputSchema[ListResult](),
		annotations("List sandboxes", true, false, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args struct{}
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		list, err := d.backend.List(ctx, caller)
		if err != nil {
			return d.toolError("", err), nil
		}
		if list == nil {
			list = []Sandbox{}
		}
		var b strings.Builder
		if len(list) == 0 {
			b.WriteString("No sandboxes. Create one with sandbox_initialize.")
		}
		for _, s := range list {
			fmt.Fprintf(&b, "%s  image=%s  status=%s  network=%s  expires=%s\n", s.ID, s.Image, s.Status, s.Network, s.ExpiresAt.UTC().Format(time.RFC3339))
		}
		return result(ListResult{Sandboxes: list}, strings.TrimRight(b.String(), "\n")), nil
	}
}

// StopResult is sandbox_stop's structured result.
type StopResult struct {
	ContainerID string `json:"container_id"`
	Stopped     bool   `json:"stopped"`
}

func sandboxStopTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_stop",
		mcp.WithDescription("Stop a sandbox (SIGTERM, 10 s grace, then SIGKILL) and remove it with everything in it."),
		containerIDProp(),
		mcp.WithOutputSchema[StopResult](),
		annotations("Stop sandbox", false, true, true, false),
	)
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := CallerFrom(ctx)
		var args containerArgs
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		if err := checkContainerID(args.ContainerID); err != nil {
			return d.toolError("", err), nil
		}
		if err := d.backend.Stop(ctx, caller, args.ContainerID); err != nil {
			return d.toolError(args.ContainerID, err), nil
		}
		return result(StopResult{ContainerID: args.ContainerID, Stopped: true}, fmt.Sprintf("Sandbox %s stopped and removed.", args.ContainerID)), nil
	}
}
