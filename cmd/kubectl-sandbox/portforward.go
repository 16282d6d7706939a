/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

const portForwardExample = `  # Reach port 8000 in the Sandbox "web" at localhost:8000
  kubectl sandbox port-forward web 8000

  # ... at localhost:9090
  kubectl sandbox port-forward web 9090:8000

  # ... at a port the system picks (printed)
  kubectl sandbox port-forward web :8000`

func newPortForwardCommand(o *options) *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward NAME [LOCAL:]REMOTE [--address 127.0.0.1]",
		Short: "Forward a local port to a port inside a Sandbox",
		Long: `Listen on a local port and forward every connection to REMOTE on the
Sandbox's loopback (127.0.0.1:REMOTE inside it), as kubectl port-forward does
for Pods. It needs no network in the Sandbox: the connection is made inside
it, through the sandboxes/portforward subresource (create on
sandboxes/portforward in RBAC; audited by the API server). Each local
connection is one request. Runs until interrupted.`,
		Example: portForwardExample,
		Args:    exactArgs(2, "port-forward needs a sandbox name and [LOCAL:]REMOTE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := parseSandboxName(args[0])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			local, remote, err := parsePortPair(args[1])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
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
			ln, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(local)))
			if err != nil {
				return fmt.Errorf("listening on %s: %w", net.JoinHostPort(address, strconv.Itoa(local)), err)
			}
			return forwardPort(cmd.Context(), o, c, sandboxclient.Named(ns, name), ln, remote)
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "Local address to listen on (use 0.0.0.0 only if others may reach the Sandbox's port)")
	return cmd
}

// parsePortPair reads [LOCAL:]REMOTE; LOCAL defaults to REMOTE, and an
// empty LOCAL (":REMOTE") is a port the system picks.
func parsePortPair(arg string) (local, remote int, err error) {
	l, r, hasLocal := strings.Cut(arg, ":")
	if !hasLocal {
		r = l
	}
	if remote, err = strconv.Atoi(r); err != nil || remote < 1 || remote > 65535 {
		return 0, 0, fmt.Errorf("remote port %q: want a number from 1 to 65535", r)
	}
	if l == "" {
		return 0, remote, nil
	}
	if local, err = strconv.Atoi(l); err != nil || local < 1 || local > 65535 {
		return 0, 0, fmt.Errorf("local port %q: want a number from 1 to 65535 (or nothing, for one the system picks)", l)
	}
	return local, remote, nil
}

// forwardPort serves ln until ctx ends: each connection gets its own
// portforward request.
func forwardPort(ctx context.Context, o *options, c *sandboxclient.Client, ref sandboxclient.Ref, ln net.Listener, remote int) error {
	fmt.Fprintf(o.out, "Forwarding from %s -> %d\n", ln.Addr(), remote)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accepting a local connection: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			remoteConn, err := c.PortForward(ctx, ref, remote)
			if err != nil {
				fmt.Fprintf(o.errOut, "error: forwarding a connection to port %d: %v\n", remote, err)
				return
			}
			defer remoteConn.Close()
			sent, received := make(chan struct{}), make(chan struct{})
			go func() { _, _ = io.Copy(remoteConn, conn); close(sent) }()
			go func() { _, _ = io.Copy(conn, remoteConn); close(received) }()
			// The Sandbox's end closing ends the connection. The upgraded
			// stream has no half-close of its own, so when the local end
			// stops sending first, its answer still has a while to come.
			select {
			case <-received:
			case <-ctx.Done():
			case <-sent:
				select {
				case <-received:
				case <-ctx.Done():
				case <-time.After(30 * time.Second):
				}
			}
		}()
	}
}
