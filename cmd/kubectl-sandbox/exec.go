package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

type execFlags struct {
	stdin       bool
	timeout     time.Duration
	workdir     string
	env         []string
	shell       string
	outputLimit string
	detach      bool
}

const execExample = `  # Run a command; its exit code becomes kubectl's
  kubectl sandbox exec analysis -- python3 -c 'print(6*7)'

  # A shell command line
  kubectl sandbox exec analysis --shell 'ls -l /app | wc -l'

  # Feed a script on stdin, with a longer timeout, in another directory
  kubectl sandbox exec analysis -i --timeout=5m -w /tmp -- python3 - < job.py

  # Environment variables for this command only
  kubectl sandbox exec analysis -e MODE=fast -e DEBUG=1 -- ./run.sh

  # In the background: print its handle at once, then follow it
  kubectl sandbox exec analysis --detach --shell 'make test'
  kubectl sandbox attach analysis HANDLE`

func newExecCommand(o *options) *cobra.Command {
	f := &execFlags{}
	cmd := &cobra.Command{
		Use:   "exec NAME [flags] (-- COMMAND [ARGS...] | --shell 'COMMAND LINE')",
		Short: "Run a command in a Sandbox",
		Long: `Run a command in a Sandbox and stream its stdout and stderr as it runs.

The command runs without a shell unless --shell is given (then /bin/sh -c).
With -i, stdin is read to the end (at most 16 MiB) and sent with the
command; it is not an interactive session.

Exit status: the command's own, 124 when it hit --timeout (its whole process
tree is killed), 1 when it could not be run (an error is printed).`,
		Example: execExample,
		Args:    minArgs(1, "a sandbox name is required"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, req, err := f.request(cmd, o, args)
			if err != nil {
				return err
			}
			if f.detach {
				// A detached process has no timeout unless asked for.
				var timeout time.Duration
				if cmd.Flags().Changed("timeout") {
					timeout = f.timeout
				}
				return runDetached(cmd, o, ns, name, req, timeout)
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Exec(cmd.Context(), sandboxclient.Named(ns, name), req, o.out, o.errOut)
			if err != nil {
				return err
			}
			return execOutcome(o.streams, res, req)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.stdin, "stdin", "i", false, "Send stdin (read to the end, at most 16 MiB) to the command.")
	fl.DurationVar(&f.timeout, "timeout", execio.DefaultTimeout, "Kill the command's process tree after this long (at most 24h).")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "Directory to run in; relative to the Sandbox's working directory, which is the default.")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "Set an environment variable, KEY=VALUE (repeatable).")
	fl.StringVar(&f.shell, "shell", "", "Run this command line with /bin/sh -c instead of COMMAND [ARGS...].")
	fl.BoolVarP(&f.detach, "detach", "d", false, "Start the command in the background, print its handle and return (see ps, attach, kill); it has no timeout unless --timeout is given.")
	fl.StringVar(&f.outputLimit, "output-limit", "", "Cap on each of stdout and stderr, e.g. 10Mi (default: the node's, 1Mi unless configured; at most 64Mi).")
	return cmd
}

// request turns the command line into an execio.Request.
func (f *execFlags) request(cmd *cobra.Command, o *options, args []string) (string, string, execio.Request, error) {
	usage := func(format string, a ...any) error {
		return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf(format, a...)}
	}
	var req execio.Request
	dash := cmd.ArgsLenAtDash()
	switch {
	case dash == 0:
		return "", "", req, usage("a sandbox name is required before --")
	case dash > 1:
		return "", "", req, usage("exactly one sandbox name before --, got %q", args[:dash])
	case dash < 0 && len(args) > 1:
		return "", "", req, usage("put -- between the sandbox name and the command: %s %s -- %s", cmd.CommandPath(), args[0], args[1])
	}
	name, err := parseSandboxName(args[0])
	if err != nil {
		return "", "", req, usage("%v", err)
	}
	command := args[1:]
	switch {
	case f.shell != "" && len(command) > 0:
		return "", "", req, usage("give either --shell or a command after --, not both")
	case f.shell == "" && len(command) == 0:
		return "", "", req, usage("no command: add -- COMMAND [ARGS...] or --shell 'COMMAND LINE'")
	}
	req.Command, req.Shell = command, f.shell
	if f.timeout <= 0 || f.timeout > execio.MaxTimeout {
		return "", "", req, usage("--timeout %s must be more than 0 and at most %s", f.timeout, execio.MaxTimeout)
	}
	// Whole seconds, rounded up: the API counts seconds, and rounding down
	// could turn 500ms into "no timeout given" (the default).
	req.TimeoutSeconds = int64((f.timeout + time.Second - 1) / time.Second)
	req.WorkingDir = f.workdir
	if req.Env, err = parseEnv(f.env); err != nil {
		return "", "", req, usage("%v", err)
	}
	if f.outputLimit != "" {
		q, err := resource.ParseQuantity(f.outputLimit)
		if err != nil {
			return "", "", req, usage("--output-limit %q: %v", f.outputLimit, err)
		}
		n, ok := q.AsInt64()
		if !ok || n <= 0 || n > execio.MaxOutputLimit {
			return "", "", req, usage("--output-limit %q must be between 1 and %d bytes", f.outputLimit, execio.MaxOutputLimit)
		}
		req.OutputLimitBytes = n
	}
	if f.stdin {
		if file, ok := o.in.(*os.File); ok {
			if fi, err := file.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				// Stdin is sent whole, so a terminal looks like a hang
				// unless the user knows to end it.
				fmt.Fprintln(o.errOut, "reading stdin until end of file (Ctrl-D); it is sent to the command in one piece")
			}
		}
		// One byte past the cap tells "exactly the cap" from "too much"
		// without reading an endless stream to its end.
		data, err := io.ReadAll(io.LimitReader(o.in, execio.MaxStdin+1))
		if err != nil {
			return "", "", req, fmt.Errorf("reading stdin: %w", err)
		}
		if int64(len(data)) > execio.MaxStdin {
			return "", "", req, fmt.Errorf("stdin is larger than %d MiB; copy the data in with `kubectl sandbox cp` and read it from a file", execio.MaxStdin>>20)
		}
		// Non-nil even when empty: the command gets an empty stdin that is
		// closed, rather than none.
		req.Stdin = append([]byte{}, data...)
	}
	ns, err := o.namespace("")
	if err != nil {
		return "", "", req, err
	}
	return ns, name, req, nil
}

// execOutcome reports truncation and timeouts on stderr and turns the
// command's exit status into ours.
func execOutcome(s *streams, res execio.Result, req execio.Request) error {
	if res.StdoutTruncated {
		s.warn(fmt.Sprintf("stdout was truncated: the command wrote %d bytes, more than the output limit; raise it with --output-limit", res.StdoutBytes))
	}
	if res.StderrTruncated {
		s.warn(fmt.Sprintf("stderr was truncated: the command wrote %d bytes, more than the output limit; raise it with --output-limit", res.StderrBytes))
	}
	if res.TimedOut {
		fmt.Fprintf(s.errOut, "error: the command timed out after %ds and its processes were killed\n", req.TimeoutSeconds)
		return &exitCodeError{code: exitTimeout}
	}
	if res.ExitCode != 0 {
		code := res.ExitCode
		if code < 0 || code > 255 {
			// Not representable as a process exit status; still a failure.
			code = exitError
		}
		return &exitCodeError{code: code}
	}
	return nil
}
