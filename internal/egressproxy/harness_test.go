/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// The fake internet: names, their public (TEST-NET-3) addresses, and the
// servers behind them. The proxy's Dial maps each address to a loopback
// listener; nothing else is reachable, and every dial is recorded.
const (
	echoHost  = "echo.example.com"  // HTTPS, echoes the request; injected in most policies
	plainHost = "plain.example.com" // HTTPS, echoes the request; never injected
	httpHost  = "http.example.com"  // plain HTTP echo on port 80
	wildHost  = "api.wild.example.com"
	deepWild  = "a.b.wild.example.com"
	wildApex  = "wild.example.com"
	lookalike = "evilwild.example.com"
	metaHost  = "meta.example.com"   // resolves to 169.254.169.254
	rebindHst = "rebind.example.com" // resolves to 10.0.0.5
	nodeHost  = "node.example.com"   // resolves to a node address (loopback)
	secret    = "Bearer s3cr3t-token-9f1c2e"
)

var fakeAddrs = map[string]string{
	echoHost:    "203.0.113.10",
	plainHost:   "203.0.113.11",
	httpHost:    "203.0.113.13",
	wildHost:    "203.0.113.12",
	deepWild:    "203.0.113.12",
	wildApex:    "203.0.113.12",
	lookalike:   "203.0.113.12",
	"other.net": "203.0.113.99",
	metaHost:    "169.254.169.254",
	rebindHst:   "10.0.0.5",
	nodeHost:    "127.0.0.1",
}

// Source addresses: the third octet is the port the sandbox "meant"
// (what SO_ORIGINAL_DST returns after a REDIRECT).
var portOfOctet = map[byte]uint16{1: 443, 2: 80, 3: 8443}

type echoed struct {
	Host   string
	Method string
	Path   string
	Header http.Header
	Server string
}

type internet struct {
	t        *testing.T
	proxy    *Proxy
	proxyCA  *operatorca.CA
	upCA     *operatorca.CA
	proxyTCP string
	dnsAddr  string
	events   chan Event

	mu     sync.Mutex
	dialed []string
	routes map[string]string // "203.0.113.10:443" -> listener address
	next   atomic.Uint32
}

func echoHandler(server string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(echoed{Host: r.Host, Method: r.Method, Path: r.URL.Path, Header: r.Header, Server: server})
	})
}

func newInternet(t *testing.T) *internet {
	t.Helper()
	in := &internet{t: t, routes: map[string]string{}, events: make(chan Event, 4096)}
	var err error
	in.upCA, err = operatorca.NewCA("fake internet root", time.Hour, time.Now())
	must(t, err)
	in.proxyCA, err = operatorca.NewCA("egress proxy test CA", time.Hour, time.Now())
	must(t, err)

	names := []string{echoHost, plainHost, wildHost, deepWild, wildApex, lookalike, "other.net", metaHost, rebindHst, nodeHost}
	cert, err := in.upCA.IssueServing(names, time.Hour)
	must(t, err)
	for _, h := range []string{echoHost, plainHost, wildHost, deepWild, wildApex, lookalike, "other.net"} {
		srv := httptest.NewUnstartedServer(echoHandler(h))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		in.routes[fakeAddrs[h]+":443"] = srv.Listener.Addr().String()
		in.routes[fakeAddrs[h]+":8443"] = srv.Listener.Addr().String()
	}
	hs := httptest.NewServer(echoHandler(httpHost))
	t.Cleanup(hs.Close)
	in.routes[fakeAddrs[httpHost]+":80"] = hs.Listener.Addr().String()

	// The upstream resolver.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	must(t, err)
	ds := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		a, ok := fakeAddrs[strings.TrimSuffix(strings.ToLower(q.Name), ".")]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(a)})
		case q.Qtype == dns.TypeAAAA:
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 300}, AAAA: net.ParseIP("2001:db8::1")})
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	ds.NotifyStartedFunc = func() { close(started) }
	go func() { _ = ds.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = ds.Shutdown() })

	p, err := New(Config{
		Listen:        "127.0.0.1:0",
		DNSListen:     "127.0.0.1:0",
		Upstream:      pc.LocalAddr().String(),
		CA:            in.proxyCA,
		UpstreamRoots: in.upCA.Pool(),
		OriginalPort: func(c net.Conn) (uint16, error) {
			src := sourceOf(c.RemoteAddr())
			if port, ok := portOfOctet[src.As4()[2]]; ok {
				return port, nil
			}
			return 0, fmt.Errorf("no original destination for %s", src)
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			in.mu.Lock()
			in.dialed = append(in.dialed, addr)
			to, ok := in.routes[addr]
			in.mu.Unlock()
			if !ok {
				return nil, fmt.Errorf("fake internet: %s is unreachable", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, to)
		},
		Audit:     func(e Event) { in.events <- e },
		AuditRate: 1000, AuditBurst: 1000,
	})
	must(t, err)
	in.proxy = p
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	tcp, udp, err := p.Addrs(ctx)
	must(t, err)
	in.proxyTCP, in.dnsAddr = tcp.String(), udp.String()
	return in
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sandbox is one source address with a policy, as seen by the proxy.
type sandbox struct {
	in   *internet
	src  netip.Addr
	port uint16
}

// newSandbox returns a fresh source address whose connections mean port,
// with policy pol.
func (in *internet) newSandbox(port uint16, pol Policy) *sandbox {
	in.t.Helper()
	var octet byte
	for o, p := range portOfOctet {
		if p == port {
			octet = o
		}
	}
	if octet == 0 {
		in.t.Fatalf("no source range for port %d", port)
	}
	n := in.next.Add(1)
	src := netip.AddrFrom4([4]byte{127, 77, octet, byte(10 + n)})
	must(in.t, in.proxy.SetPolicy(src, pol))
	return &sandbox{in: in, src: src, port: port}
}

// dial connects to the proxy from the sandbox's address, as a redirected
// connection to any address on s.port would arrive.
func (s *sandbox) dial(ctx context.Context) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: s.src.AsSlice()}, Timeout: 5 * time.Second}
	return d.DialContext(ctx, "tcp4", s.in.proxyTCP)
}

// client is an HTTP client inside the sandbox: every connection goes to the
// proxy, whatever address it names. roots is what the sandbox trusts.
func (s *sandbox) client(roots *operatorca.CA) *http.Client {
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return s.dial(ctx) },
		TLSClientConfig:    &tls.Config{RootCAs: roots.Pool()},
		DisableCompression: true,
	}
	s.in.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// get fetches url and decodes the echo, or returns the status and body.
func get(t *testing.T, c *http.Client, method, url string, hdr http.Header) (int, *echoed, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	must(t, err)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	var e echoed
	var raw strings.Builder
	dec := json.NewDecoder(resp.Body)
	if resp.StatusCode == 200 {
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("%s %s: decoding the echo: %v", method, url, err)
		}
		return resp.StatusCode, &e, ""
	}
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	raw.Write(buf[:n])
	return resp.StatusCode, nil, raw.String()
}

// waitEvent waits for an event matching f.
func (in *internet) waitEvent(f func(Event) bool) Event {
	in.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case e := <-in.events:
			if f(e) {
				return e
			}
		case <-deadline:
			in.t.Fatal("no matching audit event within 5s")
			return Event{}
		}
	}
}

func refused(host, reason string) func(Event) bool {
	return func(e Event) bool {
		return e.Decision == DecisionRefused && e.Reason == reason && (host == "" || strings.TrimSuffix(e.Host, ".") == host)
	}
}

// dialedAny reports whether the proxy dialed any address of addrs.
func (in *internet) dialedPrefix(prefix string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, d := range in.dialed {
		if strings.HasPrefix(d, prefix) {
			return true
		}
	}
	return false
}
