/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package operatorca is the operator's own certificate authority and
// everything that issues or checks certificates with it:
//
//   - CA: a loaded CA (pure crypto) that issues serving, client and node
//     certificates and signs CSRs;
//   - Authority: the CA kept in a Secret and shared by the control-plane
//     replicas, rotated a year before it expires, with its public bundle
//     (every CA certificate still valid) published in a ConfigMap;
//   - Signer: the controller that approves and signs the node managers'
//     CertificateSigningRequests for signer NodeSignerName;
//   - NodeCertificate: the node manager's side, which requests, serves and
//     renews its node's serving certificate and follows the bundle;
//   - VerifyNode: the client-side check that a peer is the named node;
//   - SelfSigned and NewSigningKey: a certificate no CA vouches for (tests
//     that play a forged peer) and a bare key pair (ServiceAccount tokens).
//
// The admission webhook's and the aggregated API server's serving
// certificates, the aggregated API server's client certificate and the node
// APIs' serving certificates all chain to this one CA.
package operatorca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
)

// Fixed names shared by the issuers and the verifiers.
const (
	// NodeSignerName is the signerName of the node managers' CSRs.
	NodeSignerName = "code-sandbox.dev/node-api"
	// NodeCommonNamePrefix + the node name is the common name of a node
	// API's serving certificate.
	NodeCommonNamePrefix = "system:code-sandbox:node:"
	// AggregatorCommonName is the common name of the aggregated API
	// server's client certificate for calling node APIs.
	AggregatorCommonName = "system:code-sandbox:aggregated-apiserver"
	// NodeNameExtra is the user-info extra the API server adds to requests
	// made with a ServiceAccount token bound to a Pod on a node.
	NodeNameExtra = "authentication.kubernetes.io/node-name"
	// DefaultCASecret holds the CA (BundleKey and KeyCAKey) in the
	// operator namespace.
	DefaultCASecret = "code-sandbox-operator-ca"
	// DefaultBundleConfigMap publishes the CA certificates (BundleKey).
	DefaultBundleConfigMap = "code-sandbox-operator-ca-bundle"
	// BundleKey is the key of the CA certificate(s) in the Secret and the
	// ConfigMap.
	BundleKey = "ca.crt"
	// KeyCAKey is the key of the CA's private key in the Secret.
	KeyCAKey = "ca.key"
)

const (
	// leafBackdate absorbs small clock differences between the issuer and
	// the verifiers (a quarter of the validity for short ones).
	leafBackdate = 5 * time.Minute
	caBackdate   = time.Hour
)

// NodeCommonName is the common name of node's serving certificate.
func NodeCommonName(node string) string { return NodeCommonNamePrefix + node }

// NodeNameOf returns the node a serving certificate names (from its CN) or
// false. It checks the name only; VerifyNode also checks the chain.
func NodeNameOf(cert *x509.Certificate) (string, bool) {
	if cert == nil {
		return "", false
	}
	node, ok := strings.CutPrefix(cert.Subject.CommonName, NodeCommonNamePrefix)
	if !ok || !validNodeName(node) {
		return "", false
	}
	return node, true
}

func validNodeName(node string) bool {
	return node != "" && len(validation.IsDNS1123Subdomain(node)) == 0
}

// CA is a loaded certificate authority: pure crypto, no Kubernetes. Its
// certificates are ECDSA P-256.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
	clock   clock.PassiveClock
}

// NewCA creates a self-signed CA valid from now (back-dated by an hour) for
// validity. It may sign only end-entity certificates (path length 0).
func NewCA(commonName string, validity time.Duration, now time.Time) (*CA, error) {
	if validity <= 0 {
		return nil, errors.New("operator CA: the validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-caBackdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating the CA %q: %w", commonName, err)
	}
	keyPEM, err := encodeECKey(key)
	if err != nil {
		return nil, err
	}
	return LoadCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM)
}

// NewSigningKey returns a new ECDSA P-256 key pair, PEM-encoded: the
// private key as "EC PRIVATE KEY" (SEC 1) and the public key as
// "PUBLIC KEY" (PKIX), as kube-apiserver reads a ServiceAccount token
// signing key (--service-account-signing-key-file, --service-account-key-file).
func NewSigningKey() (keyPEM, pubPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeECKey(key)
	if err != nil {
		return nil, nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	return keyPEM, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), nil
}

// SelfSigned returns a certificate signed with its own new P-256 key, for
// commonName and hosts (DNS names or IP addresses; none is fine), with the
// one extended key usage usage, valid from now for validity. No CA vouches
// for it: it is for tests that play a forged peer (a node API impostor, a
// client the operator CA never issued to), whose certificate must not chain
// to the operator CA however well it names its subject.
func SelfSigned(commonName string, hosts []string, usage x509.ExtKeyUsage, validity time.Duration) (*tls.Certificate, error) {
	if commonName == "" {
		return nil, errors.New("a self-signed certificate needs a common name")
	}
	if validity <= 0 {
		return nil, errors.New("the certificate validity must be positive")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	addHosts(tmpl, hosts)
	return withNewKey(func(key *ecdsa.PrivateKey) (*x509.Certificate, error) {
		fillLeaf(tmpl, &key.PublicKey, time.Now(), validity)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return nil, fmt.Errorf("creating a self-signed certificate for %q: %w", commonName, err)
		}
		return x509.ParseCertificate(der)
	})
}

// LoadCA parses a CA certificate and its private key (PEM; the key as EC,
// PKCS#8 or PKCS#1). It refuses a certificate that is not a CA allowed to
// sign certificates, and a key that does not match it. It does not check
// the validity period.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate: not a CA that may sign certificates")
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, errors.New("the CA key does not match the CA certificate")
	}
	return &CA{cert: cert, key: key, certPEM: bytes.Clone(certPEM), keyPEM: bytes.Clone(keyPEM), clock: clock.RealClock{}}, nil
}

// WithClock returns a copy of the CA that issues certificates at the times
// c tells (tests).
func (ca *CA) WithClock(c clock.PassiveClock) *CA {
	cp := *ca
	cp.clock = c
	return &cp
}

// Certificate is the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM is the CA certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// KeyPEM is the CA's private key, PEM-encoded.
func (ca *CA) KeyPEM() []byte { return bytes.Clone(ca.keyPEM) }

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Signed reports whether cert was signed by this CA.
func (ca *CA) Signed(cert *x509.Certificate) bool {
	return cert != nil && cert.CheckSignatureFrom(ca.cert) == nil
}

// IssueServing issues a server-auth certificate for hosts (DNS names or IP
// addresses; the first is also the common name), for the webhook and the
// aggregated API server.
func (ca *CA) IssueServing(hosts []string, validity time.Duration) (*tls.Certificate, error) {
	if len(hosts) == 0 {
		return nil, errors.New("a serving certificate needs at least one host")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	addHosts(tmpl, hosts)
	return ca.issueKeyPair(tmpl, validity)
}

// addHosts adds each host to tmpl as an IP address or a DNS name.
func addHosts(tmpl *x509.Certificate, hosts []string) {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
}

// IssueClient issues a client-auth certificate for commonName with groups
// as its organizations (how Kubernetes reads groups from a certificate).
func (ca *CA) IssueClient(commonName string, groups []string, validity time.Duration) (*tls.Certificate, error) {
	if commonName == "" {
		return nil, errors.New("a client certificate needs a common name")
	}
	return ca.issueKeyPair(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, validity)
}

// IssueNode issues what the Signer issues for node: a server-auth
// certificate with common name NodeCommonName(node) and no other name.
// Production nodes get theirs through a CSR (NodeCertificate); this is for
// tests.
func (ca *CA) IssueNode(node string, validity time.Duration) (*tls.Certificate, error) {
	if !validNodeName(node) {
		return nil, fmt.Errorf("%q is not a node name", node)
	}
	return ca.issueKeyPair(&x509.Certificate{
		Subject:     pkix.Name{CommonName: NodeCommonName(node)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, validity)
}

// SignCSR signs a DER certificate request after checking its signature.
// The certificate takes the request's public key, common name and
// subject alternative names, nothing else from it; the caller decides
// whether those are acceptable. It returns the certificate PEM-encoded.
func (ca *CA) SignCSR(der []byte, usages []x509.ExtKeyUsage, validity time.Duration) ([]byte, error) {
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the certificate request's signature: %w", err)
	}
	if err := checkPublicKey(req.PublicKey); err != nil {
		return nil, err
	}
	cert, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: req.Subject.CommonName},
		DNSNames:    req.DNSNames,
		IPAddresses: req.IPAddresses,
		ExtKeyUsage: usages,
	}, req.PublicKey, validity)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), nil
}

// issueKeyPair issues tmpl for a new P-256 key.
func (ca *CA) issueKeyPair(tmpl *x509.Certificate, validity time.Duration) (*tls.Certificate, error) {
	return withNewKey(func(key *ecdsa.PrivateKey) (*x509.Certificate, error) {
		return ca.issue(tmpl, &key.PublicKey, validity)
	})
}

// withNewKey generates a P-256 key and returns it with the certificate
// sign makes for it.
func withNewKey(sign func(*ecdsa.PrivateKey) (*x509.Certificate, error)) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf, err := sign(key)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// issue fills in serial, validity and key usage and signs. The certificate
// never outlives the CA.
func (ca *CA) issue(tmpl *x509.Certificate, pub crypto.PublicKey, validity time.Duration) (*x509.Certificate, error) {
	if validity <= 0 {
		return nil, errors.New("the certificate validity must be positive")
	}
	now := ca.clock.Now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, fmt.Errorf("the CA %q expired at %s", ca.cert.Subject.CommonName, ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	fillLeaf(tmpl, pub, now, validity)
	if tmpl.NotBefore.Before(ca.cert.NotBefore) {
		tmpl.NotBefore = ca.cert.NotBefore
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// fillLeaf sets what every end-entity certificate has: a serial number, a
// validity from now for validity (back-dated a little) and the key usage
// that fits pub; it is not a CA.
func fillLeaf(tmpl *x509.Certificate, pub crypto.PublicKey, now time.Time, validity time.Duration) {
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-min(leafBackdate, validity/4))
	tmpl.NotAfter = now.Add(validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if _, isRSA := pub.(*rsa.PublicKey); isRSA {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	tmpl.BasicConstraintsValid = true
}

// checkPublicKey accepts the key types and sizes the operator signs.
func checkPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() && k.Curve != elliptic.P521() {
			return errors.New("unsupported elliptic curve")
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("an RSA key of %d bits is too short (at least 2048)", k.N.BitLen())
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("unsupported public key type %T", pub)
	}
	return nil
}

// VerifyNode returns a tls.Config.VerifyConnection callback that accepts
// only a server whose certificate chains to pool() for server
// authentication and names node (NodeNameOf == node). pool is called per
// handshake, so a rotated bundle takes effect at once; VerifyConnection
// also runs on resumed sessions.
//
// Node certificates carry no DNS name or IP address (an address proves
// nothing; the node name does), so the client must set InsecureSkipVerify
// to turn off Go's host name check, which this callback replaces with a full
// chain verification. Use it as:
//
//	&tls.Config{InsecureSkipVerify: true, VerifyConnection: operatorca.VerifyNode(pool, node), ...}
func VerifyNode(pool func() *x509.CertPool, node string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if !validNodeName(node) {
			return fmt.Errorf("node API: %q is not a node name; no server is trusted", node)
		}
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("node API of %s: the server sent no certificate", node)
		}
		roots := pool()
		if roots == nil {
			return fmt.Errorf("node API of %s: the operator CA bundle is not loaded yet", node)
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{
			Roots: roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}); err != nil {
			return fmt.Errorf("node API of %s: the server certificate (CN %q) is not from the operator CA: %w", node, leaf.Subject.CommonName, err)
		}
		if got, ok := NodeNameOf(leaf); !ok || got != node {
			return fmt.Errorf("node API of %s: the server certificate names %q, not %q", node, leaf.Subject.CommonName, NodeCommonName(node))
		}
		return nil
	}
}

// EncodeKeyPair returns a certificate chain and its private key PEM-encoded
// (the key as PKCS#8), as tls.X509KeyPair reads them.
func EncodeKeyPair(c *tls.Certificate) (certPEM, keyPEM []byte, err error) {
	if c == nil || len(c.Certificate) == 0 {
		return nil, nil, errors.New("no certificate")
	}
	for _, der := range c.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// ParseCertificates returns every certificate in a PEM bundle; blocks that
// are not certificates are skipped, a CERTIFICATE block that does not parse
// is an error.
func ParseCertificates(bundle []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, bundle = pem.Decode(bundle)
		if block == nil {
			return out, nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// encodeECKey PEM-encodes key as "EC PRIVATE KEY" (SEC 1).
func encodeECKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKeyPEM(b []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM key")
	}
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", key)
	}
	return signer, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}
