/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress_test

// The egress proxy end to end: a real Docker sandbox on the egress network,
// the real iptables rules (nat redirect, anti-spoofing, drops), the proxy
// and resolver on the bridge's gateway, and the fake internet of
// integration_test.go with an HTTP echo on 203.0.113.10:80.

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
)

const proxySecret = "Bearer s3cr3t-e2e-71aa"

func TestEgressProxyEndToEnd(t *testing.T) {
	e := setup(t)
	if e.baseline {
		t.Skip("baseline run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The echo: on the injected name it says only whether the secret
	// arrived (its answer goes back into the sandbox); on any other it
	// echoes every header.
	ln := listenInNetns(t, e.ns, internetAddr+":80")
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Host == "echo.example.com" {
				fmt.Fprintf(w, "auth-ok=%v n=%d\n", r.Header.Get("Authorization") == proxySecret, len(r.Header.Values("Authorization")))
				return
			}
			for k, v := range r.Header {
				fmt.Fprintf(w, "%s: %s\n", k, strings.Join(v, ","))
			}
		}))
	}()

	upstream := fakeDNS(t, map[string]string{"echo.example.com": internetAddr, "plain.example.com": internetAddr, "meta.example.com": metadataAddr, "other.example.com": internetAddr})
	ca, err := egressproxy.LoadOrCreateCA(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var events []egressproxy.Event
	evc := make(chan egressproxy.Event, 1024)
	node := e.nodeProxy(ctx, t, egressproxy.Config{
		Upstream: upstream, CA: ca,
		// The fake internet is on a TEST-NET address: the default
		// blocked ranges apply unchanged.
		Audit: func(ev egressproxy.Event) { evc <- ev }, AuditRate: 1000, AuditBurst: 1000,
	})

	sbx := e.sandbox(t, dockerruntime.NetworkEgress)
	ip := netip.MustParseAddr(e.ipOf(t, sbx.ID))
	policy := egressproxy.Policy{Sandbox: "ns/e2e", Rules: []egressproxy.Rule{
		{Host: "echo.example.com", Inject: &egressproxy.Injection{Header: "Authorization", Value: []byte(proxySecret)}},
		{Host: "plain.example.com"},
		{Host: "meta.example.com"},
	}}
	if err := node.SetPolicy(ip, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.RemovePolicy(ip) })

	run := func(script string) string { return e.exec(t, sbx.ID, script+" 2>&1") }

	// The proxy's CA, installed through the helper on the read-only rootfs.
	if err := e.rt.InstallEgressCA(ctx, sbx.ID, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	if got := run("cat " + dockerruntime.EgressCAFile + "; ls -l " + dockerruntime.EgressCABundle); !strings.Contains(got, "BEGIN CERTIFICATE") || !strings.Contains(got, "-rw-r--r--") {
		t.Fatalf("the egress CA in the sandbox: %q", got)
	}
	if err := e.rt.InstallEgressCA(ctx, sbx.ID, []byte("not a certificate")); err == nil {
		t.Fatal("a non-PEM CA was installed")
	}
	// Busybox's wget resolves names through glibc's static NSS and crashes;
	// requests go with nc to the address the sandbox's DNS answered.
	req := func(host, addr, header string) string {
		h := ""
		if header != "" {
			h = header + "\\r\\n"
		}
		return run(fmt.Sprintf("(printf 'GET / HTTP/1.0\\r\\nHost: %s\\r\\n%s\\r\\n'; sleep 1) | nc -w 5 %s 80 || echo unreachable", host, h, addr))
	}

	// Allowed, through Docker's embedded DNS (redirected to the resolver)
	// and a connection to the address it answered (redirected to the proxy).
	if got := run("nslookup echo.example.com"); !strings.Contains(got, internetAddr) {
		t.Fatalf("resolving an allowed name: %q", got)
	}
	if got := req("echo.example.com", internetAddr, "Authorization: forged"); !strings.Contains(got, "auth-ok=true n=1") {
		t.Fatalf("injected request: %q", got)
	}
	got := req("plain.example.com", internetAddr, "Authorization: mine")
	if !strings.Contains(got, "Authorization: mine") || strings.Contains(got, "s3cr3t") {
		t.Fatalf("non-injected echo: %q", got)
	}
	// The secret is nowhere in the sandbox.
	// (The pattern is assembled at run time: the command line itself is
	// read back through /proc.)
	if got := run(`env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; P=s3cr; grep -rs "${P}3t" /tmp /etc /home /root /app 2>/dev/null; echo done`); strings.Contains(got, "s3cr3t") {
		t.Fatalf("the secret is in the sandbox: %q", got)
	}

	// Refused.
	for _, tc := range []struct{ what, got, want string }{
		{"unlisted name (DNS)", run("nslookup other.example.com"), "NXDOMAIN"},
		{"unlisted name (HTTP)", req("other.example.com", internetAddr, ""), "403"},
		{"wildcard-looking name", req("x.echo.example.com", internetAddr, ""), "403"},
		{"raw IP", req(internetAddr, internetAddr, ""), "403"},
		{"metadata by IP", req(metadataAddr, metadataAddr, ""), "403"},
		{"a name resolving to the metadata address (DNS)", run("nslookup meta.example.com; echo end"), "end"},
		{"a name resolving to the metadata address (HTTP)", req("meta.example.com", internetAddr, ""), "403"},
		{"a DNS server chosen by the sandbox", run("nslookup other.example.com 8.8.8.8"), "NXDOMAIN"},
		{"a port outside the policy", run(fmt.Sprintf("nc -w 3 %s %d </dev/null || echo unreachable", internetAddr, listenPort)), "unreachable"},
		{"IPv6", run("nc -w 3 2001:db8::1 80 </dev/null || echo unreachable"), "unreachable"},
	} {
		if !strings.Contains(tc.got, tc.want) || strings.Contains(tc.got, "hello") || strings.Contains(tc.got, "auth-ok") || strings.Contains(tc.got, metadataAddr+"\n") {
			t.Errorf("%s: got %q, want %q", tc.what, tc.got, tc.want)
		}
	}
	if got := run("nslookup meta.example.com"); strings.Contains(got, "Address: "+metadataAddr) {
		t.Errorf("the resolver handed out the metadata address: %q", got)
	}
	if got := run("nslookup echo.example.com 8.8.8.8"); !strings.Contains(got, internetAddr) {
		t.Errorf("an allowed name through a DNS server of the sandbox's choosing is answered by the resolver: %q", got)
	}

	// A policy change applies at once.
	policy.Rules = policy.Rules[1:]
	start := time.Now()
	if err := node.SetPolicy(ip, policy); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the policy change took %s", d)
	}
	if got := req("echo.example.com", internetAddr, ""); strings.Contains(got, "auth-ok") || !strings.Contains(got, "403") {
		t.Fatalf("a removed name still reachable: %q", got)
	}

	// Every refusal was audited, and no event holds the secret.
	deadline := time.After(3 * time.Second)
collect:
	for {
		select {
		case ev := <-evc:
			events = append(events, ev)
		case <-deadline:
			break collect
		}
	}
	reasons := map[string]bool{}
	for _, ev := range events {
		if strings.Contains(fmt.Sprintf("%#v", ev), "s3cr3t") {
			t.Fatalf("an event holds the secret: %#v", ev)
		}
		reasons[ev.Decision+"/"+ev.Reason] = true
	}
	for _, want := range []string{"Injected/Injected", "Refused/NotAllowed", "Refused/RawIP", "Refused/BlockedAddress"} {
		if !reasons[want] {
			t.Errorf("no %s event; got %v", want, reasons)
		}
	}
}
