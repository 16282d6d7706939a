package testenv

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// RegistryT is what StartRegistry needs of a *testing.T or GinkgoT().
type RegistryT interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	TempDir() string
	Cleanup(func())
	Failed() bool
}

// StartRegistry runs Debian's docker-registry (Docker Distribution) on a
// free loopback port with deletes enabled and storage in a temp dir.
func StartRegistry(t RegistryT) string {
	t.Helper()
	return StartRegistryWith(t, RegistryOptions{})
}

// RegistryOptions configure StartRegistryWith.
type RegistryOptions struct {
	// Host is the IP address to listen on (default 127.0.0.1).
	Host string
	// CertPEM and KeyPEM, when set, make the registry serve TLS with them.
	CertPEM, KeyPEM []byte
}

// StartRegistryWith is StartRegistry on o.Host, over TLS when o has a key
// pair. It returns HOST:PORT.
func StartRegistryWith(t RegistryT, o RegistryOptions) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatalf("docker-registry is not installed (apt-get install -y docker-registry): %v", err)
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(o.Host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	tlsCfg := ""
	if o.CertPEM != nil {
		crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if err := os.WriteFile(crt, o.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(key, o.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		tlsCfg = fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", crt, key)
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
%s`, filepath.Join(dir, "data"), addr, tlsCfg)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("registry log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		// Over TLS the port answering is enough: the test is what checks
		// the certificate.
		var err error
		if o.CertPEM != nil {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				return addr
			}
		} else {
			var resp *http.Response
			if resp, err = http.Get("http://" + addr + "/v2/"); err == nil {
				resp.Body.Close()
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registry did not answer on %s: %v\n%s", addr, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
