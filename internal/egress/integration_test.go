/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress_test

// Integration tests against the real Docker Engine and iptables. They build
// a fake "internet": a network namespace joined to the host by a veth pair,
// holding a public-looking address (203.0.113.10, TEST-NET-3), the cloud
// metadata address (169.254.169.254) and a private one (10.254.77.10), each
// with a TCP listener, routed through the host like any other destination.
// Nothing leaves this machine.
//
// Run as root: go test ./internal/egress/ -count=1 -v
// EGRESS_TEST_BASELINE=nofirewall runs the same checks without installing
// the firewall (what the code did before), to see them fail.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/network"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

const (
	internetAddr = "203.0.113.10"
	metadataAddr = "169.254.169.254"
	privateAddr  = "10.254.77.10"
	privateCIDR  = "10.254.77.0/24"
	// hostVethAddr is the host's end of the veth (MASQUERADE needs a
	// source address on the way out).
	hostVethAddr = "198.51.100.1"
)

// listenPort is the port of every test listener, picked free by the node's.
var listenPort int

var busyboxImage = envOr("BUSYBOX_IMAGE", "code-sandbox-test/busybox:1")

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// env is everything the tests share.
type env struct {
	rt       *dockerruntime.Client
	fw       *egress.Firewall
	ns       string
	gateway  string
	hostIPs  []string
	baseline bool
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("egress integration tests need root (network namespaces, iptables); run as root")
	}
	for _, bin := range []string{"ip", "iptables", "iptables-restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("egress integration tests need %s: %v", bin, err)
		}
	}
	if data, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(data)) != "1" {
		t.Skip("egress integration tests need net.ipv4.ip_forward=1 (Docker sets it)")
	}
}

func setup(t *testing.T) *env {
	t.Helper()
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := dockerruntime.New(dockerruntime.Options{CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if err := rt.Ping(ctx); err != nil {
		t.Skipf("egress integration tests need the Docker Engine: %v", err)
	}
	e := &env{rt: rt, baseline: os.Getenv("EGRESS_TEST_BASELINE") == "nofirewall"}

	// The fake internet.
	id := randid.Hex(3)
	e.ns = "csbx-inet-" + id
	hostIf, nsIf := "csbxh"+id, "csbxn"+id
	sh(t, "ip", "netns", "add", e.ns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", hostIf).Run()
		_ = exec.Command("ip", "netns", "del", e.ns).Run()
		for _, a := range []string{internetAddr, metadataAddr, privateAddr} {
			_ = exec.Command("ip", "route", "del", a+"/32").Run()
		}
	})
	sh(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	sh(t, "ip", "link", "set", nsIf, "netns", e.ns)
	sh(t, "ip", "addr", "add", hostVethAddr+"/32", "dev", hostIf)
	sh(t, "ip", "link", "set", hostIf, "up")
	inNS := func(args ...string) { sh(t, append([]string{"ip", "netns", "exec", e.ns}, args...)...) }
	inNS("ip", "link", "set", "lo", "up")
	inNS("ip", "link", "set", nsIf, "up")
	for _, a := range []string{internetAddr, metadataAddr, privateAddr} {
		inNS("ip", "addr", "add", a+"/32", "dev", nsIf)
		// replace, not add: a run killed before its clean-up leaves these routes.
		sh(t, "ip", "route", "replace", a+"/32", "dev", hostIf)
	}
	inNS("ip", "route", "add", hostVethAddr+"/32", "dev", nsIf)
	inNS("ip", "route", "add", "default", "via", hostVethAddr, "dev", nsIf, "onlink")
	// The node's own listener, on every address.
	hostLn, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostLn.Close() })
	listenPort = hostLn.Addr().(*net.TCPAddr).Port
	go serve(hostLn, "node")
	for _, a := range []string{internetAddr, metadataAddr, privateAddr} {
		serveInNetns(t, e.ns, a)
	}

	// The firewall (what the manager does at start) and the network.
	e.fw, err = egress.NewFirewall(egress.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !e.baseline {
		if _, err := e.fw.Ensure(ctx); err != nil {
			t.Fatalf("installing the egress firewall: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := e.fw.Remove(context.Background()); err != nil {
			t.Errorf("removing the egress firewall: %v", err)
		}
	})
	if err := rt.EnsureEgressNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := rt.Docker().NetworkInspect(ctx, egress.NetworkName, network.InspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.IPAM.Config) == 0 || n.IPAM.Config[0].Gateway == "" {
		t.Fatalf("egress network has no gateway: %+v", n.IPAM)
	}
	e.gateway = n.IPAM.Config[0].Gateway
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			e.hostIPs = append(e.hostIPs, ipn.IP.String())
		}
	}

	// Controls: every listener answers the node itself, so a failure from
	// a sandbox is the firewall's doing.
	for _, a := range append([]string{internetAddr, metadataAddr, privateAddr, e.gateway}, e.hostIPs...) {
		if got := dial(a); !strings.HasPrefix(got, "hello") {
			t.Fatalf("control: the node cannot reach its own test listener %s: %s", a, got)
		}
	}
	return e
}

func serve(ln net.Listener, tag string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("hello-" + tag + "\n"))
		_ = c.Close()
	}
}

// serveInNetns serves the fake internet's plain TCP listener on addr
// inside network namespace ns.
func serveInNetns(t *testing.T, ns, addr string) {
	t.Helper()
	go serve(listenInNetns(t, ns, fmt.Sprintf("%s:%d", addr, listenPort)), addr)
}

func dial(addr string) string {
	c, err := net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", addr, listenPort), 3*time.Second)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	return strings.TrimSpace(string(buf[:n]))
}

// sandbox starts a hardened sandbox through dockerruntime, as the manager
// and the MCP server do.
func (e *env) sandbox(t *testing.T, netMode string, command ...string) dockerruntime.Container {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	uid := "egress-test-" + randid.Hex(6)
	ct, err := e.rt.CreateAndStart(ctx, dockerruntime.Spec{
		Owner:      dockerruntime.Owner{UID: uid, Name: t.Name(), Node: "egress-test"},
		Image:      busyboxImage,
		PullPolicy: dockerruntime.PullNever,
		Command:    command,
		Network:    netMode,
		Pids:       64,
	})
	if err != nil {
		t.Fatalf("creating a %s sandbox: %v", netMode, err)
	}
	t.Cleanup(func() { _ = e.rt.Remove(context.Background(), ct.ID, 0) })
	return ct
}

func (e *env) exec(t *testing.T, id string, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if _, err := e.rt.Exec(ctx, id, dockerruntime.ExecOptions{Cmd: []string{"/bin/sh", "-c", script}}, &out, &out); err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return strings.TrimSpace(out.String())
}

// probe connects from the sandbox to addr:port and returns what it read
// ("hello-…" when connected).
func (e *env) probe(t *testing.T, id, addr string, port int) string {
	t.Helper()
	return e.exec(t, id, fmt.Sprintf("nc -w 3 %s %d </dev/null 2>&1 || echo unreachable", addr, port))
}

// probeAll probes every address in parallel and returns the results.
func (e *env) probeAll(t *testing.T, id string, addrs []string) map[string]string {
	t.Helper()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		res = map[string]string{}
	)
	for _, a := range addrs {
		wg.Go(func() {
			got := e.probe(t, id, a, listenPort)
			mu.Lock()
			res[a] = got
			mu.Unlock()
		})
	}
	wg.Wait()
	return res
}

func (e *env) ipOf(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ins, err := e.rt.Docker().ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ep := ins.NetworkSettings.Networks[egress.NetworkName]
	if ep == nil || ep.IPAddress == "" {
		t.Fatalf("sandbox %s is not on %s: %+v", id, egress.NetworkName, ins.NetworkSettings.Networks)
	}
	return ep.IPAddress
}

func TestEgressIsolation(t *testing.T) {
	e := setup(t)
	sbx := e.sandbox(t, dockerruntime.NetworkEgress)

	t.Run("is on the dedicated network without inter-container traffic", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ins, err := e.rt.Docker().ContainerInspect(ctx, sbx.ID)
		if err != nil {
			t.Fatal(err)
		}
		if string(ins.HostConfig.NetworkMode) != egress.NetworkName || len(ins.NetworkSettings.Networks) != 1 {
			t.Fatalf("egress sandbox network: mode %q, networks %v; want only %s", ins.HostConfig.NetworkMode, ins.NetworkSettings.Networks, egress.NetworkName)
		}
		n, err := e.rt.Docker().NetworkInspect(ctx, egress.NetworkName, network.InspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Options["com.docker.network.bridge.enable_icc"] != "false" || n.Options["com.docker.network.bridge.name"] != egress.BridgeName {
			t.Fatalf("egress network options: %v", n.Options)
		}
	})

	t.Run("reaches the internet", func(t *testing.T) {
		if got := e.probe(t, sbx.ID, internetAddr, listenPort); got != "hello-"+internetAddr {
			t.Fatalf("egress sandbox -> %s: got %q, want the listener's greeting", internetAddr, got)
		}
	})

	t.Run("reaches neither the node, nor metadata, nor private addresses", func(t *testing.T) {
		targets := append([]string{e.gateway, metadataAddr, privateAddr, hostVethAddr}, e.hostIPs...)
		for addr, got := range e.probeAll(t, sbx.ID, targets) {
			t.Logf("egress sandbox -> %s:%d: %q", addr, listenPort, got)
			if strings.HasPrefix(got, "hello") {
				t.Errorf("egress sandbox reached %s:%d (%q); it must not", addr, listenPort, got)
			}
		}
	})

	t.Run("reaches no other sandbox", func(t *testing.T) {
		other := e.sandbox(t, dockerruntime.NetworkEgress, "nc", "-ll", "-p", "8080", "-e", "echo", "hello-sandbox")
		otherIP := e.ipOf(t, other.ID)
		// Control: the listener answers inside its own sandbox.
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := e.probe(t, other.ID, "127.0.0.1", 8080)
			if got == "hello-sandbox" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("control: the other sandbox's listener does not answer locally: %q", got)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if got := e.probe(t, sbx.ID, otherIP, 8080); strings.HasPrefix(got, "hello") {
			t.Fatalf("egress sandbox reached another sandbox at %s:8080 (%q)", otherIP, got)
		}
	})

	t.Run("resolves names through Docker's embedded DNS server", func(t *testing.T) {
		// A name only Docker's resolver knows: the other sandbox's
		// container name on the egress network.
		other := e.sandbox(t, dockerruntime.NetworkEgress)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ins, err := e.rt.Docker().ContainerInspect(ctx, other.ID)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(ins.Name, "/")
		got := e.exec(t, sbx.ID, "nslookup "+name+" 2>&1")
		if !strings.Contains(got, "127.0.0.11") || !strings.Contains(got, e.ipOf(t, other.ID)) {
			t.Fatalf("nslookup %s through the embedded resolver: %s", name, got)
		}
		// Names Docker forwards upstream: the query leaves from the
		// sandbox's own address, through the firewall. Checked when the
		// node's resolver answers the node.
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		_, lerr := (&net.Resolver{PreferGo: true}).LookupHost(rctx, "example.com")
		var dnsErr *net.DNSError
		if lerr == nil || (errors.As(lerr, &dnsErr) && dnsErr.IsNotFound) {
			got := e.exec(t, sbx.ID, "nslookup example.com 2>&1")
			if strings.Contains(got, "timed out") || strings.Contains(got, "SERVFAIL") || strings.Contains(got, "no servers") {
				t.Fatalf("upstream DNS through the embedded resolver fails in the sandbox but works on the node: %s", got)
			}
		} else {
			t.Logf("the node's resolver does not answer (%v); upstream DNS not checked", lerr)
		}
	})
}

func TestNoneSandboxReachesNothing(t *testing.T) {
	e := setup(t)
	sbx := e.sandbox(t, dockerruntime.NetworkNone)
	targets := append([]string{internetAddr, e.gateway, metadataAddr, privateAddr}, e.hostIPs...)
	for addr, got := range e.probeAll(t, sbx.ID, targets) {
		if strings.HasPrefix(got, "hello") {
			t.Errorf("network none sandbox reached %s (%q)", addr, got)
		}
	}
}

func TestRulesComeBack(t *testing.T) {
	e := setup(t)
	sbx := e.sandbox(t, dockerruntime.NetworkEgress)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if !e.baseline {
			e.fw.Run(ctx, time.Second, func(repaired []string, err error) {
				t.Logf("firewall check: repaired %v, error %v", repaired, err)
			})
		}
	}()
	defer func() { cancel(); <-done }()

	blockedAgain := func(t *testing.T, what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			got := e.probe(t, sbx.ID, privateAddr, listenPort)
			if !strings.HasPrefix(got, "hello") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s the sandbox still reaches %s: the rules did not come back", what, privateAddr)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for _, tc := range []struct {
		name   string
		break_ []string
	}{
		{"flushed chain", []string{"iptables", "-w", "5", "-F", egress.ForwardChain}},
		{"removed DOCKER-USER jump", []string{"iptables", "-w", "5", "-D", "DOCKER-USER", "-i", egress.BridgeName, "-j", egress.ForwardChain}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blockedAgain(t, "setup")
			// Racing the checker: break, and observe the repair.
			_ = exec.Command(tc.break_[0], tc.break_[1:]...).Run()
			blockedAgain(t, tc.name)
		})
	}
	t.Run("removed INPUT jump", func(t *testing.T) {
		_ = exec.Command("iptables", "-w", "5", "-D", "INPUT", "-i", egress.BridgeName, "-j", egress.InputChain).Run()
		deadline := time.Now().Add(15 * time.Second)
		for {
			if got := e.probe(t, sbx.ID, e.gateway, listenPort); !strings.HasPrefix(got, "hello") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("after removing the INPUT jump the sandbox still reaches the node")
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}

// TestRulesComeBackPromptly: with the default (slow) full check, a flushed
// chain or a removed jump (iptables -F, a Docker restart re-creating its
// chains) is still repaired within about a second: Run watches a cheap
// fingerprint of the rules and re-applies as soon as it changes, so a
// sandbox does not get the full check interval without rules.
func TestRulesComeBackPromptly(t *testing.T) {
	e := setup(t)
	if e.baseline {
		t.Skip("baseline run: no firewall")
	}
	sbx := e.sandbox(t, dockerruntime.NetworkEgress)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.fw.Run(ctx, egress.DefaultCheckInterval, func(repaired []string, err error) {
			t.Logf("firewall check: repaired %v, error %v", repaired, err)
		})
	}()
	defer func() { cancel(); <-done }()
	// The first full check has run once the rules are in place.
	deadline := time.Now().Add(15 * time.Second)
	for strings.HasPrefix(e.probe(t, sbx.ID, privateAddr, listenPort), "hello") {
		if time.Now().After(deadline) {
			t.Fatal("the rules never came up")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // clear of the first check's tick
	for _, brk := range [][]string{
		{"iptables", "-w", "5", "-F", egress.ForwardChain},
		{"iptables", "-w", "5", "-D", "DOCKER-USER", "-i", egress.BridgeName, "-j", egress.ForwardChain},
	} {
		if out, err := exec.Command(brk[0], brk[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", brk, err, out)
		}
		start := time.Now()
		// The rules are back when the chain has its rules again and
		// DOCKER-USER jumps to it (measured on the rules: a blocked probe
		// takes its own timeout).
		restored := func() bool {
			out, err := exec.Command("iptables", "-w", "5", "-S", egress.ForwardChain).Output()
			jump := exec.Command("iptables", "-w", "5", "-C", "DOCKER-USER", "-i", egress.BridgeName, "-j", egress.ForwardChain).Run()
			return err == nil && jump == nil && strings.Count(string(out), "-A ") > 3
		}
		for !restored() {
			if time.Since(start) > 2500*time.Millisecond {
				t.Fatalf("after %v the rules are still missing %v later: they wait for the %v full check", brk, time.Since(start), egress.DefaultCheckInterval)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("rules back %v after %v", time.Since(start), brk)
		if got := e.probe(t, sbx.ID, privateAddr, listenPort); strings.HasPrefix(got, "hello") {
			t.Fatalf("the rules are back but the sandbox reaches %s", privateAddr)
		}
	}
}

func TestAllowListReopensCIDR(t *testing.T) {
	e := setup(t)
	sbx := e.sandbox(t, dockerruntime.NetworkEgress)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	allowed, err := egress.NewFirewall(egress.Options{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix(privateCIDR)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.probe(t, sbx.ID, privateAddr, listenPort); strings.HasPrefix(got, "hello") {
		t.Fatalf("before the allow-list the sandbox reaches %s (%q)", privateAddr, got)
	}
	if _, err := allowed.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.probe(t, sbx.ID, privateAddr, listenPort); got != "hello-"+privateAddr {
		t.Fatalf("with %s allowed the sandbox cannot reach %s: %q", privateCIDR, privateAddr, got)
	}
	// Only that CIDR: metadata and the node stay closed.
	for addr, got := range e.probeAll(t, sbx.ID, []string{metadataAddr, e.gateway}) {
		if strings.HasPrefix(got, "hello") {
			t.Errorf("with only %s allowed the sandbox reached %s (%q)", privateCIDR, addr, got)
		}
	}
}
