package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// Background processes (the sandboxes/processes subresource): exec
// --detach starts one, ps lists them, attach follows one's output to its
// end, kill kills its tree. They live in the Sandbox, so they outlive this
// command, the caller's connection and a restart of the node's manager.

// attachWait is one wait of attach: under the API server's request
// timeout.
const attachWait = 30 * time.Second

// runDetached is exec --detach: start, print the handle.
func runDetached(cmd *cobra.Command, o *options, ns, name string, req execio.Request, timeout time.Duration) error {
	if req.Stdin != nil {
		return &usageError{cmd: cmd.CommandPath(), err: errors.New("--detach does not take -i; the process's stdin is written through the processes subresource (exec_write_stdin in MCP)")}
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := c.StartProcess(cmd.Context(), sandboxclient.Named(ns, name), req, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintln(o.out, st.Handle)
	fmt.Fprintf(o.errOut, "started in the background; follow it with: kubectl sandbox attach %s %s\n", name, st.Handle)
	return nil
}

func newPsCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "ps NAME",
		Short: "List a Sandbox's background processes",
		Long: fmt.Sprintf(`List the background processes of a Sandbox (started with exec --detach, or
by an agent through MCP), running and finished, oldest first. A Sandbox keeps
at most %d; starting one more drops the oldest finished one.`, execio.MaxProcesses),
		Example: "  kubectl sandbox ps analysis",
		Args:    exactArgs(1, "a sandbox name is required"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := nameAndNamespace(cmd, o, args[0])
			if err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			defer c.Close()
			list, err := c.ListProcesses(cmd.Context(), sandboxclient.Named(ns, name))
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(o.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "HANDLE\tSTATE\tEXIT\tSTARTED\tCOMMAND")
			for _, st := range list {
				code := ""
				if st.ExitCode != nil {
					code = fmt.Sprint(*st.ExitCode)
				}
				cmdline := strings.Join(st.Command, " ")
				if len(cmdline) > 80 {
					cmdline = cmdline[:77] + "..."
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", st.Handle, st.State, code, st.StartedAt.Local().Format(time.RFC3339), cmdline)
			}
			return tw.Flush()
		},
	}
}

func newAttachCommand(o *options) *cobra.Command {
	var fromEnd bool
	cmd := &cobra.Command{
		Use:   "attach NAME HANDLE",
		Short: "Follow a background process's output until it exits",
		Long: fmt.Sprintf(`Print a background process's stdout and stderr, from the start of what the
Sandbox keeps (the last %d KiB of each) or with --new only what follows, and
keep following until it exits. Interrupting attach leaves the process
running.

Exit status: the process's own, 1 when it could not be followed.`, execio.ProcessRingBytes>>10),
		Example: "  kubectl sandbox attach analysis p-3f2a9c0d1e4b5a6978695a4b",
		Args:    exactArgs(2, "a sandbox name and a process handle are required"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := nameAndNamespace(cmd, o, args[0])
			if err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ref := sandboxclient.Named(ns, name)
			var outOff, errOff int64
			if fromEnd {
				out, err := c.PollProcess(cmd.Context(), ref, args[1], 1<<62, 1<<62)
				if err != nil {
					return err
				}
				outOff, errOff = out.Stdout.Next, out.Stderr.Next
			}
			for {
				out, err := c.WaitProcess(cmd.Context(), ref, args[1], outOff, errOff, attachWait)
				if err != nil {
					return err
				}
				fmt.Fprint(o.out, out.Stdout.Text("stdout"))
				fmt.Fprint(o.errOut, out.Stderr.Text("stderr"))
				outOff, errOff = out.Stdout.Next, out.Stderr.Next
				switch {
				case out.State == execio.ProcessRunning:
					continue
				case out.ExitCode == nil:
					return fmt.Errorf("background process %s is %s: its supervisor in the sandbox is gone and its exit code is unknown", args[1], out.State)
				case *out.ExitCode != 0:
					code := *out.ExitCode
					if code < 0 || code > 255 {
						code = exitError
					}
					return &exitCodeError{code: code}
				}
				return nil
			}
		},
	}
	cmd.Flags().BoolVar(&fromEnd, "new", false, "Print only output written from now on.")
	return cmd
}

func newKillCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "kill NAME HANDLE",
		Short:   "Kill a background process's whole process tree",
		Example: "  kubectl sandbox kill analysis p-3f2a9c0d1e4b5a6978695a4b",
		Args:    exactArgs(2, "a sandbox name and a process handle are required"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := nameAndNamespace(cmd, o, args[0])
			if err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.KillProcess(cmd.Context(), sandboxclient.Named(ns, name), args[1])
			if err != nil {
				return err
			}
			code := "unknown"
			if st.ExitCode != nil {
				code = fmt.Sprint(*st.ExitCode)
			}
			fmt.Fprintf(o.out, "%s %s (exit code %s)\n", st.Handle, st.State, code)
			return nil
		},
	}
}

func nameAndNamespace(cmd *cobra.Command, o *options, arg string) (string, string, error) {
	name, err := parseSandboxName(arg)
	if err != nil {
		return "", "", &usageError{cmd: cmd.CommandPath(), err: err}
	}
	ns, err := o.namespace("")
	return ns, name, err
}
