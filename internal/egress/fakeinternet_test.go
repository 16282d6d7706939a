/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
)

// listenInNetns listens on addr (host:port) inside network namespace ns:
// the socket is created on a thread switched into ns and stays there.
func listenInNetns(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	errc := make(chan error, 1)
	var ln net.Listener
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()))
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if _, _, e := syscall.RawSyscall(unix.SYS_SETNS, target.Fd(), syscall.CLONE_NEWNET, 0); e != 0 {
			errc <- fmt.Errorf("setns: %v", e)
			return
		}
		ln, err = net.Listen("tcp4", addr)
		if _, _, e := syscall.RawSyscall(unix.SYS_SETNS, orig.Fd(), syscall.CLONE_NEWNET, 0); e == 0 {
			// Only a thread back in the host namespace may be reused.
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// fakeDNS is the fake internet's resolver on loopback, the proxy's
// upstream: an A record for each name in addrs (lower case, no trailing
// dot), no records of other types for them, NXDOMAIN for every other name.
// It returns its address.
func fakeDNS(t *testing.T, addrs map[string]string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	ds := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) }, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		addr, ok := addrs[strings.TrimSuffix(strings.ToLower(q.Name), ".")]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(addr)})
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = ds.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = ds.Shutdown() })
	return pc.LocalAddr().String()
}

// nodeProxy runs what a node manager runs for policy sandboxes: the egress
// proxy and resolver on the egress network's gateway (cfg's listen
// addresses are set here) and a manager's firewall that sends the
// sandboxes' traffic to them. A non-manager's firewall (e.fw) writes
// nothing, the proxy's rules included, while another manager on this
// Docker host owns the rules.
func (e *env) nodeProxy(ctx context.Context, t *testing.T, cfg egressproxy.Config) *egressproxy.Node {
	t.Helper()
	gw, subnet, err := e.rt.EgressNetworkAddrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.DNSListen = gw.String()+":0", gw.String()+":0"
	p, err := egressproxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan struct{})
	go func() { defer close(pdone); _ = p.Run(pctx) }()
	t.Cleanup(func() { pcancel(); <-pdone })
	tcpAddr, dnsAddr, err := p.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := egress.NewFirewall(egress.Options{Manager: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := fw.SetProxy(&egress.ProxyOptions{Gateway: gw, Subnet: subnet, Port: uint16(tcpAddr.(*net.TCPAddr).Port), DNSPort: uint16(dnsAddr.(*net.UDPAddr).Port)}); err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	return egressproxy.NewNode(p, fw)
}
