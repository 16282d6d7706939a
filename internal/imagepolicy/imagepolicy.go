/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package imagepolicy decides which registries a sandbox's image may come
// from. The Docker Engine pulls from the node's own network, whatever the
// sandbox's network mode, so an image reference that names a registry on
// the node's loopback or private network would let a tenant probe that
// network through pulls. The operator's manager and the MCP server's Docker
// backend share this policy.
//
// The default policy allows every public registry host (and images without
// a registry host, which are Docker Hub's) and refuses:
//
//   - "localhost", "*.localhost" and the special-use suffixes .local,
//     .internal and .home.arpa;
//   - single-label host names ("registry:5000", "etcd"), which only resolve
//     through the node's hosts file or search domains;
//   - IP literals in the loopback, link-local, private (RFC 1918), shared
//     (100.64.0.0/10), unique local (fc00::/7), unspecified, multicast,
//     reserved and NAT64 ranges, and host names that are IP literals in a
//     non-canonical form ("127.1", "2130706433", "0x7f000001"), which C
//     resolvers accept.
//
// An operator lists exceptions (hosts, host:port pairs or CIDRs) with
// Allowed, and may turn off the public default with AllowPublic=false,
// which makes the list a strict allow-list.
//
// Host names are not resolved: a public-looking name whose DNS record points
// at a private address is allowed. Resolving at admission would be racy (the
// daemon resolves again when it pulls, and DNS may answer differently), so
// this is a documented limitation; block such pulls on the node's network
// (an egress firewall for dockerd) or use a strict allow-list.
package imagepolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// ErrNotAllowed is wrapped by every refusal of Check.
var ErrNotAllowed = errors.New("image registry not allowed")

// DockerHub is the registry host of references without one.
const DockerHub = "docker.io"

// Policy is an image registry policy. The zero value is not usable; use
// Default or New.
type Policy struct {
	allowPublic bool
	// hosts are exact "host" (any port) entries, lower case.
	hosts map[string]bool
	// hostPorts are exact "host:port" entries, lower case, IPv6 hosts in
	// brackets.
	hostPorts map[string]bool
	prefixes  []netip.Prefix
	entries   []string
}

// Default allows every public registry and nothing else.
func Default() *Policy {
	p, _ := New(nil, true)
	return p
}

// New parses an allow-list. Each entry is a host name ("registry.corp"),
// which matches on any port; a host and port ("127.0.0.1:5000",
// "[::1]:5000", "localhost:5000"), which matches exactly; or a CIDR
// ("10.0.0.0/8"), which matches IP-literal hosts in it on any port. With
// allowPublic, every public registry host is allowed too; without it only
// the listed ones are (then list "docker.io" to keep Docker Hub, and with
// it images written without a registry host).
func New(allowed []string, allowPublic bool) (*Policy, error) {
	p := &Policy{allowPublic: allowPublic, hosts: map[string]bool{}, hostPorts: map[string]bool{}}
	for _, raw := range allowed {
		e := strings.ToLower(strings.TrimSpace(raw))
		if e == "" {
			continue
		}
		p.entries = append(p.entries, e)
		if strings.Contains(e, "/") {
			prefix, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("allowed registry %q: not a CIDR: %v", raw, err)
			}
			p.prefixes = append(p.prefixes, prefix.Masked())
			continue
		}
		if addr, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil {
			// A bare IP (IPv6 with or without brackets): any port.
			p.prefixes = append(p.prefixes, netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()))
			continue
		}
		host, port, hasPort := splitHostPort(e)
		if !validHost(host) || (hasPort && !validPort(port)) {
			return nil, fmt.Errorf("allowed registry %q: want a host, host:port or CIDR", raw)
		}
		if addr, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
			host = formatHost(addr.Unmap())
		}
		if hasPort {
			p.hostPorts[host+":"+port] = true
		} else {
			p.hosts[host] = true
		}
	}
	return p, nil
}

// String describes the policy for logs.
func (p *Policy) String() string {
	mode := "public registries"
	if !p.allowPublic {
		mode = "listed registries only"
	}
	if len(p.entries) == 0 {
		return mode
	}
	return mode + " + " + strings.Join(p.entries, ",")
}

// Registry returns the registry host (with port, if any) an image reference
// pulls from: DockerHub for references without a host, and "" for image IDs
// (sha256:… or 64 hex digits), which are never pulled from anywhere.
func Registry(ref string) (string, error) {
	parsed, err := reference.ParseAnyReference(strings.TrimSpace(ref))
	if err != nil {
		return "", fmt.Errorf("image reference %q is invalid: %v", ref, err)
	}
	named, ok := parsed.(reference.Named)
	if !ok {
		return "", nil
	}
	return strings.ToLower(reference.Domain(named)), nil
}

// Check reports whether ref may be used. A refusal wraps ErrNotAllowed and
// says why; it never involves a network request.
func (p *Policy) Check(ref string) error {
	if p == nil {
		p = Default()
	}
	registry, err := Registry(ref)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotAllowed, err)
	}
	if registry == "" {
		return nil // an image ID: local only
	}
	if reason := p.refuse(registry); reason != "" {
		return fmt.Errorf("%w: registry %s of image %s is refused (%s); an operator can allow it with the allowed-registries setting", ErrNotAllowed, registry, ref, reason)
	}
	return nil
}

// refuse returns why registry is refused, or "".
func (p *Policy) refuse(registry string) string {
	host, port, hasPort := splitHostPort(registry)
	addr, ipErr := netip.ParseAddr(strings.Trim(host, "[]"))
	if ipErr == nil {
		addr = addr.Unmap()
		host = formatHost(addr)
	}
	// The operator's list first: it may allow anything.
	if p.hosts[host] || (hasPort && p.hostPorts[host+":"+port]) {
		return ""
	}
	if ipErr == nil {
		for _, prefix := range p.prefixes {
			if prefix.Contains(addr) {
				return ""
			}
		}
	}
	if registry == DockerHub && p.allowPublic {
		return ""
	}
	if !p.allowPublic {
		return "not in the list of allowed registries"
	}
	if ipErr == nil {
		if why := internalAddr(addr); why != "" {
			return why
		}
		return ""
	}
	switch {
	case host == "localhost" || strings.HasSuffix(host, ".localhost"):
		return "localhost"
	case numericHost(host):
		return "an IP address in a non-canonical form"
	case !strings.Contains(host, "."):
		return "a single-label host name, which resolves on the node's network only"
	}
	for _, suffix := range []string{".local", ".internal", ".home.arpa"} {
		if strings.HasSuffix(host, suffix) {
			return "a special-use domain (" + suffix + ") of the node's network"
		}
	}
	return ""
}

// Special ranges that netip has no predicate for.
var (
	sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")
	thisNetwork        = netip.MustParsePrefix("0.0.0.0/8")
	ietfProtocol       = netip.MustParsePrefix("192.0.0.0/24")
	benchmarking       = netip.MustParsePrefix("198.18.0.0/15")
	reserved           = netip.MustParsePrefix("240.0.0.0/4")
	nat64              = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local         = netip.MustParsePrefix("64:ff9b:1::/48")
	ipv4Compatible     = netip.MustParsePrefix("::/96")
)

// internalAddr says why an address is not a public one, or "".
func internalAddr(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "a link-local address"
	case a.IsPrivate():
		return "a private address"
	case a.IsUnspecified():
		return "an unspecified address"
	case a.IsMulticast():
		return "a multicast address"
	case sharedAddressSpace.Contains(a):
		return "a shared (carrier-grade NAT) address"
	case thisNetwork.Contains(a), ietfProtocol.Contains(a), benchmarking.Contains(a), reserved.Contains(a), ipv4Compatible.Contains(a):
		return "a reserved address"
	case nat64.Contains(a), nat64Local.Contains(a):
		return "a NAT64 address, which may map to any IPv4 address"
	}
	return ""
}

// splitHostPort splits "host", "host:port", "[v6]" or "[v6]:port". IPv6
// hosts keep their brackets.
func splitHostPort(s string) (host, port string, hasPort bool) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return s, "", false
		}
		host, rest := s[:end+1], s[end+1:]
		if p, ok := strings.CutPrefix(rest, ":"); ok {
			return host, p, true
		}
		return host, "", false
	}
	if i := strings.LastIndex(s, ":"); i >= 0 && !strings.Contains(s[:i], ":") {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

// formatHost writes an address as a registry host: IPv6 in brackets.
func formatHost(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

var (
	hostLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	portRE    = regexp.MustCompile(`^[0-9]{1,5}$`)
	hexLabel  = regexp.MustCompile(`^0x[0-9a-f]*$`)
	decLabel  = regexp.MustCompile(`^[0-9]+$`)
)

func validHost(h string) bool {
	if strings.HasPrefix(h, "[") {
		_, err := netip.ParseAddr(strings.Trim(h, "[]"))
		return err == nil
	}
	for _, label := range strings.Split(h, ".") {
		if !hostLabel.MatchString(label) {
			return false
		}
	}
	return h != ""
}

func validPort(p string) bool { return portRE.MatchString(p) }

// numericHost reports whether a host that is not a canonical IP literal
// still looks like one to a C resolver (inet_aton accepts "127.1",
// "2130706433" and "0x7f.0.0.1"). No public top-level domain is numeric,
// so a numeric last label is enough.
func numericHost(h string) bool {
	labels := strings.Split(h, ".")
	last := labels[len(labels)-1]
	return decLabel.MatchString(last) || hexLabel.MatchString(last)
}
