package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

const logsExample = `  # The container's output
  kubectl sandbox logs analysis

  # Follow it, starting with the last 20 lines
  kubectl sandbox logs analysis -f --tail=20

  # The commands run in the Sandbox, with exit codes and durations
  kubectl sandbox logs analysis --history

  # What the node's egress proxy refused, or added a credential to, lately
  kubectl sandbox logs analysis --egress`

func newLogsCommand(o *options) *cobra.Command {
	var (
		follow, showHistory, showEgress bool
		tail                            int
	)
	cmd := &cobra.Command{
		Use:   "logs NAME [-f] [--tail N] [--history | --egress]",
		Short: "Print a Sandbox's output, or the history of the commands run in it",
		Long: `Print the output of a Sandbox's main process (stdout and stderr
interleaved). With --history, print the commands run in it instead, one per
line: START-TIME exit=CODE DURATION [timed-out] [truncated] [error="…"] COMMAND.
With --egress, print the node egress proxy's recent decisions about the
Sandbox (docs/egress.md), one per line: TIME DECISION REASON HOST:PORT
[METHOD PATH]. Credentials never appear.

Works for Sandboxes that are no longer Ready too, to see why they stopped.`,
		Example: logsExample,
		Args:    exactArgs(1, "logs needs exactly one sandbox name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := parseSandboxName(args[0])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			if tail == 0 || tail < -1 {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--tail %d: want a positive number of lines, or -1 for all", tail)}
			}
			ns, err := o.namespace("")
			if err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			defer c.Close()
			if showEgress && (showHistory || follow) {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--egress cannot be combined with --history or --follow")}
			}
			opts := sandboxclient.LogOptions{Tail: max(tail, 0), Follow: follow}
			if showEgress {
				return c.EgressLog(cmd.Context(), sandboxclient.Named(ns, name), opts, func(ev subresource.EgressEvent) error {
					_, err := fmt.Fprintln(o.out, formatEgressEvent(ev))
					return err
				})
			}
			if showHistory {
				return c.History(cmd.Context(), sandboxclient.Named(ns, name), opts, func(r history.Record) error {
					_, err := fmt.Fprintln(o.out, formatRecord(r))
					return err
				})
			}
			return c.Logs(cmd.Context(), sandboxclient.Named(ns, name), opts, o.out)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "Keep streaming new output (or commands) until interrupted.")
	fl.IntVar(&tail, "tail", -1, "Only the last N lines (commands with --history); -1 for all.")
	fl.BoolVar(&showHistory, "history", false, "Print the history of commands run in the Sandbox instead of its output.")
	fl.BoolVar(&showEgress, "egress", false, "Print the node egress proxy's recent decisions about the Sandbox (refusals, injected requests) instead of its output.")
	return cmd
}

// formatRecord renders one history record as a line:
// TIME exit=N DURATION [markers] COMMAND.
func formatRecord(r history.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s exit=%d %s", r.StartedAt.UTC().Format(time.RFC3339), r.ExitCode, time.Duration(r.DurationMillis)*time.Millisecond)
	if r.TimedOut {
		b.WriteString(" timed-out")
	}
	if r.Truncated {
		b.WriteString(" truncated")
	}
	if r.Error != "" {
		fmt.Fprintf(&b, " error=%q", r.Error)
	}
	b.WriteByte(' ')
	if r.Shell != "" {
		b.WriteString("sh -c " + shellQuote(r.Shell))
	} else {
		for i, a := range r.Command {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(shellQuote(a))
		}
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it needs it, so that a history
// line can be pasted back and shows where each argument ends. Control
// characters are escaped so that a hostile command cannot forge lines or
// drive the terminal.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_@%+=:,./-", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			// $'…' is understood by bash, zsh and ksh; plain sh users see
			// an unambiguous escape either way.
			q := fmt.Sprintf("%q", s)
			return "$'" + strings.ReplaceAll(q[1:len(q)-1], `'`, `\'`) + "'"
		}
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// formatEgressEvent renders one egress decision as a line: TIME DECISION
// REASON HOST:PORT [METHOD PATH]. Host, method and path are what the
// sandbox sent: quoted when they hold anything but printable ASCII without
// spaces, so that no control character reaches the terminal.
func formatEgressEvent(ev subresource.EgressEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s %s", ev.Time.UTC().Format(time.RFC3339), safeField(ev.Decision), safeField(ev.Reason), safeField(ev.Host))
	if ev.Port != 0 {
		fmt.Fprintf(&b, ":%d", ev.Port)
	}
	if ev.Method != "" || ev.Path != "" {
		fmt.Fprintf(&b, " %s %s", safeField(ev.Method), safeField(ev.Path))
	}
	return b.String()
}

func safeField(s string) string {
	if s == "" {
		return "-"
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f || s[i] == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}
