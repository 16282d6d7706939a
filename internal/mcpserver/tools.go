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
	"os"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/docker/go-units"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/hostfs"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
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

// toolFunc is a tool's own logic, run by typedTool once the preamble every
// tool shares is done: caller is the request's identity, args are bound
// strictly and, when they name a sandbox, its container_id is well-formed.
// A returned error becomes the call's error result (see deps.toolError),
// about the sandbox args name; the error is never a protocol error.
type toolFunc[A any] func(ctx context.Context, req mcp.CallToolRequest, caller contract.Caller, args A) (*mcp.CallToolResult, error)

// sandboxArgs is implemented by the arguments of every tool that acts on
// one sandbox.
type sandboxArgs interface{ containerID() string }

// typedTool returns tool with a handler that takes the caller from the
// context, binds the call's arguments into an A with bindArgs (unknown or
// mistyped arguments are named), checks container_id when A is sandboxArgs,
// runs h, and turns an error h returns into an error result for the
// model to act on.
func typedTool[A any](d *deps, tool mcp.Tool, h toolFunc[A]) (mcp.Tool, server.ToolHandlerFunc) {
	return tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, _ := contract.CallerFrom(ctx)
		var args A
		if err := bindArgs(rawArgs(req), &args); err != nil {
			return d.toolError("", err), nil
		}
		id := ""
		if sa, ok := any(args).(sandboxArgs); ok {
			id = sa.containerID()
			if err := checkContainerID(id); err != nil {
				return d.toolError("", err), nil
			}
		}
		res, err := h(ctx, req, caller, args)
		if err != nil {
			return d.toolError(id, err), nil
		}
		return res, nil
	}
}

// cpuText, quantityText, graceText and parenthesized write the backend's
// defaults (Config.Sandbox*, StopGrace) into the tool descriptions, in the
// units the arguments take; a zero value is described without a number.
func cpuText(nanoCPUs int64) string {
	if nanoCPUs <= 0 {
		return "the server's default"
	}
	return strconv.FormatFloat(float64(nanoCPUs)/1e9, 'g', -1, 64)
}

func quantityText(bytes int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if bytes > 0 && bytes%u.size == 0 {
			return strconv.FormatInt(bytes/u.size, 10) + u.suffix
		}
	}
	if bytes <= 0 {
		return "the server's default"
	}
	return strconv.FormatInt(bytes, 10)
}

func graceText(grace time.Duration) string {
	switch {
	case grace <= 0:
		return "a grace period"
	case grace%time.Second == 0:
		return fmt.Sprintf("%d s grace", grace/time.Second)
	}
	return grace.String() + " grace"
}

func parenthesized(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// defaultParenthesized is parenthesized with "default ".
func defaultParenthesized(s string) string {
	if s == "" {
		return ""
	}
	return " (default " + s + ")"
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
	networks := []string{contract.NetworkNone}
	if d.cfg.AllowEgress {
		networks = append(networks, contract.NetworkEgress)
	}
	opts := []mcp.ToolOption{
		mcp.WithDescription(fmt.Sprintf("Create a new hardened sandbox and return its container_id. Default image: %s. The sandbox has no network unless network is \"egress\" (when this server allows it), runs as a non-root user with a read-only root filesystem, and its working directory%s, /tmp and /var/tmp are writable. It is removed after a period without use, at the end of its lifetime, on sandbox_stop, or when this server exits.", d.cfg.DefaultImage, parenthesized(d.cfg.SandboxWorkingDir))),
		mcp.WithString("image", mcp.Description("Container image to run; it must already be present on the host unless the server's pull policy allows pulling. Default: "+d.cfg.DefaultImage)),
		mcp.WithNumber("cpu", mcp.Description(fmt.Sprintf("CPU cores (default %s).", cpuText(d.cfg.SandboxNanoCPUs))), mcp.Min(0.01), mcp.Max(float64(d.cfg.MaxNanoCPUs)/1e9)),
		mcp.WithString("memory", mcp.Description(fmt.Sprintf(`Memory limit, for example "512Mi" or "1g" (default %s; swap is off).`, quantityText(d.cfg.SandboxMemoryBytes)))),
		mcp.WithString("network", mcp.Description(`"none" (default; loopback only) or "egress" (outbound network, only if the server allows it).`), mcp.Enum(networks...)),
		mcp.WithInteger("lifetime_seconds", mcp.Description("Maximum lifetime in seconds; default and maximum "+fmt.Sprint(int64(d.cfg.MaxLifetime/time.Second))+"."), mcp.Min(1), mcp.Max(int(d.cfg.MaxLifetime/time.Second))),
		mcp.WithOutputSchema[InitializeResult](),
		annotations("Create sandbox", false, false, false, false),
	}
	if d.cfg.AllowEgress {
		opts = append(opts,
			mcp.WithArray("egress_allow", mcp.Description(fmt.Sprintf(`Host names the sandbox may reach, and nothing else (implies network "egress"; only if the server allows egress): lower-case DNS names such as "pypi.org", or "*.example.com" for every name below example.com (not example.com itself). No IP addresses. At most %d; leave it out for unrestricted egress. Not every backend supports it.`, contract.MaxEgressAllow)),
				mcp.WithStringItems(mcp.MaxLength(253)), mcp.MaxItems(contract.MaxEgressAllow)),
		)
	}
	tool := mcp.NewTool("sandbox_initialize", opts...)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args initializeArgs) (*mcp.CallToolResult, error) {
		creq, err := args.createRequest(d.cfg)
		if err != nil {
			return nil, err
		}
		sb, err := d.backend.Create(ctx, caller, creq)
		if err != nil {
			return nil, err
		}
		res := InitializeResult{ContainerID: sb.ID, Image: sb.Image, Network: sb.Network, WorkingDir: sb.WorkingDir, ExpiresAt: sb.ExpiresAt}
		text := fmt.Sprintf("Sandbox created. container_id: %s\nimage: %s, network: %s, working directory: %s, expires at %s.",
			sb.ID, sb.Image, sb.Network, sb.WorkingDir, sb.ExpiresAt.UTC().Format(time.RFC3339))
		return result(res, text), nil
	})
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
	// NotRun counts the commands skipped after a failure, or after a
	// command that was still running at yield_after_seconds.
	NotRun int `json:"not_run"`
	// Background is the command started with background, or the one
	// still running at yield_after_seconds: its handle, and its output so
	// far.
	Background *ProcessResult `json:"background,omitempty"`
}

// inlineOutput is what a result shows of one stream: the end of what tb
// kept, at most keep bytes, after a marker when the start was dropped
// (by the tail, or here to fit the call's output budget). A UTF-8
// sequence cut at the start is skipped; invalid bytes become U+FFFD.
func inlineOutput(tb *execio.TailBuffer, stream string, keep int) (string, bool) {
	b := tb.Bytes()
	if len(b) > keep {
		b = b[len(b)-max(keep, 0):]
	}
	dropped := tb.Written() - int64(len(b))
	if dropped == 0 {
		return strings.ToValidUTF8(string(b), "\uFFFD"), false
	}
	for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b, dropped = b[1:], dropped+1
	}
	return execio.TailMarker(stream, dropped) + strings.ToValidUTF8(string(b), "\uFFFD"), true
}

// fitShare splits share bytes between a command's stdout and stderr of
// sizes out and errn: each keeps all it has if both fit, otherwise the
// smaller keeps up to half and the larger the rest.
func fitShare(share, out, errn int) (int, int) {
	if out+errn <= share {
		return out, errn
	}
	if out <= errn {
		o := min(out, share/2)
		return o, share - o
	}
	e := min(errn, share/2)
	return share - e, e
}

func sandboxExecTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_exec",
		mcp.WithDescription(fmt.Sprintf("Run shell commands in a sandbox, in order, each with `sh -c`. Stops at the first command that fails (non-zero exit or timeout) and reports it as an error. Each command gets its own timeout (default %s) after which its whole process tree is killed; stdout and stderr are each capped at %s, and the whole call keeps at most %s of output, the end of each command's (markers show what was cut). Output streams while the command runs as progress notifications (when the request has a progress token) and log messages.", d.cfg.CommandTimeout, units.BytesSize(float64(d.cfg.OutputLimit)), units.BytesSize(float64(d.cfg.ExecOutputBudget)))),
		containerIDProp(),
		mcp.WithArray("commands", mcp.Required(), mcp.Description("Shell command lines, for example [\"cd /app && python3 main.py\"]."), mcp.WithStringItems(), mcp.MinItems(1), mcp.MaxItems(MaxCommandsPerExec)),
		mcp.WithInteger("timeout_seconds", mcp.Description(fmt.Sprintf("Timeout per command in seconds (default %d, maximum %d).", int64(d.cfg.CommandTimeout/time.Second), int64(d.cfg.MaxTimeout/time.Second))), mcp.Min(1), mcp.Max(int(d.cfg.MaxTimeout/time.Second))),
		mcp.WithString("workdir", mcp.Description("Absolute working directory for the commands (default: the sandbox's working directory).")),
		mcp.WithObject("env", mcp.Description("Extra environment variables, as {\"NAME\": \"value\"}."), mcp.AdditionalProperties(map[string]any{"type": "string"})),
		mcp.WithBoolean("background", mcp.Description("Start the one command in the background and return its handle at once; exec_wait, exec_poll, exec_write_stdin and exec_kill act on it. It survives this call, the client's disconnect and a restart of this server; timeout_seconds still bounds it.")),
		mcp.WithInteger("yield_after_seconds", mcp.Description(fmt.Sprintf("A command still running after this many seconds returns its handle and its output so far instead of blocking, and the commands after it are not run (0: never). Default %d when timeout_seconds is longer than that, or when timeout_seconds is not given and the server's default command timeout (%d s) is above 60; otherwise never.", int(DefaultYieldAfter/time.Second), int(d.cfg.CommandTimeout/time.Second))), mcp.Min(0), mcp.Max(int(d.cfg.MaxTimeout/time.Second))),
		mcp.WithOutputSchema[ExecResult](),
		annotations("Run commands", false, true, false, d.cfg.AllowEgress),
	)
	return typedTool(d, tool, func(ctx context.Context, req mcp.CallToolRequest, caller contract.Caller, args execArgs) (*mcp.CallToolResult, error) {
		reqs, err := args.requests(d.cfg)
		if err != nil {
			return nil, err
		}
		yield, err := args.yieldAfter(d.cfg)
		if err != nil {
			return nil, err
		}
		if args.Background {
			if len(reqs) != 1 {
				return nil, argError("background takes exactly one command (got %d); join several with && in one", len(reqs))
			}
			return d.startBackground(ctx, caller, args.ContainerID, reqs[0])
		}
		stream := newOutputStreamer(ctx, req, args.ContainerID)
		out := ExecResult{ContainerID: args.ContainerID, Success: true}
		var text strings.Builder
		// The call's output budget is shared out as the commands run: each
		// may keep the remaining budget divided by the commands left (so
		// a quiet command leaves its share to the next), and keeps the
		// end of its output within that.
		remaining := d.cfg.ExecOutputBudget
		for i, r := range reqs {
			stream.begin(i, r.Shell)
			share := int(remaining / int64(len(reqs)-i))
			// The backend caps each stream at OutputLimitBytes plus its
			// truncation marker; a backend that does not is held to it
			// here as well.
			perStream := min(int(r.OutputLimitBytes)+4096, share)
			stdout, stderr := execio.NewTailBuffer(perStream), execio.NewTailBuffer(perStream)
			var (
				res     execio.Result
				yielded *ProcessResult
			)
			if yield > 0 && r.Timeout() > yield {
				res, yielded, err = d.execYielding(ctx, caller, args.ContainerID, r, yield, stream.write, stdout, stderr)
			} else {
				res, err = d.backend.Exec(ctx, caller, args.ContainerID, r, func(s string, p []byte) {
					if s == "stderr" {
						_, _ = stderr.Write(p)
					} else {
						_, _ = stdout.Write(p)
					}
					stream.write(s, p)
				})
			}
			if err != nil && i == 0 && stdout.Written() == 0 && stderr.Written() == 0 {
				stream.close()
				return nil, err
			}
			keepOut, keepErr := fitShare(share, stdout.Len(), stderr.Len())
			outText, outCut := inlineOutput(stdout, "stdout", keepOut)
			errText, errCut := inlineOutput(stderr, "stderr", keepErr)
			stdout, stderr = nil, nil
			remaining -= int64(keepOut + keepErr)
			cr := CommandResult{
				Command:    r.Shell,
				ExitCode:   res.ExitCode,
				Stdout:     outText,
				Stderr:     errText,
				DurationMS: res.DurationMillis,
				Truncated:  res.Truncated() || outCut || errCut,
				TimedOut:   res.TimedOut,
			}
			if err != nil {
				cr.Error = resultText(d.toolError(args.ContainerID, err))
				cr.ExitCode = -1
			}
			out.Results = append(out.Results, cr)
			if yielded != nil && err == nil && len(reqs) == 1 && tasks.Declared(ctx) {
				// A client that declared the Tasks extension gets the
				// command that runs on as a task (one command only: a
				// task's result is that of the whole call).
				stream.close()
				return d.createTask(ctx, caller, args.ContainerID, r, execio.ProcessStatus{Handle: yielded.Handle}), nil
			}
			if yielded != nil && err == nil {
				out.Results[len(out.Results)-1].ExitCode = -1
				out.Background = yielded
				out.NotRun = len(reqs) - i - 1
				renderYielded(&text, cr, *yielded, yield, out.NotRun)
				break
			}
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
	})
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
		b.WriteString("[output truncated at the per-stream cap or to fit the call's output budget; a marker shows where]\n")
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
func (d *deps) upload(ctx context.Context, caller contract.Caller, id, destDir string, limits execio.UploadLimits, produce func(io.Writer) error) (execio.TransferStats, error) {
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := produce(pw)
		pw.CloseWithError(err)
		produced <- err
	}()
	stats, err := d.backend.Upload(ctx, caller, id, destDir, pr, limits)
	// Unblock the producer if the backend stopped reading early; its error
	// is then only the echo of the backend's.
	pr.CloseWithError(errUploadEnded)
	perr := <-produced
	if perr != nil && !errors.Is(perr, io.ErrClosedPipe) && !errors.Is(perr, errUploadEnded) {
		return stats, perr
	}
	return stats, err
}

// errUploadEnded is what a producer sees when the backend stopped reading.
var errUploadEnded = errors.New("upload ended")

func copyProjectTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("copy_project",
		mcp.WithDescription(fmt.Sprintf("Copy the contents of a host directory into a sandbox directory. Only regular files and directories are copied; symlinks are skipped, never followed. The host directory must lie inside a directory this server allows (%s). Limits: %s, %d entries.", describeRoots(d.cfg.HostRoots), units.BytesSize(float64(d.cfg.MaxUploadBytes)), d.cfg.MaxUploadEntries)),
		containerIDProp(),
		mcp.WithString("local_src_dir", mcp.Required(), mcp.Description("Absolute path of the host directory to copy.")),
		mcp.WithString("dest_dir", mcp.Description("Sandbox directory that receives the contents: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory. Default: the working directory.")),
		mcp.WithOutputSchema[TransferResult](),
		annotations("Copy host directory into sandbox", false, true, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args copyProjectArgs) (*mcp.CallToolResult, error) {
		dest := args.DestDir
		if dest == "" {
			dest = "."
		}
		if err := checkSandboxPath("dest_dir", dest, true); err != nil {
			return nil, err
		}
		root, rel, err := d.hostRoots(caller).openExisting("local_src_dir", args.LocalSrcDir)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		lim := hostfs.TreeLimits{MaxBytes: d.cfg.MaxUploadBytes, MaxEntries: d.cfg.MaxUploadEntries}
		scan, err := hostfs.ScanTree(root, rel, lim)
		if errors.Is(err, hostfs.ErrWrongType) {
			err = argError("local_src_dir %q is not a directory; use copy_file for a single file", args.LocalSrcDir)
		}
		if err != nil {
			return nil, err
		}
		stats, err := d.upload(ctx, caller, args.ContainerID, dest, execio.UploadLimits{MaxBytes: d.cfg.MaxUploadBytes, MaxEntries: d.cfg.MaxUploadEntries}, func(w io.Writer) error {
			_, err := hostfs.WriteTree(w, root, rel, lim)
			return err
		})
		if err != nil {
			return nil, err
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: args.LocalSrcDir, Destination: dest, Files: stats.Files, Dirs: stats.Dirs, Bytes: stats.Bytes, Skipped: scan.Skipped}
		return result(res, res.text("Copied")), nil
	})
}

func describeRoots(h *HostRoots) string {
	if h == nil || len(h.roots) == 0 {
		return "none: host file access is disabled; start the server with --allow-host-dir to enable it"
	}
	if h.perIdentity {
		return "your own subdirectory of " + strings.Join(h.roots, ", ") + "; an error names it"
	}
	return strings.Join(h.roots, ", ")
}

// hostRoots returns the host directories caller may use; an error becomes
// their openers' error.
func (d *deps) hostRoots(caller contract.Caller) hostOpener {
	roots, err := d.cfg.HostRoots.ForCaller(caller)
	if err != nil {
		return hostOpener{err: err}
	}
	return hostOpener{roots: roots}
}

type hostOpener struct {
	roots *HostRoots
	err   error
}

func (o hostOpener) openExisting(arg, p string) (*os.Root, string, error) {
	if o.err != nil {
		return nil, "", o.err
	}
	return o.roots.openExisting(arg, p)
}

func (o hostOpener) openDest(arg, p string) (*os.Root, string, error) {
	if o.err != nil {
		return nil, "", o.err
	}
	return o.roots.openDest(arg, p)
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
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args copyFileArgs) (*mcp.CallToolResult, error) {
		root, rel, err := d.hostRoots(caller).openExisting("local_src_file", args.LocalSrcFile)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		destPath := args.DestPath
		if destPath == "" {
			destPath = path.Base(rel)
		}
		dir, base, err := sandboxFilePath("dest_path", destPath)
		if err != nil {
			return nil, err
		}
		f, err := root.Open(rel)
		if err != nil {
			return nil, argError("opening local_src_file: %v", err)
		}
		defer f.Close()
		info, err := f.Stat()
		switch {
		case err != nil:
			return nil, argError("local_src_file: %v", err)
		case info.IsDir():
			return nil, argError("local_src_file %q is a directory; use copy_project", args.LocalSrcFile)
		case !info.Mode().IsRegular():
			return nil, argError("local_src_file %q is not a regular file", args.LocalSrcFile)
		case info.Size() > d.cfg.MaxFileBytes:
			return nil, argError("local_src_file is %s; the limit is %s", units.BytesSize(float64(info.Size())), units.BytesSize(float64(d.cfg.MaxFileBytes)))
		}
		stats, err := d.upload(ctx, caller, args.ContainerID, dir, execio.UploadLimits{MaxBytes: d.cfg.MaxFileBytes, MaxEntries: 1}, func(w io.Writer) error {
			return execio.WriteSingleFileTar(w, base, int64(info.Mode().Perm()), info.Size(), f)
		})
		if err != nil {
			return nil, err
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: args.LocalSrcFile, Destination: path.Join(dir, base), Files: stats.Files, Bytes: stats.Bytes}
		return result(res, res.text("Copied")), nil
	})
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
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args writeFileArgs) (*mcp.CallToolResult, error) {
		if args.FileContents == nil {
			return nil, argError(`"file_contents" is required (it may be an empty string)`)
		}
		if int64(len(*args.FileContents)) > limit {
			return nil, argError("file_contents is %d bytes; the limit is %d", len(*args.FileContents), limit)
		}
		if err := checkSandboxPath("file_name", args.FileName, true); err != nil {
			return nil, err
		}
		if err := checkSandboxPath("dest_dir", args.DestDir, false); err != nil {
			return nil, err
		}
		target := args.FileName
		if args.DestDir != "" && !path.IsAbs(args.FileName) {
			target = path.Join(args.DestDir, args.FileName)
		} else if args.DestDir != "" {
			return nil, argError("file_name %q is absolute; give a relative file_name with dest_dir, or an absolute file_name alone", args.FileName)
		}
		dir, base, err := sandboxFilePath("file_name", target)
		if err != nil {
			return nil, err
		}
		contents := *args.FileContents
		stats, err := d.upload(ctx, caller, args.ContainerID, dir, execio.UploadLimits{MaxBytes: max(limit, 1), MaxEntries: 1}, func(w io.Writer) error {
			return execio.WriteSingleFileTar(w, base, 0o644, int64(len(contents)), strings.NewReader(contents))
		})
		if err != nil {
			return nil, err
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: "file_contents", Destination: path.Join(dir, base), Files: stats.Files, Bytes: stats.Bytes}
		return result(res, fmt.Sprintf("Wrote %d bytes to %s in sandbox %s.", len(contents), res.Destination, args.ContainerID)), nil
	})
}

func copyFileFromSandboxTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("copy_file_from_sandbox",
		mcp.WithDescription(fmt.Sprintf("Copy one file from a sandbox to the host (or, with a trailing / on container_src_path, a directory tree). The sandbox's content never decides what lands: if container_src_path is not exactly one regular file (or, with a trailing /, a directory of regular files and directories) the copy fails and nothing is written. Existing host files are not replaced unless overwrite is true; directories are never merged. Files land without exec bits unless keep_exec_bits is true, never group/world-writable. The host destination must lie inside a directory this server allows (%s); host symlinks are never followed out of it. Limit %s.", describeRoots(d.cfg.HostRoots), units.BytesSize(float64(d.cfg.MaxFileBytes)))),
		containerIDProp(),
		mcp.WithString("container_src_path", mcp.Required(), mcp.Description("Path in the sandbox: absolute (under the working directory, /tmp or /var/tmp) or relative to the working directory. It names a file; end it with / to copy a directory (which lands as a new directory), or with /. to copy a directory's contents into a new local_dest_path.")),
		mcp.WithString("local_dest_path", mcp.Required(), mcp.Description("Absolute host path to write. An existing directory receives the file (or directory) inside it, under its sandbox name.")),
		mcp.WithBoolean("overwrite", mcp.Description("Replace an existing host file. Default false. Directories are never replaced or merged.")),
		mcp.WithBoolean("keep_exec_bits", mcp.Description("Keep the files' exec bits. Default false: downloaded files are not executable.")),
		mcp.WithOutputSchema[TransferResult](),
		annotations("Copy file from sandbox to host", false, true, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args copyFromSandboxArgs) (*mcp.CallToolResult, error) {
		if err := checkSandboxPath("container_src_path", args.ContainerSrcPath, true); err != nil {
			return nil, err
		}
		root, rel, err := d.hostRoots(caller).openDest("local_dest_path", args.LocalDestPath)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		if _, err := d.backend.Get(ctx, caller, args.ContainerID); err != nil {
			return nil, err
		}
		opts := hostfs.Options{Overwrite: args.Overwrite, KeepExec: args.KeepExecBits, MaxBytes: d.cfg.MaxFileBytes}
		st, err := hostfs.Download(root, rel, hostfs.ParseSource(args.ContainerSrcPath), opts, func(w io.Writer) error {
			_, err := d.backend.Download(ctx, caller, args.ContainerID, args.ContainerSrcPath, w, d.cfg.MaxFileBytes)
			return err
		})
		if errors.Is(err, hostfs.ErrExists) || errors.Is(err, hostfs.ErrWrongType) {
			err = fmt.Errorf("%w: %w", errArgs, err)
		}
		if err != nil {
			return nil, err
		}
		res := TransferResult{ContainerID: args.ContainerID, Source: args.ContainerSrcPath, Destination: hostJoin(args.LocalDestPath, rel, st.Path), Files: st.Files, Dirs: st.Dirs, Bytes: st.Bytes}
		return result(res, res.text("Copied")), nil
	})
}

// hostJoin names where a download landed: the requested path, or an entry
// inside it when it was a directory.
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
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args readFileArgs) (*mcp.CallToolResult, error) {
		if err := checkSandboxPath("path", args.Path, true); err != nil {
			return nil, err
		}
		w := &boundedWriter{max: int(d.cfg.MaxReadBytes) + 64<<10}
		if _, err := d.backend.Download(ctx, caller, args.ContainerID, args.Path, w, d.cfg.MaxReadBytes); err != nil {
			if errors.Is(err, execio.ErrTooLarge) {
				err = fmt.Errorf("%w: %q is larger than read_file's limit of %s; use copy_file_from_sandbox, or sandbox_exec with head/tail", execio.ErrTooLarge, args.Path, units.BytesSize(float64(d.cfg.MaxReadBytes)))
			}
			return nil, err
		}
		tr := tar.NewReader(&w.buf)
		hdr, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("reading the sandbox's archive: %w", err)
		}
		if hdr.Typeflag == tar.TypeDir {
			return nil, argError("%q is a directory; list it with sandbox_exec (ls -la)", args.Path)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, argError("%q is not a regular file", args.Path)
		}
		data, err := io.ReadAll(io.LimitReader(tr, d.cfg.MaxReadBytes+1))
		if err != nil {
			return nil, fmt.Errorf("reading the sandbox's archive: %w", err)
		}
		if int64(len(data)) > d.cfg.MaxReadBytes {
			return nil, fmt.Errorf("%w: %q is larger than %d bytes", execio.ErrTooLarge, args.Path, d.cfg.MaxReadBytes)
		}
		res := ReadFileResult{ContainerID: args.ContainerID, Path: args.Path, Size: int64(len(data))}
		if utf8.Valid(data) {
			res.Encoding, res.Content = "utf-8", string(data)
			return result(res, res.Content), nil
		}
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(data)
		return result(res, fmt.Sprintf("%q is binary (%d bytes); base64:\n%s", args.Path, len(data), res.Content)), nil
	})
}

// ListResult is list_sandboxes' structured result.
type ListResult struct {
	Sandboxes []contract.Sandbox `json:"sandboxes"`
}

func listSandboxesTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("list_sandboxes",
		mcp.WithDescription("List your sandboxes with their image, status, network and expiry."),
		mcp.WithOutputSchema[ListResult](),
		annotations("List sandboxes", true, false, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, _ struct{}) (*mcp.CallToolResult, error) {
		list, err := d.backend.List(ctx, caller)
		if err != nil {
			return nil, err
		}
		if list == nil {
			list = []contract.Sandbox{}
		}
		var b strings.Builder
		if len(list) == 0 {
			b.WriteString("No sandboxes. Create one with sandbox_initialize.")
		}
		for _, s := range list {
			fmt.Fprintf(&b, "%s  image=%s  status=%s  network=%s  expires=%s\n", s.ID, s.Image, s.Status, s.Network, s.ExpiresAt.UTC().Format(time.RFC3339))
		}
		return result(ListResult{Sandboxes: list}, strings.TrimRight(b.String(), "\n")), nil
	})
}

// StopResult is sandbox_stop's structured result.
type StopResult struct {
	ContainerID string `json:"container_id"`
	Stopped     bool   `json:"stopped"`
}

func sandboxStopTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("sandbox_stop",
		mcp.WithDescription(fmt.Sprintf("Stop a sandbox (SIGTERM, %s, then SIGKILL) and remove it with everything in it.", graceText(d.cfg.StopGrace))),
		containerIDProp(),
		mcp.WithOutputSchema[StopResult](),
		annotations("Stop sandbox", false, true, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args containerArgs) (*mcp.CallToolResult, error) {
		if err := d.backend.Stop(ctx, caller, args.ContainerID); err != nil {
			return nil, err
		}
		return result(StopResult{ContainerID: args.ContainerID, Stopped: true}, fmt.Sprintf("Sandbox %s stopped and removed.", args.ContainerID)), nil
	})
}
