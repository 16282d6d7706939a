package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

const topExample = `  # CPU, memory, processes, disk and network of every Sandbox in the namespace
  kubectl sandbox top

  # One Sandbox
  kubectl sandbox top analysis`

// topParallel bounds the metrics reads in flight: each takes about a
// second (the node samples the CPU counters twice).
const topParallel = 8

func newTopCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "top [NAME]",
		Short: "Show the resource use of one or all Sandboxes of the namespace",
		Long: `Show CPU (cores and % of the limit), memory, processes and the bytes in
the writable paths (all tmpfs together: the working directory, /tmp,
/var/tmp) against their limits, each path's own use (PATHS; "-" where it
cannot be read without waking the Sandbox), and the network bytes of
Egress Sandboxes.
Each figure is measured at the time of the call, on the node, without
waking a paused Sandbox (needs get on sandboxes/metrics; without NAME, list
on sandboxes too). A Sandbox whose figures cannot be read shows why.`,
		Example: topExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("top takes at most one sandbox name (got %d arguments)", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			if len(args) == 1 {
				name, err := parseSandboxName(args[0])
				if err != nil {
					return &usageError{cmd: cmd.CommandPath(), err: err}
				}
				names = []string{name}
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
			if names == nil {
				if names, err = c.SandboxNames(cmd.Context(), ns); err != nil {
					return err
				}
				if len(names) == 0 {
					_, err := fmt.Fprintf(o.errOut, "No Sandboxes in namespace %s.\n", ns)
					return err
				}
			}
			rows := readMetrics(cmd.Context(), c, ns, names)
			if len(args) == 1 && rows[0].err != nil {
				return rows[0].err
			}
			return printTop(o.out, rows)
		},
	}
}

type topRow struct {
	name string
	m    subresource.Metrics
	err  error
}

func readMetrics(ctx context.Context, c *sandboxclient.Client, ns string, names []string) []topRow {
	rows := make([]topRow, len(names))
	sem := make(chan struct{}, topParallel)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			m, err := c.Metrics(ctx, sandboxclient.Named(ns, name))
			rows[i] = topRow{name: name, m: m, err: err}
		}()
	}
	wg.Wait()
	return rows
}

func printTop(w io.Writer, rows []topRow) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCPU(cores)\tCPU%\tMEMORY\tMEMORY%\tPIDS\tDISK\tPATHS\tNET(rx/tx)\tSTATE")
	for _, r := range rows {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n", r.name, topError(r.err))
			continue
		}
		m := r.m
		state := "Running"
		if m.Paused {
			state = "Paused"
		}
		net := "-"
		if m.Network != nil {
			net = bytesIEC(m.Network.RxBytes) + "/" + bytesIEC(m.Network.TxBytes)
		}
		var diskLimit int64
		var paths []string
		for _, p := range m.Disk.Paths {
			diskLimit += p.LimitBytes
			if p.UsedBytes != nil {
				paths = append(paths, p.Path+"="+bytesIEC(*p.UsedBytes))
			}
		}
		pathCol := "-"
		if len(paths) > 0 {
			pathCol = strings.Join(paths, ",")
		}
		fmt.Fprintf(tw, "%s\t%.3f/%s\t%s\t%s/%s\t%s\t%d/%d\t%s/%s\t%s\t%s\t%s\n", r.name,
			m.CPU.Cores, strconv.FormatFloat(m.CPU.LimitCores, 'f', -1, 64), percent(m.CPU.PercentOfLimit, m.CPU.LimitCores > 0),
			bytesIEC(m.Memory.Used), bytesIEC(m.Memory.Limit), percent(100*float64(m.Memory.Used)/float64(max(m.Memory.Limit, 1)), m.Memory.Limit > 0),
			m.Pids.Used, m.Pids.Limit, bytesIEC(m.Disk.UsedBytes), bytesIEC(diskLimit), pathCol, net, state)
	}
	return tw.Flush()
}

// topError is the short reason shown in the STATE column.
func topError(err error) string {
	var ae *sandboxclient.APIError
	if errors.As(err, &ae) {
		if ae.Details != nil {
			for _, c := range ae.Details.Causes {
				if c.Type != "" {
					return string(c.Type)
				}
			}
		}
		if ae.Reason != "" {
			return string(ae.Reason)
		}
	}
	return "Error"
}

func percent(p float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", p)
}

// bytesIEC renders n in binary units, as kubectl top does (Mi, Gi).
func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10)
	}
	f, suffix := float64(n), ""
	for _, s := range []string{"Ki", "Mi", "Gi", "Ti"} {
		if f < unit {
			break
		}
		f /= unit
		suffix = s
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + suffix
}
