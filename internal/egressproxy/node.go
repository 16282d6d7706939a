/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"

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

// firewallTimeout bounds one firewall update (an iptables-restore).
const firewallTimeout = 30 * time.Second

// SetPolicy applies pol to the sandbox at src: the proxy has it at once,
// the firewall redirects src within one iptables-restore. An error from
// the firewall is returned (the caller fails closed); the firewall's own
// loop keeps retrying the new set of addresses.
func (n *Node) SetPolicy(src netip.Addr, pol Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.proxy.SetPolicy(src, pol); err != nil {
		return err
	}
	return n.sync()
}

// RemovePolicy stops proxying src: its open connections are closed and it
// becomes an ordinary Egress address. Call it when the sandbox's container
// is gone. A firewall that cannot be updated keeps redirecting src to the
// proxy, which then refuses everything from it (fail closed); the
// firewall's loop retries.
func (n *Node) RemovePolicy(src netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.proxy.RemovePolicy(src)
	_ = n.sync()
}

// Recent is Proxy.Recent.
func (n *Node) Recent(sandbox string) []Event { return n.proxy.Recent(sandbox) }

func (n *Node) sync() error {
	if n.fw == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), firewallTimeout)
	defer cancel()
	// Only the egress network's addresses: the policy network's are
	// redirected by their bridge from the first packet (egress.
	// PolicyNetworkName), whether or not the proxy has their policy yet.
	subnet := n.fw.ProxiedSubnet()
	proxied := n.proxy.Policies()
	maps.DeleteFunc(proxied, func(a netip.Addr, _ []uint16) bool { return !subnet.Contains(a) })
	if _, err := n.fw.SetProxied(ctx, proxied); err != nil {
		return fmt.Errorf("egress firewall: %w", err)
	}
	return nil
}
