package snapshotstore

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// nonLoopbackIP is an IPv4 address of this machine that is not loopback,
// where a registry is reached as it is on a cluster's network.
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address")
	return ""
}

func servingPair(t *testing.T, ca *operatorca.CA, hosts ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	c, err := ca.IssueServing(hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err = operatorca.EncodeKeyPair(c)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

func newCA(t *testing.T, name string) *operatorca.CA {
	t.Helper()
	ca, err := operatorca.NewCA(name, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// A registry that is not on loopback is used only over verified TLS: plain
// HTTP, an unknown CA and a certificate for another host are each refused
// with ErrRegistryTLS and a message naming the problem, against Debian's
// docker-registry; with its CA in RootCAs the store works.
func TestRegistryTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Debian's docker-registry")
	}
	ip := nonLoopbackIP(t)
	ctx := context.Background()
	put := func(addr string, pool *x509.CertPool) error {
		t.Helper()
		r, err := NewRegistry(addr+"/sandbox-snapshots", RegistryOptions{SpoolDir: t.TempDir(), RootCAs: pool})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = r.Put(ctx, "team-a/s", strings.NewReader("tenant files"))
		return err
	}
	refused := func(what string, err error, words ...string) {
		t.Helper()
		t.Logf("%s: %v", what, err)
		if !errors.Is(err, ErrRegistryTLS) {
			t.Errorf("%s: %v, want ErrRegistryTLS", what, err)
			return
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", what, err, w)
			}
		}
	}

	plain := testenv.StartRegistryWith(t, testenv.RegistryOptions{Host: ip})
	refused("plain HTTP on "+plain, put(plain, nil), plain, "plain HTTP", "loopback")

	ca := newCA(t, "snapshot registry test CA")
	pool := ca.Pool()
	certPEM, keyPEM := servingPair(t, ca, ip)
	tlsAddr := testenv.StartRegistryWith(t, testenv.RegistryOptions{Host: ip, CertPEM: certPEM, KeyPEM: keyPEM})
	refused("the system's CAs", put(tlsAddr, nil), tlsAddr, "not trusted", "--snapshot-registry-ca")
	refused("another CA", put(tlsAddr, newCA(t, "another CA").Pool()), "not trusted")

	otherPEM, otherKey := servingPair(t, ca, "registry.example")
	otherHost := testenv.StartRegistryWith(t, testenv.RegistryOptions{Host: ip, CertPEM: otherPEM, KeyPEM: otherKey})
	refused("a certificate for another host", put(otherHost, pool), otherHost, "not for that host")

	// Trusted: everything a store does.
	r, err := NewRegistry(tlsAddr+"/sandbox-snapshots", RegistryOptions{MaxBytes: 8 << 20, SpoolDir: t.TempDir(), RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, r, []string{plain + "/sandbox-snapshots/team-a/snap-1@sha256:" + strings.Repeat("a", 64)})

	// RootCAs replaces the transport's roots; it cannot be combined with a
	// caller's Transport, whose TLS settings it would silently not apply.
	if _, err := NewRegistry(tlsAddr+"/s", RegistryOptions{RootCAs: pool, Transport: roundTripFunc(nil)}); err == nil {
		t.Error("RootCAs with a Transport was accepted")
	}
}
