/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"context"
	"crypto/x509"
	"net"
	"net/netip"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// Config configures a Proxy.
type Config struct {
	// Listen is the TCP address of the transparent proxy (the firewall
	// redirects a policy sandbox's allowed ports here), e.g.
	// "172.30.0.1:15001". Required.
	Listen string
	// DNSListen is the UDP and TCP address of the resolver (the firewall
	// redirects a policy sandbox's port 53 here). Required.
	DNSListen string
	// CA mints the leaf certificates of hosts with an Injection (see
	// LoadOrCreateCA). Nil: connections to injected hosts are refused
	// (ReasonUpstream); other hosts work.
	CA *operatorca.CA
	// Upstream is the resolver the proxy asks ("host:port", UDP). Required.
	Upstream string
	// UpstreamRoots verifies the upstream servers of terminated (injected)
	// connections; nil means the system roots. Tests set it.
	UpstreamRoots *x509.CertPool
	// Blocked reports an address no sandbox may reach through the proxy;
	// nil means egress.BlockedIPv4, the node's addresses and every IPv6
	// address. Tests of a fake internet on private addresses set it.
	Blocked func(netip.Addr) bool
	// OriginalPort returns the port the sandbox connected to before the
	// firewall redirected it; nil reads SO_ORIGINAL_DST. The address is
	// never used, only the port.
	OriginalPort func(net.Conn) (uint16, error)
	// Dial dials the upstream address the proxy resolved; nil is a
	// net.Dialer with a 10 s timeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Audit receives every injection and refusal. It is called from a
	// single goroutine; a slow sink loses events (counted in Dropped), it
	// never blocks a connection.
	Audit func(Event)
	// AuditRate and AuditBurst limit Audit calls per second (events over
	// the rate are still kept in Recent, and counted in Dropped). Zero:
	// 20/s, burst 50.
	AuditRate  float64
	AuditBurst int
	// RecentPerSandbox is how many events Recent keeps per sandbox;
	// zero: 256.
	RecentPerSandbox int
	// Now is the clock of events; nil is time.Now.
	Now func() time.Time
}
