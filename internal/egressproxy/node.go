/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
)

// Node is the proxy together with the node's egress firewall: a policy set
// here is enforced by both (the proxy decides, the firewall redirects the
// sandbox's DNS and allowed ports to it and drops the rest). The manager
// (and the MCP server's Docker backend) use this, not the Proxy alone.
//
// Order matters. SetPolicy gives the proxy the policy before the firewall
// redirects the sandbox; RemovePolicy takes the redirection away first. A
// sandbox's address must be given its policy before it runs anything (the
// helper is its first process) and removed only after the container is
// gone: Docker reuses addresses, and a policy left behind would apply to
// the next sandbox that gets the address.
type Node struct {
	proxy *Proxy
	fw    *egress.Firewall
	mu    sync.Mutex
}

// NewNode ties p to fw. fw may be nil where the firewall is managed
// elsewhere (tests of the proxy alone).
func NewNode(p *Proxy, fw *egress.Firewall) *Node { return &Node{proxy: p, fw: fw} }

// Proxy is the node's proxy (Recent, Dropped).
func (n *Node) Proxy() *Proxy { return n.proxy }

// CAPEM is the certificate sandboxes with a policy must trust
// (dockerruntime.InstallEgressCA); nil without a CA.
func (n *Node) CAPEM() []byte {
	if n.proxy.cfg.CA == nil {
		return nil
	}
	return n.proxy.cfg.CA.CertPEM()
}

// SetPolicy applies pol to the sandbox at src, within the time of one
// iptables-restore.
func (n *Node) SetPolicy(ctx context.Context, src netip.Addr, pol Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.proxy.SetPolicy(src, pol); err != nil {
		return err
	}
	return n.sync(ctx)
}

// RemovePolicy stops proxying src: its open connections are closed, and
// it becomes an ordinary Egress address (call it when the sandbox is
// gone, or when its policy is removed on purpose).
func (n *Node) RemovePolicy(ctx context.Context, src netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.proxy.mu.RLock()
	_, had := n.proxy.sources[src.Unmap()]
	n.proxy.mu.RUnlock()
	if !had {
		return nil
	}
	policies := n.proxy.Policies()
	delete(policies, src.Unmap())
	if n.fw != nil {
		if _, err := n.fw.SetProxied(ctx, policies); err != nil {
			return fmt.Errorf("egress firewall: %w", err)
		}
	}
	n.proxy.RemovePolicy(src)
	return nil
}

// Recent is Proxy.Recent.
func (n *Node) Recent(sandbox string) []Event { return n.proxy.Recent(sandbox) }

func (n *Node) sync(ctx context.Context) error {
	if n.fw == nil {
		return nil
	}
	if _, err := n.fw.SetProxied(ctx, n.proxy.Policies()); err != nil {
		return fmt.Errorf("egress firewall: %w", err)
	}
	return nil
}
