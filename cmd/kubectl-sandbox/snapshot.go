/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// maxForkCount is the most Sandboxes one fork makes (the MCP tool's bound).
const maxForkCount = 16

const snapshotExample = `  # Snapshot the files of Sandbox analysis; prints the SandboxSnapshot's name
  kubectl sandbox snapshot analysis

  # With a name of your choice
  kubectl sandbox snapshot analysis --name before-upgrade`

const forkExample = `  # Snapshot analysis and start 4 Sandboxes from it; prints their names
  kubectl sandbox fork analysis --count 4

  # Start 2 more from an existing snapshot
  kubectl sandbox fork analysis --count 2 --snapshot before-upgrade`

// apiClient is a client for the Sandbox API objects, with the user's
// credentials.
func (o *options) apiClient() (client.Client, error) {
	cfg, err := o.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

func checkObjectName(what, s string) error {
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		return fmt.Errorf("invalid %s name %q: %s", what, s, strings.Join(errs, "; "))
	}
	return nil
}

func newSnapshotCommand(o *options) *cobra.Command {
	var name string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "snapshot NAME [--name SNAPSHOT]",
		Short: "Snapshot the files of a Sandbox (a SandboxSnapshot)",
		Long: `Create a SandboxSnapshot of a Sandbox and wait until its node has stored
it: the working directory, /tmp and /var/tmp, read while the Sandbox's
processes are stopped. Processes and memory are not part of it. Prints the
SandboxSnapshot's name; 'kubectl get sandboxsnapshots' lists them, and
deleting one removes its files. Restore with spec.snapshotRef or
'kubectl sandbox fork'.`,
		Example: snapshotExample,
		Args:    exactArgs(1, "snapshot takes one sandbox name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseSandboxName(args[0])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			if name != "" {
				if err := checkObjectName("snapshot", name); err != nil {
					return &usageError{cmd: cmd.CommandPath(), err: err}
				}
			}
			ns, err := o.namespace("")
			if err != nil {
				return err
			}
			c, err := o.apiClient()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			snap, err := takeSnapshot(ctx, c, ns, src, name)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(o.out, snap.Name)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "Name of the SandboxSnapshot (default: NAME-snap-XXXXX)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "How long to wait for the snapshot to be stored")
	return cmd
}

func newForkCommand(o *options) *cobra.Command {
	var count int
	var from string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "fork NAME --count N [--snapshot SNAPSHOT]",
		Short: "Start N Sandboxes with the files of a Sandbox",
		Long: `Snapshot a Sandbox (or use --snapshot) and create N Sandboxes from it
(spec.snapshotRef), each with the source's shape and environment, on the
node that holds the snapshot. Waits until all are Ready and prints their
names. The children are fresh: they get the files, not the processes or
memory. Each counts against the namespace's SandboxQuotas like any Sandbox.`,
		Example: forkExample,
		Args:    exactArgs(1, "fork takes one sandbox name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseSandboxName(args[0])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			if count < 1 || count > maxForkCount {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--count must be between 1 and %d, not %d", maxForkCount, count)}
			}
			if from != "" {
				if err := checkObjectName("snapshot", from); err != nil {
					return &usageError{cmd: cmd.CommandPath(), err: err}
				}
			}
			ns, err := o.namespace("")
			if err != nil {
				return err
			}
			c, err := o.apiClient()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			names, err := fork(ctx, c, ns, src, from, count)
			for _, n := range names {
				fmt.Fprintln(o.out, n)
			}
			return err
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, fmt.Sprintf("How many Sandboxes to start (1–%d)", maxForkCount))
	cmd.Flags().StringVar(&from, "snapshot", "", "Start from this SandboxSnapshot instead of taking a new one")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "How long to wait for the snapshot and the Sandboxes")
	return cmd
}

// takeSnapshot creates a SandboxSnapshot of Sandbox src and waits until it is
// stored, or fails with its reason.
func takeSnapshot(ctx context.Context, c client.Client, ns, src, name string) (*sandboxv1alpha1.SandboxSnapshot, error) {
	snap := &sandboxv1alpha1.SandboxSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: src}},
	}
	if name == "" {
		snap.GenerateName = truncateName(src, 47) + "-snap-"
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: src}, &sandboxv1alpha1.Sandbox{}); err != nil {
		return nil, fmt.Errorf("reading Sandbox %s/%s: %w", ns, src, err)
	}
	if err := c.Create(ctx, snap); err != nil {
		return nil, fmt.Errorf("creating a SandboxSnapshot of %s/%s: %w", ns, src, err)
	}
	return waitSnapshot(ctx, c, ns, snap.Name)
}

// waitSnapshot waits until SandboxSnapshot ns/name is stored, or failed for
// good.
func waitSnapshot(ctx context.Context, c client.Client, ns, name string) (*sandboxv1alpha1.SandboxSnapshot, error) {
	for {
		snap := &sandboxv1alpha1.SandboxSnapshot{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, snap); err != nil {
			return nil, fmt.Errorf("reading SandboxSnapshot %s/%s: %w", ns, name, err)
		}
		cond := meta.FindStatusCondition(snap.Status.Conditions, string(sandboxv1alpha1.SnapshotConditionReady))
		if cond != nil {
			switch cond.Reason {
			case sandboxv1alpha1.SnapshotReasonStored:
				return snap, nil
			case sandboxv1alpha1.SnapshotReasonTooLarge, sandboxv1alpha1.SnapshotReasonSourceGone, sandboxv1alpha1.SnapshotReasonQuotaExceeded:
				return nil, fmt.Errorf("SandboxSnapshot %s/%s failed (%s): %s", ns, name, cond.Reason, cond.Message)
			}
		}
		select {
		case <-ctx.Done():
			why := "no node has taken it yet (is the Sandbox bound to a node and Ready?)"
			if cond != nil {
				why = cond.Reason + ": " + cond.Message
			}
			return nil, fmt.Errorf("SandboxSnapshot %s/%s is not stored: %s", ns, name, why)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// fork starts count Sandboxes from a snapshot of src (a new one unless from
// names one) and waits until they are Ready; it returns the names it made.
func fork(ctx context.Context, c client.Client, ns, src, from string, count int) ([]string, error) {
	source := &sandboxv1alpha1.Sandbox{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: src}, source); err != nil {
		return nil, fmt.Errorf("reading Sandbox %s/%s: %w", ns, src, err)
	}
	var snap *sandboxv1alpha1.SandboxSnapshot
	var err error
	if from == "" {
		snap, err = takeSnapshot(ctx, c, ns, src, "")
	} else {
		snap, err = waitSnapshot(ctx, c, ns, from)
	}
	if err != nil {
		return nil, err
	}
	tpl := snap.Status.Source
	if tpl == nil {
		return nil, fmt.Errorf("SandboxSnapshot %s/%s records no source shape", ns, snap.Name)
	}
	var names []string
	for range count {
		child := &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: truncateName(src, 47) + "-fork-"},
			Spec: sandboxv1alpha1.SandboxSpec{
				SnapshotRef: &sandboxv1alpha1.SandboxSnapshotReference{Name: snap.Name},
				Image:       tpl.Image, Command: tpl.Command, WorkingDir: tpl.WorkingDir, User: tpl.User,
				Resources: tpl.Resources, Network: tpl.Network, Runtime: tpl.Runtime,
				Env: source.Spec.Env, Lifecycle: source.Spec.Lifecycle, ActiveDeadlineSeconds: source.Spec.ActiveDeadlineSeconds,
			},
		}
		if err := c.Create(ctx, child); err != nil {
			return names, fmt.Errorf("creating a Sandbox from SandboxSnapshot %s/%s: %w", ns, snap.Name, err)
		}
		names = append(names, child.Name)
	}
	for _, n := range names {
		if err := waitSandboxReady(ctx, c, ns, n); err != nil {
			return names, err
		}
	}
	return names, nil
}

// waitSandboxReady waits until Sandbox ns/name is Ready.
func waitSandboxReady(ctx context.Context, c client.Client, ns, name string) error {
	for {
		sbx := &sandboxv1alpha1.Sandbox{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sbx); err != nil {
			return fmt.Errorf("reading Sandbox %s/%s: %w", ns, name, err)
		}
		cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if cond != nil && cond.Status == metav1.ConditionTrue {
			return nil
		}
		select {
		case <-ctx.Done():
			why := "no node has claimed it yet"
			if cond != nil {
				why = cond.Reason + ": " + cond.Message
			}
			return fmt.Errorf("sandbox %s/%s is not Ready: %s", ns, name, why)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// truncateName keeps a generated name's prefix within the name length
// limits (the API server adds five characters).
func truncateName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimRight(s[:n], "-.")
}
