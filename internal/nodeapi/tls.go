/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"slices"
	"time"
)

// Names of the certificate files in --node-api-cert-dir, as a
// kubernetes.io/tls Secret mounts them.
const (
	CertFileName = "tls.crt"
	KeyFileName  = "tls.key"
)

// ServingCert is the node API's certificate and the pin that clients check.
type ServingCert struct {
	Certificate tls.Certificate
	// SHA256 is the lowercase hex SHA-256 of the leaf certificate's DER, as
	// published in status.agentCertSHA256.
	SHA256 string
}

// CertSHA256 is the pin of a DER-encoded certificate: lowercase hex SHA-256.
func CertSHA256(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// LoadServingCert reads tls.crt and tls.key from dir. The certificate is read
// once: clients pin it through status.agentCertSHA256, which the manager
// publishes at start-up, so a rotated certificate takes effect with a
// restart of the manager (which then updates every Sandbox's pin).
func LoadServingCert(dir string) (ServingCert, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFileName), filepath.Join(dir, KeyFileName))
	if err != nil {
		return ServingCert{}, fmt.Errorf("loading node API certificate from %s: %w", dir, err)
	}
	if len(cert.Certificate) == 0 {
		return ServingCert{}, fmt.Errorf("loading node API certificate from %s: no certificate in %s", dir, CertFileName)
	}
	return ServingCert{Certificate: cert, SHA256: CertSHA256(cert.Certificate[0])}, nil
}

// GenerateServingCert makes a self-signed ECDSA P-256 certificate for hosts
// (DNS names or IP addresses), valid for validity. It needs no CA: clients
// trust it by its pin, not by its issuer.
func GenerateServingCert(hosts []string, validity time.Duration) (ServingCert, error) {
	if len(hosts) == 0 {
		return ServingCert{}, errors.New("generating node API certificate: no host names")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return ServingCert{}, fmt.Errorf("generating node API key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return ServingCert{}, fmt.Errorf("generating certificate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: hosts[0], Organization: []string{"code-sandbox-operator node API"}},
		// A little slack for clocks that disagree.
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		if h == "" || seen[h] {
			continue
		}
		seen[h] = true
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return ServingCert{}, fmt.Errorf("creating node API certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return ServingCert{}, fmt.Errorf("parsing node API certificate: %w", err)
	}
	return ServingCert{
		Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		SHA256:      CertSHA256(der),
	}, nil
}

// CertHosts are the names a generated certificate covers: the advertised
// address, the node name, and loopback.
func CertHosts(advertise, nodeName string) []string {
	hosts := []string{advertise, nodeName, "localhost", "127.0.0.1"}
	return slices.DeleteFunc(hosts, func(h string) bool { return h == "" })
}

// PinnedTLSConfig is a client TLS configuration that accepts exactly the
// server certificate whose SHA-256 is pin, whatever its issuer and names.
// It is what a client of the node API does with status.agentCertSHA256.
func PinnedTLSConfig(pin string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is not checked against a CA; the pin below replaces
		// that check, and is stricter.
		InsecureSkipVerify: true, //nolint:gosec // verified by VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("node API presented no certificate")
			}
			if got := CertSHA256(cs.PeerCertificates[0].Raw); got != pin {
				return fmt.Errorf("node API certificate SHA-256 %s does not match the pinned %s", got, pin)
			}
			return nil
		},
	}
}
