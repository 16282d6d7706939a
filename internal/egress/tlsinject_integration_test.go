/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

var pythonImage = envOr("PYTHON_IMAGE", "code-sandbox-test/python:3")

// A TLS client in a real sandbox (Python's urllib, certificate checks on,
// trusting what EgressCAEnv points it at) reaches an injected HTTPS host
// through the proxy, the header arrives at the echo, and the secret is
// nowhere in the sandbox. Without the CA installed the same request fails
// verification.
func TestEgressInjectedHTTPSFromSandbox(t *testing.T) {
	e := setup(t)
	if e.baseline {
		t.Skip("baseline run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	upCA, err := egressproxy.LoadOrCreateCA(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := upCA.IssueServing([]string{"echo.example.com"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln := listenInNetns(t, e.ns, internetAddr+":443")
	go func() {
		_ = http.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}),
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "auth-ok=%v n=%d path=%s\n", r.Header.Get("Authorization") == proxySecret, len(r.Header.Values("Authorization")), r.URL.Path)
			}))
	}()
	upstream := fakeDNS(t, map[string]string{"echo.example.com": internetAddr})
	proxyCA, err := egressproxy.LoadOrCreateCA(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	node := e.nodeProxy(ctx, t, egressproxy.Config{Upstream: upstream, CA: proxyCA, UpstreamRoots: upCA.Pool()})

	// As the manager creates it: the policy network, EgressCAEnv.
	ct, err := e.rt.CreateAndStart(ctx, dockerruntime.Spec{
		Owner:      dockerruntime.Owner{UID: "egress-test-" + randid.Hex(6), Name: t.Name(), Node: "egress-test"},
		Image:      pythonImage,
		PullPolicy: dockerruntime.PullNever,
		Command:    []string{"sleep", "3600"},
		Network:    dockerruntime.NetworkEgressPolicy,
		Env:        dockerruntime.EgressCAEnv(),
		Pids:       64,
	})
	if err != nil {
		t.Fatalf("creating a python sandbox: %v", err)
	}
	t.Cleanup(func() { _ = e.rt.Remove(context.Background(), ct.ID, 0) })
	if err := node.SetPolicy(ct.EgressAddr, egressproxy.Policy{Sandbox: "ns/tls", Rules: []egressproxy.Rule{
		{Host: "echo.example.com", Inject: &egressproxy.Injection{Header: "Authorization", Value: []byte(proxySecret), PathPrefixes: []string{"/v1/"}}},
	}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.RemovePolicy(ct.EgressAddr) })

	// Default context: certificate and host name checks on.
	get := func(path string) string {
		return e.exec(t, ct.ID, fmt.Sprintf(`python3 -c '
import ssl, urllib.request
ctx = ssl.create_default_context()
assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
try:
    print(urllib.request.urlopen("https://echo.example.com%s", timeout=10, context=ctx).read().decode())
except Exception as e:
    print("error:", e)
' 2>&1`, path))
	}
	if got := get("/v1/x"); !strings.Contains(got, "CERTIFICATE_VERIFY_FAILED") {
		t.Fatalf("before the CA is installed, the proxy's certificate must not verify: %q", got)
	}
	if err := e.rt.InstallEgressCA(ctx, ct.ID, node.CAPEM()); err != nil {
		t.Fatal(err)
	}
	if got := get("/v1/x"); !strings.Contains(got, "auth-ok=true n=1 path=/v1/x") {
		t.Fatalf("an injected HTTPS request from the sandbox: %q", got)
	}
	if got := get("/other"); !strings.Contains(got, "auth-ok=false n=0 path=/other") {
		t.Fatalf("a path outside the rule got the header: %q", got)
	}
	if got := e.exec(t, ct.ID, `env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; P=s3cr; grep -rs "${P}3t" /tmp /etc /home /root /app /usr/local 2>/dev/null; echo done`); strings.Contains(got, "s3cr3t") {
		t.Fatalf("the secret is in the sandbox: %q", got)
	}
}
