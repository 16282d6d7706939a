/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command kubectl-sandbox runs commands in, copies files into and out of,
// and reads the logs of Sandboxes through their node's API. Installed on the
// PATH it is also the kubectl plugin `kubectl sandbox`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
)

// Exit codes besides a remote command's own.
const (
	exitError = 1
	// exitTimeout is what exec exits with when the command hit --timeout,
	// as GNU timeout(1) does.
	exitTimeout = 124
	// exitInterrupted: the user pressed Ctrl-C (128 + SIGINT).
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitCodeError ends the program with a code and no message of its own (the
// remote command already spoke, or a note was printed).
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// usageError is a mistake on the command line; kubectl answers those with a
// pointer to the help.
type usageError struct {
	cmd string
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// run executes one command line and returns the process's exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCommand(&streams{in: stdin, out: stdout, errOut: stderr})
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ec *exitCodeError
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return ec.code
	case ctx.Err() != nil:
		return exitInterrupted
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "error: %v\nSee '%s -h' for help and examples\n", ue.err, ue.cmd)
		return exitError
	default:
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitError
	}
}

type streams struct {
	in          io.Reader
	out, errOut io.Writer
}

func (s *streams) warn(msg string) { fmt.Fprintf(s.errOut, "warning: %s\n", msg) }

// options are shared by every subcommand: kubeconfig handling exactly as
// kubectl's (--kubeconfig, --context, -n, --as, --token …).
type options struct {
	*streams
	loadingRules *clientcmd.ClientConfigLoadingRules
	overrides    *clientcmd.ConfigOverrides
}

func (o *options) clientConfig() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(o.loadingRules, o.overrides)
}

// namespace resolves an explicit namespace or the current one.
func (o *options) namespace(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	ns, _, err := o.clientConfig().Namespace()
	if err != nil {
		return "", fmt.Errorf("reading the current namespace from the kubeconfig: %w", err)
	}
	return ns, nil
}

// client builds a sandboxclient with the user's credentials.
func (o *options) client() (*sandboxclient.Client, error) {
	cfg, err := o.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-sandbox/" + version.Version + " " + rest.DefaultKubernetesUserAgent()
	return sandboxclient.New(cfg, sandboxclient.Options{})
}

func newRootCommand(s *streams) *cobra.Command {
	o := &options{
		streams:      s,
		loadingRules: clientcmd.NewDefaultClientConfigLoadingRules(),
		overrides:    &clientcmd.ConfigOverrides{},
	}
	root := &cobra.Command{
		Use:   "kubectl-sandbox",
		Short: "Run commands in, copy files to and from, and read the logs of Sandboxes",
		Long: `kubectl sandbox runs commands in, copies files to and from, and reads the
logs of Sandboxes through the API server, as kubectl exec does for Pods:
it calls the sandboxes/exec, /files, /log and /history subresources of
subresources.sandbox.code-sandbox.dev with your kubeconfig's credentials
(tokens, client certificates, exec plugins, kubectl proxy), which never
leave the API server. RBAC on those subresources decides what you may do,
and the API server's audit log records every call.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl sandbox"},
		SilenceUsage:  true,
		SilenceErrors: true,
		// Without this cobra treats "kubectl sandbox" as needing a
		// subcommand and prints help with exit code 0.
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("unknown command %q", args[0])}
			}
			return cmd.Help()
		},
	}
	// Completion for plugins comes from a kubectl_complete-sandbox script,
	// not from this command; keep it out of the help.
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.errOut)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{cmd: cmd.CommandPath(), err: err}
	})
	flags := root.PersistentFlags()
	flags.StringVar(&o.loadingRules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use for CLI requests.")
	clientcmd.BindOverrideFlags(o.overrides, flags, clientcmd.RecommendedConfigOverrideFlags(""))

	root.AddCommand(newExecCommand(o), newPsCommand(o), newAttachCommand(o), newKillCommand(o), newCpCommand(o), newLogsCommand(o), newPortForwardCommand(o), newTopCommand(o), newSnapshotCommand(o), newForkCommand(o), newVersionCommand(o))
	return root
}

func newVersionCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(o.out, "kubectl-sandbox %s\n", version.Version)
			return nil
		},
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("unexpected arguments %q", args)}
	}
	return nil
}

func minArgs(n int, msg string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return &usageError{cmd: cmd.CommandPath(), err: errors.New(msg)}
		}
		return nil
	}
}

func exactArgs(n int, msg string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("%s (got %d arguments)", msg, len(args))}
		}
		return nil
	}
}
