/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"
)

type fakeDocker struct {
	existing  *network.Inspect
	createErr error
	created   *network.CreateOptions
}

func (f *fakeDocker) NetworkInspect(_ context.Context, id string, _ network.InspectOptions) (network.Inspect, error) {
	if f.existing == nil {
		return network.Inspect{}, cerrdefs.ErrNotFound.WithMessage("network " + id + " not found")
	}
	return *f.existing, nil
}

func (f *fakeDocker) NetworkCreate(_ context.Context, name string, opts network.CreateOptions) (network.CreateResponse, error) {
	if f.createErr != nil {
		return network.CreateResponse{}, f.createErr
	}
	f.created = &opts
	f.existing = &network.Inspect{Name: name, ID: "0123456789abcdef", Driver: opts.Driver, Options: opts.Options}
	return network.CreateResponse{ID: "0123456789abcdef"}, nil
}

func TestEnsureNetworkCreatesIt(t *testing.T) {
	f := &fakeDocker{}
	if _, err := EnsureNetwork(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	if f.created == nil || f.created.Driver != "bridge" ||
		f.created.Options["com.docker.network.bridge.enable_icc"] != "false" ||
		f.created.Options["com.docker.network.bridge.name"] != BridgeName {
		t.Fatalf("created with %+v", f.created)
	}
	// Idempotent: a second call only inspects.
	f.created = nil
	if _, err := EnsureNetwork(context.Background(), f); err != nil || f.created != nil {
		t.Fatalf("second call: err %v, created %+v", err, f.created)
	}
}

func TestEnsureNetworkAlreadyExistsRace(t *testing.T) {
	good := &network.Inspect{Name: NetworkName, Driver: "bridge", Options: NetworkOptions()}
	f := &raceDocker{fakeDocker: fakeDocker{createErr: cerrdefs.ErrConflict.WithMessage("network with name code-sandbox-egress already exists")}, after: good}
	if _, err := EnsureNetwork(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

// raceDocker: the network appears between our inspect and our create.
type raceDocker struct {
	fakeDocker
	after *network.Inspect
}

func (r *raceDocker) NetworkCreate(ctx context.Context, name string, opts network.CreateOptions) (network.CreateResponse, error) {
	r.existing = r.after
	return r.fakeDocker.NetworkCreate(ctx, name, opts)
}

func TestEnsureNetworkRefusesWrongOptions(t *testing.T) {
	for name, n := range map[string]network.Inspect{
		"icc on":       {Name: NetworkName, Driver: "bridge", Options: map[string]string{"com.docker.network.bridge.name": BridgeName}},
		"other bridge": {Name: NetworkName, Driver: "bridge", Options: map[string]string{"com.docker.network.bridge.name": "br-x", "com.docker.network.bridge.enable_icc": "false"}},
		"overlay":      {Name: NetworkName, Driver: "overlay", Options: NetworkOptions()},
		"internal":     {Name: NetworkName, Driver: "bridge", Options: NetworkOptions(), Internal: true},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeDocker{existing: &n}
			_, err := EnsureNetwork(context.Background(), f)
			if !errors.Is(err, ErrNetworkMisconfigured) || !strings.Contains(err.Error(), "docker network rm "+NetworkName) {
				t.Fatalf("got %v, want ErrNetworkMisconfigured with a remedy", err)
			}
		})
	}
}

func TestParseCIDRs(t *testing.T) {
	got, err := ParseCIDRs([]string{"10.1.0.0/16, 192.168.1.7", "", "172.16.5.9/12"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("192.168.1.7/32"), netip.MustParsePrefix("172.16.0.0/12")}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"nope", "fd00::/8", "10.0.0.0/33"} {
		if _, err := ParseCIDRs([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRulesOrder(t *testing.T) {
	f, err := NewFirewall(Options{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")},
		DNSServers: []netip.Addr{netip.MustParseAddr("10.255.255.53"), netip.MustParseAddr("127.0.0.53")},
		HostAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("127.0.0.1")}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	forward, input, err := f.rules(family{bin: "iptables"})
	if err != nil {
		t.Fatal(err)
	}
	join := func(rs [][]string) string {
		var lines []string
		for _, r := range rs {
			lines = append(lines, strings.Join(r, " "))
		}
		return strings.Join(lines, "\n")
	}
	fw := join(forward)
	idx := func(s string) int {
		i := strings.Index(fw, s)
		if i < 0 {
			t.Fatalf("forward rules lack %q:\n%s", s, fw)
		}
		return i
	}
	if !(idx("--ctstate RELATED,ESTABLISHED -j RETURN") < idx("-d 10.9.0.0/16 -j RETURN") &&
		idx("-d 10.9.0.0/16 -j RETURN") < idx("-d 10.255.255.53/32 -p udp -m udp --dport 53 -j RETURN") &&
		idx("--dport 53 -j RETURN") < idx("-d 10.0.0.0/8 -j DROP") &&
		idx("-d 169.254.0.0/16 -j DROP") > 0 && idx("-d 203.0.113.7/32 -j DROP") > idx("-d 10.0.0.0/8 -j DROP")) {
		t.Fatalf("forward rules out of order:\n%s", fw)
	}
	if strings.Contains(fw, "127.0.0.53") || strings.Contains(fw, "10.0.0.5/32") {
		t.Fatalf("loopback resolver or an already covered node address listed:\n%s", fw)
	}
	in := join(input)
	if !strings.HasSuffix(in, "-j DROP") || strings.Contains(in, "10.9.0.0/16") || !strings.Contains(in, "10.255.255.53/32 -p tcp") {
		t.Fatalf("input rules: the node is closed but for DNS; the allow-list does not open it:\n%s", in)
	}
}

func TestBridgeVisible(t *testing.T) {
	if err := BridgeVisible("lo"); err != nil {
		t.Errorf("BridgeVisible(lo) = %v, want nil", err)
	}
	err := BridgeVisible("csbx-absent9")
	if err == nil || !strings.Contains(err.Error(), "not in this process's network namespace") {
		t.Errorf("BridgeVisible(absent) = %v, want an error naming the namespace", err)
	}
}

func TestProxyRules(t *testing.T) {
	f, err := NewFirewall(Options{
		DNSServers: []netip.Addr{netip.MustParseAddr("10.255.255.53")},
		HostAddrs:  func() ([]netip.Addr, error) { return nil, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetProxy(&ProxyOptions{Gateway: netip.MustParseAddr("10.1.2.3"), Subnet: netip.MustParsePrefix("172.30.0.0/16"), Port: 15001, DNSPort: 15053}); err == nil {
		t.Fatal("a gateway outside the subnet was accepted")
	}
	if err := f.SetProxy(&ProxyOptions{Gateway: netip.MustParseAddr("172.30.0.1"), Subnet: netip.MustParsePrefix("172.30.0.0/16"), Port: 15001, DNSPort: 15053}); err != nil {
		t.Fatal(err)
	}
	var ports []uint16
	for p := uint16(8000); p < 8020; p++ {
		ports = append(ports, p)
	}
	f.proxied = map[netip.Addr][]uint16{netip.MustParseAddr("172.30.0.9"): append([]uint16{80, 443}, ports...)}
	forward, input, err := f.rules(family{bin: "iptables"})
	if err != nil {
		t.Fatal(err)
	}
	join := func(rs [][]string) string {
		var lines []string
		for _, r := range rs {
			lines = append(lines, strings.Join(r, " "))
		}
		return strings.Join(lines, "\n")
	}
	if got := join(forward[:1]) + "|" + join(input[:1]); got != "-j CSBX-EGRESS-PROXIED|-j CSBX-EGRESS-PROXIED-IN" {
		t.Fatalf("the forward and input chains must first jump to the proxy's chains: %s", got)
	}
	// The same with or without a proxy: managers sharing a Docker host
	// write identical chains.
	plain, err := NewFirewall(Options{DNSServers: []netip.Addr{netip.MustParseAddr("10.255.255.53")}, HostAddrs: func() ([]netip.Addr, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	pfw, pin, _ := plain.rules(family{bin: "iptables"})
	if join(pfw) != join(forward) || join(pin) != join(input) {
		t.Fatalf("a proxy changed the shared chains:\n%s\n---\n%s", join(forward), join(pfw))
	}
	pf, pi := f.proxyRules()
	fw, in, nat := join(pf), join(pi), join(f.natRules())
	if fw != "! -s 172.30.0.0/16 -j DROP\n-s 172.30.0.9/32 -j DROP" {
		t.Fatalf("proxied forward: spoofed sources, then everything routed from a proxied sandbox:\n%s", fw)
	}
	for _, want := range []string{
		"! -s 172.30.0.0/16 -j DROP",
		"-s 172.30.0.9/32 -d 172.30.0.1/32 -p tcp -m tcp --dport 15001 -m conntrack --ctstate DNAT -j ACCEPT",
		"-s 172.30.0.9/32 -d 172.30.0.1/32 -p udp -m udp --dport 15053 -m conntrack --ctstate DNAT -j ACCEPT",
	} {
		if !strings.Contains(in, want) {
			t.Fatalf("input lacks %q:\n%s", want, in)
		}
	}
	if !strings.HasSuffix(join(input), "-j DROP") {
		t.Fatalf("input must end in DROP:\n%s", join(input))
	}
	for _, want := range []string{
		"-s 172.30.0.9/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 15053",
		"-s 172.30.0.9/32 -p tcp -m tcp --dport 53 -j REDIRECT --to-ports 15053",
		"--dports 80,443,8000,8001,8002,8003,8004,8005,8006,8007,8008,8009,8010,8011,8012 -j REDIRECT --to-ports 15001",
		"--dports 8013,8014,8015,8016,8017,8018,8019 -j REDIRECT --to-ports 15001",
	} {
		if !strings.Contains(nat, want) {
			t.Fatalf("nat lacks %q:\n%s", want, nat)
		}
	}
	// The policy bridge: everything to the proxy by interface, from the
	// first packet, whatever the proxied addresses.
	if got, want := join(f.policyNATRules()), "-p udp -m udp --dport 53 -j DNAT --to-destination 172.30.0.1:15053\n"+
		"-p tcp -m tcp --dport 53 -j DNAT --to-destination 172.30.0.1:15053\n-p tcp -j DNAT --to-destination 172.30.0.1:15001"; got != want {
		t.Fatalf("policy nat:\n%s\nwant\n%s", got, want)
	}
	if plain.policyNATRules() != nil {
		t.Fatal("policy nat rules without a proxy")
	}
	pf4, pi4 := policyRules(family{bin: "iptables"})
	if got := join(pf4) + "|" + join(pi4); got != "-j DROP|-m conntrack --ctstate DNAT -j ACCEPT\n-j DROP" {
		t.Fatalf("policy filter: %s", got)
	}
	pf6, pi6 := policyRules(family{bin: "ip6tables", v6: true})
	if got := join(pf6) + "|" + join(pi6); got != "-j DROP|-j DROP" {
		t.Fatalf("policy filter (IPv6): %s", got)
	}
}
