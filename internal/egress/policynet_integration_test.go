/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
)

// A sandbox with a policy is never unrestricted, not even between its
// container's start and the manager's SetPolicy: on the policy network its
// first packets (PID 1's own command, before anyone set a policy) reach
// only the proxy, which refuses a source without a policy. The control is
// the same command on the plain egress network, which gets through: the
// window this closes.
func TestEgressPolicyNetworkFromFirstPacket(t *testing.T) {
	e := setup(t)
	if e.baseline {
		t.Skip("baseline run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	ln := listenInNetns(t, e.ns, internetAddr+":80")
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "echo-reached host=%s\n", r.Host)
		}))
	}()
	upstream := fakeDNS(t, map[string]string{"plain.example.com": internetAddr})
	_, subnet, err := e.rt.EgressNetworkAddrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := e.nodeProxy(ctx, t, egressproxy.Config{Upstream: upstream})

	// PID 1's command connects at once: an HTTP request to the echo, a raw
	// connection to the fake internet's other listener, and DNS through a
	// server of its choosing; then it waits.
	first := fmt.Sprintf(`(printf 'GET / HTTP/1.0\r\nHost: plain.example.com\r\n\r\n'; sleep 1) | nc -w 3 %[1]s 80 >/tmp/first 2>&1; `+
		`nc -w 3 %[1]s %[2]d </dev/null >>/tmp/first 2>&1; nslookup plain.example.com 8.8.8.8 >>/tmp/first 2>&1; echo done >>/tmp/first; sleep 3600`,
		internetAddr, listenPort)
	output := func(id string) string {
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := e.exec(t, id, "cat /tmp/first 2>/dev/null")
			if strings.Contains(got, "done") || time.Now().After(deadline) {
				return got
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// The control: on the plain egress network, with no policy, the
	// first packets get out.
	plain := e.sandbox(t, dockerruntime.NetworkEgress, "/bin/sh", "-c", first)
	if got := output(plain.ID); !strings.Contains(got, "echo-reached") || !strings.Contains(got, "hello-"+internetAddr) {
		t.Fatalf("control: an unrestricted egress sandbox's first connections did not get out: %q", got)
	}

	// On the policy network nothing gets out before the policy is set.
	sbx := e.sandbox(t, dockerruntime.NetworkEgressPolicy, "/bin/sh", "-c", first)
	got := output(sbx.ID)
	if !strings.Contains(got, "done") || strings.Contains(got, "echo-reached") || strings.Contains(got, "hello-") || strings.Contains(got, "Address: "+internetAddr) {
		dump, _ := exec.Command("sh", "-c", "iptables -S DOCKER-USER; iptables -S CSBX-EGRESS-POLICY; iptables -S INPUT; iptables -t nat -S PREROUTING; iptables -t nat -S CSBX-EGRESS-POLICY-PROXY; docker inspect -f '{{json .NetworkSettings.Networks}}' "+sbx.ID).CombinedOutput()
		t.Fatalf("a policy sandbox's first packets before its policy: %q\n%s", got, dump)
	}
	ip := sbx.EgressAddr
	if !ip.IsValid() || subnet.Contains(ip) {
		t.Fatalf("the policy sandbox %s is on the egress network %s", ip, subnet)
	}

	// With its policy, the allowed name works through the proxy (so the
	// refusals above were the proxy's, not a dead network), and the rest
	// is still refused.
	if err := node.SetPolicy(ip, egressproxy.Policy{Sandbox: "ns/first", Rules: []egressproxy.Rule{{Host: "plain.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.RemovePolicy(ip) })
	run := func(script string) string { return e.exec(t, sbx.ID, script+" 2>&1") }
	if got := run("nslookup plain.example.com"); !strings.Contains(got, internetAddr) {
		t.Fatalf("resolving an allowed name: %q", got)
	}
	if got := run(fmt.Sprintf(`(printf 'GET / HTTP/1.0\r\nHost: plain.example.com\r\n\r\n'; sleep 1) | nc -w 5 %s 80`, internetAddr)); !strings.Contains(got, "echo-reached host=plain.example.com") {
		t.Fatalf("the allowed name through the proxy: %q", got)
	}
	for _, tc := range []struct{ what, got string }{
		{"raw IP, another port", run(fmt.Sprintf("nc -w 3 %s %d </dev/null || echo unreachable", internetAddr, listenPort))},
		{"the node", run(fmt.Sprintf("nc -w 3 %s %d </dev/null || echo unreachable", e.gateway, listenPort))},
		{"metadata", run(fmt.Sprintf("nc -w 3 %s %d </dev/null || echo unreachable", metadataAddr, listenPort))},
		{"UDP elsewhere", run(fmt.Sprintf("nslookup plain.example.com %s:5353 || echo unreachable", internetAddr))},
	} {
		if strings.Contains(tc.got, "hello-") || strings.Contains(tc.got, "Address: "+internetAddr) {
			t.Errorf("%s: got through: %q", tc.what, tc.got)
		}
	}
}
