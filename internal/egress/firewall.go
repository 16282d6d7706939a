/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Chains this package owns, in the filter table of iptables (and ip6tables).
const (
	// ForwardChain holds the rules for traffic the node routes for the
	// egress bridge. IPv4: DOCKER-USER jumps to it; IPv6: FORWARD does.
	ForwardChain = "CSBX-EGRESS"
	// InputChain holds the rules for traffic from the egress bridge to the
	// node itself; INPUT jumps to it.
	InputChain = "CSBX-EGRESS-INPUT"
	// ManagerMarkerChain is an empty IPv4 chain whose existence says that
	// a node manager owns the rules: the MCP server's Docker backend then
	// leaves them alone (neither rewrites nor removes them).
	ManagerMarkerChain = "CSBX-EGRESS-MANAGER"

	// ProxyChain, in the nat table, redirects the traffic of sandboxes
	// with an egress policy to the node's egress proxy and resolver
	// (internal/egressproxy); PREROUTING jumps to it.
	ProxyChain = "CSBX-EGRESS-PROXY"
	// ProxyForwardChain and ProxyInputChain (filter table, IPv4) hold the
	// proxy's drops and accepts; ForwardChain and InputChain jump to them
	// first, on every node, proxy or not.
	ProxyForwardChain = "CSBX-EGRESS-PROXIED"
	ProxyInputChain   = "CSBX-EGRESS-PROXIED-IN"

	// PolicyForwardChain and PolicyInputChain (filter, both families)
	// hold the rules of PolicyBridgeName, the bridge of the sandboxes with
	// an egress policy: nothing is routed, and the node accepts only what
	// PolicyProxyChain (nat, the proxy's manager only) redirected to the
	// proxy and resolver. They match the bridge, not addresses, so they
	// hold from a container's first packet, and every manager writes the
	// same (they do not depend on the proxy); without a proxy the bridge
	// reaches nothing at all.
	PolicyForwardChain = "CSBX-EGRESS-POLICY"
	PolicyInputChain   = "CSBX-EGRESS-POLICY-IN"
	PolicyProxyChain   = "CSBX-EGRESS-POLICY-PROXY"

	dockerUserChain = "DOCKER-USER"
)

// multiportMax is how many ports one multiport match may list.
const multiportMax = 15

// ProxyOptions locate the node's egress proxy. With them, a sandbox whose
// address is proxied (SetProxied) has its DNS (UDP and TCP 53, to any
// server) redirected to the resolver, its TCP to the policy's ports
// redirected to the proxy, and everything else it sends dropped; and the
// bridge drops packets whose source is outside the network's subnet.
type ProxyOptions struct {
	// Gateway is the egress bridge's address (REDIRECT delivers there).
	Gateway netip.Addr
	// Subnet is the egress network's IPv4 subnet.
	Subnet netip.Prefix
	// Port is the proxy's TCP port, DNSPort the resolver's (UDP and TCP).
	Port, DNSPort uint16
}

// DefaultCheckInterval is how often Run re-checks the rules.
const DefaultCheckInterval = 10 * time.Second

// BlockedIPv4 are the destinations egress sandboxes may not reach (unless an
// allow-list entry reopens one): "this network", private (RFC 1918), shared
// (CGNAT, RFC 6598), loopback, link-local (cloud metadata at
// 169.254.169.254), IETF protocol assignments, benchmarking, multicast and
// reserved/broadcast. The node's own addresses are added at run time.
var BlockedIPv4 = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Options configure a Firewall.
type Options struct {
	// AllowCIDRs reopens destinations that BlockedIPv4 or the node's
	// addresses would block, for routed traffic only: the node itself is
	// never reachable from the egress bridge. IPv4 only.
	AllowCIDRs []netip.Prefix
	// DNSServers are the upstream resolvers Docker's embedded DNS server
	// forwards to. The embedded server answers inside each container's
	// network namespace, but Docker 20.10+ sends the forwarded query from
	// that namespace (the sandbox's own address), so it crosses the
	// firewall; these get TCP and UDP port 53 only. Nil means the
	// nameservers of ResolvConf (as Docker picks them).
	DNSServers []netip.Addr
	// ResolvConf is read when DNSServers is nil; default /etc/resolv.conf.
	ResolvConf string
	// Manager marks the rules as owned by a node manager (see
	// ManagerMarkerChain). A Firewall without it (the MCP server's Docker
	// backend) only checks rules a manager owns, and removes its own on
	// Close.
	Manager bool
	// Mode chooses the iptables backend: ModeAuto (also ""), ModeNFT or
	// ModeLegacy; see Backend.
	Mode string
	// IPTables and IP6Tables name the binaries, overriding Mode (IP6Tables
	// defaults to ip6tables then); iptables-restore and ip6tables-restore
	// are found next to them by name.
	IPTables, IP6Tables string
	// HostAddrs lists the node's addresses; nil uses net.InterfaceAddrs.
	HostAddrs func() ([]netip.Addr, error)
}

// Firewall installs and keeps the egress rules.
type Firewall struct {
	opts Options

	mu      sync.Mutex
	checked bool
	lastErr error
	// applied is what each of our chains listed (iptables -S) right after
	// we last wrote it, and desired the rules we wrote then: a chain that
	// lists anything else was changed behind our back and is rewritten.
	applied map[string]string
	desired map[string]string
	// backend, once chosen (resolve).
	backend *Backend
	// proxy and proxied: see SetProxy and SetProxied.
	proxy   *ProxyOptions
	proxied map[netip.Addr][]uint16

	// exec runs a binary (stdin may be empty) and returns its stdout;
	// lookPath finds one in $PATH. Unit tests replace both.
	exec     func(ctx context.Context, stdin, bin string, args ...string) (string, error)
	lookPath func(string) (string, error)
}

// NewFirewall validates opts. It changes nothing yet.
func NewFirewall(opts Options) (*Firewall, error) {
	for _, p := range opts.AllowCIDRs {
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("egress allow CIDR %s: only IPv4 is supported", p)
		}
	}
	mode, err := ParseMode(opts.Mode)
	if err != nil {
		return nil, err
	}
	opts.Mode = mode
	if opts.ResolvConf == "" {
		opts.ResolvConf = "/etc/resolv.conf"
	}
	if opts.HostAddrs == nil {
		opts.HostAddrs = interfaceAddrs
	}
	return &Firewall{opts: opts, applied: map[string]string{}, desired: map[string]string{}, exec: execCommand, lookPath: exec.LookPath}, nil
}

// ParseCIDRs parses a list of CIDRs (or single addresses), as given by
// repeated or comma-separated flags.
func ParseCIDRs(values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return nil, fmt.Errorf("%q is not a CIDR such as 10.1.0.0/16", s)
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if !p.Addr().Is4() {
				return nil, fmt.Errorf("%q: only IPv4 CIDRs are supported", s)
			}
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

// SetProxy sets (or, with nil, unsets) where the egress proxy listens. It
// takes effect at the next Ensure.
func (f *Firewall) SetProxy(p *ProxyOptions) error {
	if p != nil {
		if !p.Gateway.Is4() || !p.Subnet.Addr().Is4() || !p.Subnet.Contains(p.Gateway) || p.Port == 0 || p.DNSPort == 0 {
			return fmt.Errorf("egress proxy options: gateway %s must be an IPv4 address in subnet %s, and both ports set (%d, %d)", p.Gateway, p.Subnet, p.Port, p.DNSPort)
		}
		cp := *p
		cp.Subnet = cp.Subnet.Masked()
		p = &cp
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxy = p
	return nil
}

// SetProxied replaces the set of sandbox addresses whose traffic goes
// through the proxy, each with the TCP ports its policy allows (an empty
// list: DNS only, all else dropped), and applies it at once. Addresses
// outside the proxy's subnet are refused.
func (f *Firewall) SetProxied(ctx context.Context, proxied map[netip.Addr][]uint16) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.proxy == nil && len(proxied) > 0 {
		return nil, errors.New("egress firewall: sandboxes cannot be proxied without SetProxy")
	}
	cp := make(map[netip.Addr][]uint16, len(proxied))
	for a, ports := range proxied {
		if !f.proxy.Subnet.Contains(a) || a == f.proxy.Gateway {
			return nil, fmt.Errorf("egress firewall: %s is not a sandbox address of %s", a, f.proxy.Subnet)
		}
		ports = slices.Clone(ports)
		slices.Sort(ports)
		cp[a] = slices.Compact(slices.DeleteFunc(ports, func(p uint16) bool { return p == 0 || p == 53 }))
	}
	f.proxied = cp
	repaired, err := f.ensure(ctx)
	f.checked, f.lastErr = true, err
	return repaired, err
}

// ProxiedSubnet is the subnet SetProxied takes addresses of (the egress
// network's, from SetProxy); invalid without a proxy. Sandboxes on the
// policy network need no address rules: their bridge's are enough.
func (f *Firewall) ProxiedSubnet() netip.Prefix {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.proxy == nil {
		return netip.Prefix{}
	}
	return f.proxy.Subnet
}

// proxiedAddrs is the proxied addresses, sorted.
func (f *Firewall) proxiedAddrs() []netip.Addr {
	out := make([]netip.Addr, 0, len(f.proxied))
	for a := range f.proxied {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// proxyRules are the rules of ProxyForwardChain and ProxyInputChain.
func (f *Firewall) proxyRules() (forward, input [][]string) {
	if f.proxy == nil {
		return nil, nil
	}
	// Anti-spoofing: a sandbox has no CAP_NET_RAW or CAP_NET_ADMIN, but
	// IP_FREEBIND lets any process send from an address it does not
	// have; from outside the subnet that is dropped here, and inside it a
	// spoofed TCP handshake cannot complete (the answer goes to the
	// address's real owner).
	forward = append(forward, []string{"!", "-s", f.proxy.Subnet.String(), "-j", "DROP"})
	input = append(input, []string{"!", "-s", f.proxy.Subnet.String(), "-j", "DROP"})
	gw := f.proxy.Gateway.String() + "/32"
	for _, a := range f.proxiedAddrs() {
		src := a.String() + "/32"
		// Nothing of a proxied sandbox is routed: what the nat rules
		// redirected goes to the node (INPUT), the rest ends here, before
		// ForwardChain's ESTABLISHED rule, so that connections opened
		// before its policy are cut too.
		forward = append(forward, []string{"-s", src, "-j", "DROP"})
		for _, pp := range []struct {
			proto string
			port  uint16
		}{{"tcp", f.proxy.Port}, {"udp", f.proxy.DNSPort}, {"tcp", f.proxy.DNSPort}} {
			// Only what the nat rules redirected (ctstate DNAT) reaches
			// the proxy. ACCEPT: a RETURN would fall through to
			// InputChain's final DROP.
			input = append(input, []string{"-s", src, "-d", gw, "-p", pp.proto, "-m", pp.proto, "--dport", strconv.Itoa(int(pp.port)), "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"})
		}
	}
	return forward, input
}

// natRules are the rules of ProxyChain.
func (f *Firewall) natRules() [][]string {
	if f.proxy == nil {
		return nil
	}
	dnsPort := strconv.Itoa(int(f.proxy.DNSPort))
	proxyPort := strconv.Itoa(int(f.proxy.Port))
	var out [][]string
	for _, a := range f.proxiedAddrs() {
		src := a.String() + "/32"
		for _, proto := range []string{"udp", "tcp"} {
			out = append(out, []string{"-s", src, "-p", proto, "-m", proto, "--dport", "53", "-j", "REDIRECT", "--to-ports", dnsPort})
		}
		ports := f.proxied[a]
		for len(ports) > 0 {
			n := min(len(ports), multiportMax)
			var list []string
			for _, p := range ports[:n] {
				list = append(list, strconv.Itoa(int(p)))
			}
			ports = ports[n:]
			out = append(out, []string{"-s", src, "-p", "tcp", "-m", "multiport", "--dports", strings.Join(list, ","), "-j", "REDIRECT", "--to-ports", proxyPort})
		}
	}
	return out
}

// policyRules are the rules of PolicyForwardChain and PolicyInputChain.
func policyRules(fam family) (forward, input [][]string) {
	drop := []string{"-j", "DROP"}
	if fam.v6 {
		return [][]string{drop}, [][]string{drop}
	}
	// Only what PolicyProxyChain redirected (ctstate DNAT: to the proxy
	// or the resolver) reaches the node; ACCEPT, since INPUT's policy may
	// drop. Docker DNATs only published ports, to containers (routed, so
	// dropped in PolicyForwardChain).
	return [][]string{drop}, [][]string{{"-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"}, drop}
}

// policyNATRules are the rules of PolicyProxyChain: DNS (to any server)
// to the resolver, every other TCP port to the proxy, which checks the
// original port against the source's policy and refuses a source it has
// none for. DNAT to the proxy's address on the egress bridge: the node
// delivers locally to any of its addresses.
func (f *Firewall) policyNATRules() [][]string {
	if f.proxy == nil {
		return nil
	}
	gw := f.proxy.Gateway.String()
	dns := gw + ":" + strconv.Itoa(int(f.proxy.DNSPort))
	var out [][]string
	for _, proto := range []string{"udp", "tcp"} {
		out = append(out, []string{"-p", proto, "-m", proto, "--dport", "53", "-j", "DNAT", "--to-destination", dns})
	}
	return append(out, []string{"-p", "tcp", "-j", "DNAT", "--to-destination", gw + ":" + strconv.Itoa(int(f.proxy.Port))})
}

// Healthy reports whether the last Ensure succeeded. Egress sandboxes must
// not be created while it returns an error.
func (f *Firewall) Healthy(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.checked {
		return errors.New("egress firewall not installed yet")
	}
	if f.lastErr != nil {
		return fmt.Errorf("egress firewall: %w", f.lastErr)
	}
	return nil
}

// WatchInterval is how often Run compares a fingerprint of the rules
// between full checks.
const WatchInterval = time.Second

// Run calls Ensure now and every interval until ctx ends. report, if not
// nil, hears about every repair and every failure.
//
// Between full checks it watches the rules: every WatchInterval it takes
// a fingerprint of the filter table (one `iptables -S` per family) and
// calls Ensure as soon as it differs from the one taken before the last
// Ensure. A flush (`iptables -F`, a Docker restart re-creating its chains)
// then leaves Egress sandboxes without rules for about a second, not for a
// whole interval, at the cost of one or two iptables calls a second.
func (f *Firewall) Run(ctx context.Context, interval time.Duration, report func(repaired []string, err error)) {
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	watch := time.NewTicker(WatchInterval)
	defer watch.Stop()
	var seen string
	for {
		// Taken before Ensure, so that a change made while (or after)
		// Ensure runs is seen by the next comparison.
		seen = f.fingerprint(ctx)
		repaired, err := f.Ensure(ctx)
		if ctx.Err() != nil {
			return
		}
		if report != nil && (err != nil || len(repaired) > 0) {
			report(repaired, err)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				break wait
			case <-watch.C:
				if fp := f.fingerprint(ctx); fp == "" || fp != seen {
					break wait
				}
			}
		}
	}
}

// fingerprint is the filter table's rules for every family, or "" if they
// cannot be listed (then Run checks in full).
func (f *Firewall) fingerprint(ctx context.Context) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.backend == nil {
		return "" // not resolved yet: Ensure resolves it
	}
	var b strings.Builder
	for _, fam := range f.families() {
		out, err := f.runFam(ctx, fam, "-S")
		if err != nil {
			return ""
		}
		b.WriteString(out)
	}
	return b.String()
}

// family is one of iptables and ip6tables.
type family struct {
	bin string
	v6  bool
	// forwardParent is the chain that jumps to ForwardChain.
	forwardParent string
	// table is the iptables table; "" is filter.
	table string
}

// tableName is fam's table.
func (fam family) tableName() string {
	if fam.table == "" {
		return "filter"
	}
	return fam.table
}

// runFam runs fam's binary on fam's table.
func (f *Firewall) runFam(ctx context.Context, fam family, args ...string) (string, error) {
	if fam.table != "" {
		args = append([]string{"-t", fam.table}, args...)
	}
	return f.run(ctx, fam.bin, args...)
}

// families are those to configure, with the chosen backend's binaries
// (resolve first).
func (f *Firewall) families() []family {
	fams := []family{{bin: f.backend.IPTables, forwardParent: dockerUserChain}}
	if ipv6Enabled() {
		// Docker (without ip6tables: true) has no DOCKER-USER for IPv6,
		// and the network has no IPv6 subnet: all routed IPv6 from the
		// bridge (link-local to other sandboxes included) is dropped.
		fams = append(fams, family{bin: f.backend.IP6Tables, v6: true, forwardParent: "FORWARD"})
	}
	return fams
}

func ipv6Enabled() bool {
	_, err := os.Stat("/proc/net/if_inet6")
	return err == nil
}

// jump is the rule in parent that sends the bridge's traffic to chain.
func jump(chain string) []string { return []string{"-i", BridgeName, "-j", chain} }

// policyJump is jump for the policy bridge.
func policyJump(chain string) []string { return []string{"-i", PolicyBridgeName, "-j", chain} }

// Ensure installs whatever is missing or changed: the chains and their
// rules, and the jumps to them as the first rule of DOCKER-USER (FORWARD
// for IPv6) and INPUT. It returns what it repaired.
func (f *Firewall) Ensure(ctx context.Context) (repaired []string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	repaired, err = f.ensure(ctx)
	f.checked, f.lastErr = true, err
	return repaired, err
}

func (f *Firewall) ensure(ctx context.Context) ([]string, error) {
	if _, err := f.resolve(ctx); err != nil {
		return nil, err
	}
	v4 := family{bin: f.backend.IPTables, forwardParent: dockerUserChain}
	if !f.opts.Manager && f.chainExists(ctx, v4, ManagerMarkerChain) {
		// A node manager owns the rules: check, never write.
		return nil, f.verifyOwned(ctx)
	}
	if f.opts.Manager {
		if err := f.ensureChain(ctx, v4, ManagerMarkerChain); err != nil {
			return nil, err
		}
	}
	var repaired []string
	for _, fam := range f.families() {
		forward, input, err := f.rules(fam)
		if err != nil {
			return repaired, err
		}
		if !fam.v6 {
			// Docker creates DOCKER-USER and jumps to it from FORWARD when
			// it starts; make sure of both, so our jump is reached.
			if err := f.ensureChain(ctx, fam, dockerUserChain); err != nil {
				return repaired, err
			}
			if _, err := f.runFam(ctx, fam, "-C", "FORWARD", "-j", dockerUserChain); err != nil {
				if _, err := f.runFam(ctx, fam, "-I", "FORWARD", "1", "-j", dockerUserChain); err != nil {
					return repaired, err
				}
				repaired = append(repaired, fam.bin+" FORWARD -j "+dockerUserChain)
			}
		}
		if !fam.v6 {
			// The chains ForwardChain and InputChain jump to must exist
			// first. Without a proxy they are only created, never
			// flushed: another manager on this Docker host may own them.
			pf, pi := f.proxyRules()
			for _, c := range []struct {
				name  string
				rules [][]string
			}{{ProxyForwardChain, pf}, {ProxyInputChain, pi}} {
				if f.proxy == nil {
					if err := f.ensureChain(ctx, fam, c.name); err != nil {
						return repaired, err
					}
					continue
				}
				did, err := f.ensureRules(ctx, fam, c.name, c.rules)
				if err != nil {
					return repaired, err
				}
				if did {
					repaired = append(repaired, fam.bin+" "+c.name)
				}
			}
		}
		for _, c := range []struct {
			name  string
			rules [][]string
		}{{ForwardChain, forward}, {InputChain, input}} {
			did, err := f.ensureRules(ctx, fam, c.name, c.rules)
			if err != nil {
				return repaired, err
			}
			if did {
				repaired = append(repaired, fam.bin+" "+c.name)
			}
		}
		for _, j := range []struct{ parent, chain string }{{fam.forwardParent, ForwardChain}, {"INPUT", InputChain}} {
			did, err := f.ensureFirst(ctx, fam, j.parent, jump(j.chain))
			if err != nil {
				return repaired, err
			}
			if did {
				repaired = append(repaired, fmt.Sprintf("%s %s -> %s", fam.bin, j.parent, j.chain))
			}
		}
		pf, pi := policyRules(fam)
		for _, c := range []struct {
			parent, name string
			rules        [][]string
		}{{fam.forwardParent, PolicyForwardChain, pf}, {"INPUT", PolicyInputChain, pi}} {
			did, err := f.ensureRules(ctx, fam, c.name, c.rules)
			if err != nil {
				return repaired, err
			}
			if did {
				repaired = append(repaired, fam.bin+" "+c.name)
			}
			// Second, after the egress bridge's jump (which matches
			// another interface): both come before Docker's rules.
			did, err = f.ensureAt(ctx, fam, c.parent, 2, policyJump(c.name))
			if err != nil {
				return repaired, err
			}
			if did {
				repaired = append(repaired, fmt.Sprintf("%s %s -> %s", fam.bin, c.parent, c.name))
			}
		}
	}
	nat := family{bin: f.backend.IPTables, table: "nat"}
	if f.proxy != nil {
		did, err := f.ensureRules(ctx, nat, ProxyChain, f.natRules())
		if err != nil {
			return repaired, err
		}
		if did {
			repaired = append(repaired, nat.bin+" nat "+ProxyChain)
		}
		did, err = f.ensureFirst(ctx, nat, "PREROUTING", jump(ProxyChain))
		if err != nil {
			return repaired, err
		}
		if did {
			repaired = append(repaired, nat.bin+" nat PREROUTING -> "+ProxyChain)
		}
		did, err = f.ensureRules(ctx, nat, PolicyProxyChain, f.policyNATRules())
		if err != nil {
			return repaired, err
		}
		if did {
			repaired = append(repaired, nat.bin+" nat "+PolicyProxyChain)
		}
		did, err = f.ensureAt(ctx, nat, "PREROUTING", 2, policyJump(PolicyProxyChain))
		if err != nil {
			return repaired, err
		}
		if did {
			repaired = append(repaired, nat.bin+" nat PREROUTING -> "+PolicyProxyChain)
		}
	}
	return repaired, nil
}

// verifyOwned checks the rules a manager installed: both chains and their
// jumps exist. The manager repairs them; we only refuse to run egress
// sandboxes while they are missing. Not the policy bridge's: a Firewall
// that is not a manager's (the MCP server's Docker backend) never runs
// policy sandboxes, and a manager writes its own.
func (f *Firewall) verifyOwned(ctx context.Context) error {
	for _, fam := range f.families() {
		for _, j := range []struct{ parent, chain string }{{fam.forwardParent, ForwardChain}, {"INPUT", InputChain}} {
			rules, err := f.list(ctx, fam, j.chain)
			if err != nil {
				return fmt.Errorf("the node manager's egress rules are missing: %w", err)
			}
			if len(rules) == 0 {
				return fmt.Errorf("the node manager's egress chain %s (%s) is empty", j.chain, fam.bin)
			}
			if _, err := f.runFam(ctx, fam, append([]string{"-C", j.parent}, jump(j.chain)...)...); err != nil {
				return fmt.Errorf("the node manager's jump %s -> %s (%s) is missing", j.parent, j.chain, fam.bin)
			}
		}
	}
	return nil
}

// rules returns the rules (without "-A chain") of the forward and input
// chains for one family.
func (f *Firewall) rules(fam family) (forward, input [][]string, err error) {
	if fam.v6 {
		drop := [][]string{{"-j", "DROP"}}
		return drop, drop, nil
	}
	dns, err := f.dnsServers()
	if err != nil {
		return nil, nil, err
	}
	hosts, err := f.opts.HostAddrs()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	established := []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"}
	var dnsRules [][]string
	for _, a := range dns {
		for _, proto := range []string{"udp", "tcp"} {
			dnsRules = append(dnsRules, []string{"-d", a.String() + "/32", "-p", proto, "-m", proto, "--dport", "53", "-j", "RETURN"})
		}
	}

	// Every manager jumps to the proxy's chains, so that managers
	// sharing one Docker host write the same ForwardChain and InputChain;
	// only the one running the proxy fills them (proxyRules).
	forward = append(forward, []string{"-j", ProxyForwardChain})
	input = append(input, []string{"-j", ProxyInputChain})
	forward = append(forward, established)
	// Allowed destinations RETURN to DOCKER-USER's caller rather than
	// ACCEPT, so that Docker's own rules (inter-container isolation among
	// them) still apply to them.
	for _, p := range f.opts.AllowCIDRs {
		forward = append(forward, []string{"-d", p.String(), "-j", "RETURN"})
	}
	forward = append(forward, dnsRules...)
	for _, p := range BlockedIPv4 {
		forward = append(forward, []string{"-d", p.String(), "-j", "DROP"})
	}
	seen := map[netip.Addr]bool{}
	for _, a := range hosts {
		if !a.Is4() || seen[a] || slices.ContainsFunc(BlockedIPv4, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		seen[a] = true
		forward = append(forward, []string{"-d", a.String() + "/32", "-j", "DROP"})
	}

	// Nothing on the node answers the bridge except DNS, when the node
	// itself is the upstream resolver.
	input = append(input, established)
	input = append(input, dnsRules...)
	input = append(input, []string{"-j", "DROP"})
	return forward, input, nil
}

// dnsServers returns the IPv4 upstream resolvers, sorted.
func (f *Firewall) dnsServers() ([]netip.Addr, error) {
	var out []netip.Addr
	if f.opts.DNSServers != nil {
		out = slices.Clone(f.opts.DNSServers)
	} else {
		servers, err := resolvConfServers(f.opts.ResolvConf)
		if err != nil {
			return nil, err
		}
		out = servers
	}
	out = slices.DeleteFunc(out, func(a netip.Addr) bool { return !a.Is4() || a.IsLoopback() })
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out), nil
}

// resolvConfServers reads the nameservers Docker would use: those of path,
// or of systemd-resolved's upstream file when path names only its stub
// (Docker does the same). A missing file means none.
func resolvConfServers(path string) ([]netip.Addr, error) {
	servers, err := readNameservers(path)
	if err != nil {
		return nil, err
	}
	if slices.Contains(servers, netip.MustParseAddr("127.0.0.53")) {
		upstream, err := readNameservers("/run/systemd/resolve/resolv.conf")
		if err != nil {
			return nil, err
		}
		servers = append(servers, upstream...)
	}
	return servers, nil
}

func readNameservers(path string) ([]netip.Addr, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading DNS servers: %w", err)
	}
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out, nil
}

// ensureRules rewrites chain (atomically, with iptables-restore) unless it
// still lists exactly what we wrote last time and the rules wanted now are
// the same.
func (f *Firewall) ensureRules(ctx context.Context, fam family, chain string, rules [][]string) (bool, error) {
	var want strings.Builder
	for _, r := range rules {
		want.WriteString("-A " + chain + " " + strings.Join(r, " ") + "\n")
	}
	key := fam.bin + "/" + fam.tableName() + "/" + chain
	current, err := f.runFam(ctx, fam, "-S", chain)
	if err == nil && f.desired[key] == want.String() && current == f.applied[key] {
		return false, nil
	}
	payload := "*" + fam.tableName() + "\n:" + chain + " - [0:0]\n" + want.String() + "COMMIT\n"
	// --noflush keeps every other chain; declaring ours flushes it, so the
	// chain is replaced in one transaction and never seen half-written.
	if _, err := f.runInput(ctx, payload, fam.bin+"-restore", "-w", "5", "--noflush"); err != nil {
		return false, err
	}
	listed, err := f.runFam(ctx, fam, "-S", chain)
	if err != nil {
		return false, err
	}
	f.desired[key], f.applied[key] = want.String(), listed
	return true, nil
}

// ensureFirst makes rule the first rule of parent (exactly once).
func (f *Firewall) ensureFirst(ctx context.Context, fam family, parent string, rule []string) (bool, error) {
	return f.ensureAt(ctx, fam, parent, 1, rule)
}

// ensureAt makes rule the pos-th (from 1) rule of parent (exactly once),
// or the last if parent has fewer rules before it.
func (f *Firewall) ensureAt(ctx context.Context, fam family, parent string, pos int, rule []string) (bool, error) {
	rules, err := f.list(ctx, fam, parent)
	if err != nil {
		return false, err
	}
	want := "-A " + parent + " " + strings.Join(rule, " ")
	if i := slices.Index(rules, want); i >= 0 && i == min(pos-1, len(rules)-1) && slices.Index(rules[i+1:], want) < 0 {
		return false, nil
	}
	if err := f.deleteAll(ctx, fam, parent, rule); err != nil {
		return false, err
	}
	rules, err = f.list(ctx, fam, parent)
	if err != nil {
		return false, err
	}
	at := min(pos, len(rules)+1)
	if _, err := f.runFam(ctx, fam, append([]string{"-I", parent, strconv.Itoa(at)}, rule...)...); err != nil {
		return false, err
	}
	return true, nil
}

// deleteAll deletes every copy of rule from parent.
func (f *Firewall) deleteAll(ctx context.Context, fam family, parent string, rule []string) error {
	for range 100 {
		if _, err := f.runFam(ctx, fam, append([]string{"-C", parent}, rule...)...); err != nil {
			return nil
		}
		if _, err := f.runFam(ctx, fam, append([]string{"-D", parent}, rule...)...); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s: could not delete %v from %s", fam.bin, rule, parent)
}

// list returns the "-A" lines of chain.
func (f *Firewall) list(ctx context.Context, fam family, chain string) ([]string, error) {
	out, err := f.runFam(ctx, fam, "-S", chain)
	if err != nil {
		return nil, err
	}
	var rules []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-A ") {
			rules = append(rules, strings.TrimSpace(line))
		}
	}
	return rules, nil
}

func (f *Firewall) chainExists(ctx context.Context, fam family, chain string) bool {
	_, err := f.runFam(ctx, fam, "-S", chain)
	return err == nil
}

func (f *Firewall) ensureChain(ctx context.Context, fam family, chain string) error {
	if f.chainExists(ctx, fam, chain) {
		return nil
	}
	if _, err := f.runFam(ctx, fam, "-N", chain); err != nil && !f.chainExists(ctx, fam, chain) {
		return err
	}
	return nil
}

// Remove deletes the jumps and chains (also the manager marker), for both
// families. Missing pieces are not errors.
func (f *Firewall) Remove(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.resolve(ctx); err != nil {
		return err
	}
	var errs []error
	for _, fam := range f.families() {
		for _, j := range []struct {
			parent, chain string
			rule          []string
		}{
			{fam.forwardParent, ForwardChain, jump(ForwardChain)}, {"INPUT", InputChain, jump(InputChain)},
			{fam.forwardParent, PolicyForwardChain, policyJump(PolicyForwardChain)}, {"INPUT", PolicyInputChain, policyJump(PolicyInputChain)},
		} {
			if f.chainExists(ctx, fam, j.parent) {
				if err := f.deleteAll(ctx, fam, j.parent, j.rule); err != nil {
					errs = append(errs, err)
				}
			}
		}
		chains := []string{ForwardChain, InputChain, PolicyForwardChain, PolicyInputChain}
		if !fam.v6 {
			// After the chains that jump to them.
			chains = append(chains, ManagerMarkerChain, ProxyForwardChain, ProxyInputChain)
		}
		for _, c := range chains {
			if !f.chainExists(ctx, fam, c) {
				continue
			}
			if _, err := f.runFam(ctx, fam, "-F", c); err != nil {
				errs = append(errs, err)
				continue
			}
			if _, err := f.runFam(ctx, fam, "-X", c); err != nil {
				errs = append(errs, err)
			}
		}
	}
	nat := family{bin: f.backend.IPTables, table: "nat"}
	for _, c := range []struct {
		chain string
		rule  []string
	}{{ProxyChain, jump(ProxyChain)}, {PolicyProxyChain, policyJump(PolicyProxyChain)}} {
		if !f.chainExists(ctx, nat, c.chain) {
			continue
		}
		if err := f.deleteAll(ctx, nat, "PREROUTING", c.rule); err != nil {
			errs = append(errs, err)
		}
		if _, err := f.runFam(ctx, nat, "-F", c.chain); err != nil {
			errs = append(errs, err)
		} else if _, err := f.runFam(ctx, nat, "-X", c.chain); err != nil {
			errs = append(errs, err)
		}
	}
	f.applied, f.desired = map[string]string{}, map[string]string{}
	f.checked, f.lastErr = false, nil
	return errors.Join(errs...)
}

// Close is what the MCP server's Docker backend calls on exit: it removes
// the rules unless a node manager owns them. A manager's Firewall keeps
// them (sandboxes outlive a manager restart); remove those with Remove
// (manager --egress-cleanup).
func (f *Firewall) Close(ctx context.Context) error {
	if f.opts.Manager {
		return nil
	}
	b, err := f.Backend(ctx)
	if err != nil {
		return err
	}
	if f.chainExists(ctx, family{bin: b.IPTables}, ManagerMarkerChain) {
		return nil
	}
	return f.Remove(ctx)
}

func (f *Firewall) run(ctx context.Context, bin string, args ...string) (string, error) {
	return f.runInput(ctx, "", bin, args...)
}

func (f *Firewall) runInput(ctx context.Context, stdin, bin string, args ...string) (string, error) {
	if !strings.HasSuffix(bin, "-restore") && (len(args) == 0 || args[0] != "-w") {
		// Wait for the xtables lock rather than fail while Docker or
		// kube-proxy hold it.
		args = append([]string{"-w", "5"}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return f.exec(ctx, stdin, bin, args...)
}

// execCommand is Firewall.exec outside unit tests.
func execCommand(ctx context.Context, stdin, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
