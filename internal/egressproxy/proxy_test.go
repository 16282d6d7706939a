/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func injectedPolicy(name string) Policy {
	return Policy{Sandbox: name, Rules: []Rule{
		{Host: echoHost, Inject: &Injection{Header: "Authorization", Value: []byte(secret), Methods: []string{"GET"}, PathPrefixes: []string{"/v1/"}}},
		{Host: plainHost},
		{Host: "*.wild.example.com"},
		{Host: metaHost}, {Host: rebindHst}, {Host: nodeHost},
	}}
}

func TestAllowedPassThroughAndInjection(t *testing.T) {
	in := newInternet(t)
	sb := in.newSandbox(443, injectedPolicy("ns/a"))

	// A passed-through host: the sandbox sees the real server's certificate
	// (it trusts the fake internet's root, not the proxy's CA), and its own
	// Authorization header arrives untouched.
	code, e, body := get(t, sb.client(in.upCA), "GET", "https://"+plainHost+"/v1/x", http.Header{"Authorization": {"mine"}})
	if code != 200 || e.Server != plainHost || e.Header.Get("Authorization") != "mine" {
		t.Fatalf("pass-through: %d %+v %s", code, e, body)
	}
	if !in.dialedPrefix(fakeAddrs[plainHost] + ":443") {
		t.Fatal("the proxy did not dial the address it resolved")
	}

	// The injected host: terminated with the proxy's CA; the sandbox's
	// forged header is replaced by the secret when method and path match.
	c := sb.client(in.proxyCA)
	code, e, body = get(t, c, "GET", "https://"+echoHost+"/v1/models", http.Header{"Authorization": {"forged"}})
	if code != 200 || e.Server != echoHost {
		t.Fatalf("injected: %d %s", code, body)
	}
	if got := e.Header.Values("Authorization"); len(got) != 1 || got[0] != secret {
		t.Fatalf("injected host got Authorization %q, want the secret once", got)
	}
	ev := in.waitEvent(func(e Event) bool { return e.Decision == DecisionInjected })
	if ev.Sandbox != "ns/a" || ev.Host != echoHost || ev.Method != "GET" || ev.Path != "/v1/models" || ev.Port != 443 {
		t.Fatalf("injection event %+v", ev)
	}

	// Method or path outside the rule: no secret, and the sandbox's own
	// copy is still removed.
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/models"},
		{"GET", "/admin"},
		{"GET", "/v1/../admin"},
		{"GET", "/v1"},
		{"GET", "/v1%2F..%2Fadmin"},
	} {
		code, e, body = get(t, c, tc.method, "https://"+echoHost+tc.path, http.Header{"Authorization": {"forged"}})
		if code != 200 {
			t.Fatalf("%s %s: %d %s", tc.method, tc.path, code, body)
		}
		if got := e.Header.Values("Authorization"); len(got) != 0 {
			t.Errorf("%s %s: Authorization %q arrived; want none", tc.method, tc.path, got)
		}
	}

	// The secret is in no event.
	for _, ev := range in.proxy.Recent("ns/a") {
		if strings.Contains(fmt.Sprintf("%#v", ev), "s3cr3t") {
			t.Fatalf("an event holds the secret: %#v", ev)
		}
	}
}

func TestInjectedPlainHTTP(t *testing.T) {
	in := newInternet(t)
	sb := in.newSandbox(80, Policy{Sandbox: "ns/h", Rules: []Rule{{Host: httpHost, Inject: &Injection{Header: "X-Api-Key", Value: []byte("k3y")}}}})
	c := sb.client(in.upCA)
	code, e, body := get(t, c, "GET", "http://"+httpHost+"/", http.Header{"X-Api-Key": {"mine"}})
	if code != 200 || e.Header.Get("X-Api-Key") != "k3y" || len(e.Header.Values("X-Api-Key")) != 1 {
		t.Fatalf("%d %+v %s", code, e, body)
	}
}

// dialTLS opens a TLS connection through the proxy with sni.
func dialTLS(t *testing.T, sb *sandbox, sni string, roots *tls.Config) (*tls.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := sb.dial(ctx)
	must(t, err)
	cfg := roots.Clone()
	cfg.ServerName = sni
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return tc, nil
}

func TestRefusals(t *testing.T) {
	in := newInternet(t)
	sb := in.newSandbox(443, injectedPolicy("ns/r"))
	insecure := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the refusal must come before any certificate

	t.Run("raw IP: no SNI", func(t *testing.T) {
		if _, err := dialTLS(t, sb, "", insecure); err == nil {
			t.Fatal("TLS without SNI went through")
		}
		in.waitEvent(refused("", ReasonNoSNI))
	})
	t.Run("DoH to a literal IP", func(t *testing.T) {
		// A DoH client aimed at 1.1.1.1 sends no SNI (or an IP): refused
		// before a byte leaves, whatever it meant to ask.
		c := &http.Client{Transport: &http.Transport{
			DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.dial(ctx) },
			TLSClientConfig: insecure,
		}, Timeout: 5 * time.Second}
		if _, err := c.Get("https://1.1.1.1/dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE"); err == nil {
			t.Fatal("DoH to a literal IP went through")
		}
		in.waitEvent(refused("", ReasonNoSNI))
	})
	t.Run("unlisted name", func(t *testing.T) {
		if _, err := dialTLS(t, sb, "other.net", &tls.Config{RootCAs: in.upCA.Pool()}); err == nil {
			t.Fatal("unlisted name went through")
		}
		in.waitEvent(refused("other.net", ReasonNotAllowed))
		if in.dialedPrefix(fakeAddrs["other.net"]) {
			t.Fatal("the proxy dialed an unlisted name")
		}
	})
	t.Run("wildcard", func(t *testing.T) {
		for _, ok := range []string{wildHost, deepWild} {
			tc, err := dialTLS(t, sb, ok, &tls.Config{RootCAs: in.upCA.Pool()})
			if err != nil {
				t.Fatalf("%s: %v", ok, err)
			}
			_ = tc.Close()
		}
		for _, no := range []string{wildApex, lookalike} {
			if _, err := dialTLS(t, sb, no, &tls.Config{RootCAs: in.upCA.Pool()}); err == nil {
				t.Fatalf("%s matched *.wild.example.com", no)
			}
			in.waitEvent(refused(no, ReasonNotAllowed))
		}
	})
	t.Run("SNI/Host mismatch", func(t *testing.T) {
		tc, err := dialTLS(t, sb, echoHost, &tls.Config{RootCAs: in.proxyCA.Pool()})
		must(t, err)
		defer func() { _ = tc.Close() }()
		fmt.Fprintf(tc, "GET /v1/x HTTP/1.1\r\nHost: %s\r\n\r\n", plainHost)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		must(t, err)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(string(b), "s3cr3t") {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
		in.waitEvent(refused(plainHost, ReasonSNIHostMismatch))
	})
	for _, tc := range []struct{ host, what string }{{metaHost, "169.254.169.254"}, {rebindHst, "a private address (rebinding)"}, {nodeHost, "a node address"}} {
		t.Run("resolves to "+tc.what, func(t *testing.T) {
			if _, err := dialTLS(t, sb, tc.host, insecure); err == nil {
				t.Fatal("went through")
			}
			in.waitEvent(refused(tc.host, ReasonBlockedAddress))
			if in.dialedPrefix(fakeAddrs[tc.host]) {
				t.Fatal("dialed a blocked address")
			}
		})
	}
	t.Run("IP as Host", func(t *testing.T) {
		hb := in.newSandbox(80, Policy{Sandbox: "ns/r", Rules: []Rule{{Host: httpHost}}})
		code, _, body := get(t, hb.client(in.upCA), "GET", "http://"+fakeAddrs[httpHost]+"/", nil)
		if code != http.StatusForbidden {
			t.Fatalf("%d %s", code, body)
		}
		in.waitEvent(refused(fakeAddrs[httpHost], ReasonRawIP))
		code, _, body = get(t, hb.client(in.upCA), "GET", "http://169.254.169.254/latest/meta-data/", nil)
		if code != http.StatusForbidden {
			t.Fatalf("metadata by IP: %d %s", code, body)
		}
	})
	t.Run("another host on the same HTTP connection", func(t *testing.T) {
		hb := in.newSandbox(80, Policy{Sandbox: "ns/r", Rules: []Rule{{Host: httpHost}, {Host: "other.net"}}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := hb.dial(ctx)
		must(t, err)
		defer func() { _ = c.Close() }()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\nGET / HTTP/1.1\r\nHost: other.net\r\n\r\n", httpHost)
		br := bufio.NewReader(c)
		r1, err := http.ReadResponse(br, nil)
		must(t, err)
		_, _ = io.Copy(io.Discard, r1.Body)
		r2, err := http.ReadResponse(br, nil)
		must(t, err)
		if r1.StatusCode != 200 || r2.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("got %d then %d", r1.StatusCode, r2.StatusCode)
		}
	})
	t.Run("port not listed", func(t *testing.T) {
		pb := in.newSandbox(8443, Policy{Sandbox: "ns/r", Rules: []Rule{{Host: plainHost}}})
		if _, err := dialTLS(t, pb, plainHost, &tls.Config{RootCAs: in.upCA.Pool()}); err == nil {
			t.Fatal("port 8443 went through without being listed")
		}
		in.waitEvent(refused(plainHost, ReasonNotAllowed))
		must(t, in.proxy.SetPolicy(pb.src, Policy{Sandbox: "ns/r", Rules: []Rule{{Host: plainHost, Ports: []uint16{8443}}}}))
		tc, err := dialTLS(t, pb, plainHost, &tls.Config{RootCAs: in.upCA.Pool()})
		must(t, err)
		_ = tc.Close()
	})
	t.Run("no policy", func(t *testing.T) {
		nb := in.newSandbox(443, Policy{})
		in.proxy.RemovePolicy(nb.src)
		if _, err := dialTLS(t, nb, plainHost, &tls.Config{RootCAs: in.upCA.Pool()}); err == nil {
			t.Fatal("a source without a policy went through")
		}
		in.waitEvent(refused("", ReasonNoPolicy))
	})
	t.Run("not TLS nor HTTP", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := sb.dial(ctx)
		must(t, err)
		defer func() { _ = c.Close() }()
		_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		if strings.Contains(string(b), "SSH") {
			t.Fatalf("got %q", b)
		}
	})
	t.Run("IPv6 source", func(t *testing.T) {
		if err := in.proxy.SetPolicy(netip.MustParseAddr("fd00::5"), injectedPolicy("x")); err == nil {
			t.Fatal("an IPv6 source got a policy")
		}
	})
}

func TestResolver(t *testing.T) {
	in := newInternet(t)
	sb := in.newSandbox(443, injectedPolicy("ns/d"))
	ask := func(src netip.Addr, name string, qtype uint16, network string) *dns.Msg {
		t.Helper()
		c := &dns.Client{Net: network, Timeout: 3 * time.Second}
		if network == "udp" {
			c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: src.AsSlice()}}
		} else {
			c.Dialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		r, _, err := c.Exchange(m, in.dnsAddr)
		must(t, err)
		return r
	}
	for _, network := range []string{"udp", "tcp"} {
		r := ask(sb.src, echoHost, dns.TypeA, network)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != fakeAddrs[echoHost] {
			t.Fatalf("%s A %s: %v", network, echoHost, r)
		}
		if r := ask(sb.src, "Deep.Sub."+wildHost, dns.TypeA, network); r.Rcode != dns.RcodeNameError {
			// not in the fake internet: the upstream's NXDOMAIN
			t.Fatalf("%s: %v", network, r)
		}
	}
	if r := ask(sb.src, echoHost, dns.TypeAAAA, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("AAAA: %v", r)
	}
	for _, name := range []string{"other.net", wildApex, lookalike, "s3cr3t.exfil.example.org"} {
		if r := ask(sb.src, name, dns.TypeA, "udp"); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Fatalf("%s: %v", name, r)
		}
	}
	in.waitEvent(refused("other.net", ReasonNotAllowed))
	// Blocked answers are not handed out.
	for _, name := range []string{metaHost, rebindHst, nodeHost} {
		if r := ask(sb.src, name, dns.TypeA, "udp"); len(r.Answer) != 0 {
			t.Fatalf("%s answered %v", name, r.Answer)
		}
	}
	// An address without a policy is refused.
	if r := ask(netip.MustParseAddr("127.77.9.9"), echoHost, dns.TypeA, "udp"); r.Rcode != dns.RcodeRefused {
		t.Fatalf("no policy: %v", r)
	}
}

func TestPolicyChangeMidConnection(t *testing.T) {
	in := newInternet(t)
	sb := in.newSandbox(443, injectedPolicy("ns/p"))
	tc, err := dialTLS(t, sb, plainHost, &tls.Config{RootCAs: in.upCA.Pool()})
	must(t, err)
	defer func() { _ = tc.Close() }()
	br := bufio.NewReader(tc)
	roundTrip := func() error {
		if _, err := fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", plainHost); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	must(t, roundTrip())

	// An injected connection whose secret changes: the next request
	// carries the new value, the connection stays.
	ic := sb.client(in.proxyCA)
	if _, e, _ := get(t, ic, "GET", "https://"+echoHost+"/v1/a", nil); e == nil || e.Header.Get("Authorization") != secret {
		t.Fatal("no injection before the change")
	}

	pol := injectedPolicy("ns/p")
	pol.Rules = pol.Rules[:1] // plainHost no longer allowed
	pol.Rules[0].Inject = &Injection{Header: "Authorization", Value: []byte("Bearer rotated")}
	start := time.Now()
	must(t, in.proxy.SetPolicy(sb.src, pol))
	_ = tc.SetReadDeadline(time.Now().Add(time.Second))
	if err := roundTrip(); err == nil {
		t.Fatal("the connection to a host the new policy does not allow still works")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("closing took %s", d)
	}
	in.waitEvent(refused(plainHost, ReasonPolicyChanged))
	if _, e, _ := get(t, ic, "GET", "https://"+echoHost+"/v1/a", nil); e == nil || e.Header.Get("Authorization") != "Bearer rotated" {
		t.Fatalf("after the change: %+v", e)
	}
	// New connections see the new policy.
	if _, err := dialTLS(t, sb, plainHost, &tls.Config{RootCAs: in.upCA.Pool()}); err == nil {
		t.Fatal("a new connection to a removed host went through")
	}
}

func TestAuditRateLimit(t *testing.T) {
	in := newInternet(t)
	var got int
	p, err := New(Config{Listen: "127.0.0.1:0", DNSListen: "127.0.0.1:0", Upstream: "127.0.0.1:53", AuditRate: 1, AuditBurst: 3, RecentPerSandbox: 5, Audit: func(Event) { got++ }})
	must(t, err)
	_ = in
	for i := range 10 {
		p.refuse("ns/x", fmt.Sprintf("h%d.example.com", i), 443, "", "", ReasonNotAllowed)
	}
	if r := p.Recent("ns/x"); len(r) != 5 || r[4].Host != "h9.example.com" {
		t.Fatalf("recent: %+v", r)
	}
	if p.Dropped() != 7 {
		t.Fatalf("dropped %d, want 7", p.Dropped())
	}
}
