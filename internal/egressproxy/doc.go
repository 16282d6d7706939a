/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package egressproxy is the node's egress proxy and resolver: what an
// Egress sandbox with a policy may reach, by name, with credentials added
// outside the sandbox.
//
// The contract with the API side (the manager's converter from
// spec.network.egress and its Secrets) is Policy, Rule, Injection, Validate,
// Matcher and Event; the proxy is New(Config), Run, SetPolicy and
// RemovePolicy, keyed by the sandbox's source address on the egress bridge.
//
// Identity. A sandbox is the source address of its connections on the
// egress bridge. A sandbox cannot forge it: it has no CAP_NET_RAW or
// CAP_NET_ADMIN (no raw sockets, no changing its address), the bridge has
// inter-container communication off, and the firewall (internal/egress)
// drops packets from the bridge whose source is not in the network's
// subnet. Docker's bridge does not check source addresses itself.
//
// Libraries. DNS is github.com/miekg/dns (the resolver answers the
// sandbox's queries and forwards allowed ones upstream). HTTP and TLS are
// the standard library: crypto/tls reads the ClientHello (through
// GetConfigForClient on a connection that records what it reads, then the
// bytes are replayed to the upstream untouched), net/http reads and writes
// requests, and httputil.ReverseProxy forwards terminated requests. We did
// not take elazarl/goproxy: it is an explicit (CONNECT) proxy, while ours
// is transparent and must decide on SNI before any byte goes upstream, and
// its MITM path generates certificates with its own CA handling; the
// standard library pieces are smaller and already audited with the Go
// toolchain.
//
// Decisions. TLS: the ClientHello's server name must be allowed; the
// connection goes to an address the proxy resolved itself (never the
// original destination), and that address must not be blocked (private,
// link-local with the metadata address, loopback, the node's addresses:
// the same ranges as internal/egress), which also defeats DNS rebinding.
// HTTP: the same with the Host header. Refused: no SNI, an IP address as
// SNI or Host, unlisted names, a wildcard that does not match, a Host that
// differs from the SNI on a terminated connection. The resolver answers A
// queries for allowed names only (NXDOMAIN otherwise, an empty answer for
// AAAA: IPv6 is not routed), and the firewall sends every DNS packet of a
// policy sandbox to it, whatever server the sandbox addressed.
//
// Injection. A Rule with Inject is terminated: the proxy presents a leaf
// certificate for the name, minted from the node's CA (cached, bounded),
// removes any header of the injected name the sandbox sent, adds the
// secret when the method and path match, and forwards over TLS verified
// against the system roots (or Config.UpstreamRoots). Other hosts pass
// through untouched: the proxy never sees their plaintext.
package egressproxy
