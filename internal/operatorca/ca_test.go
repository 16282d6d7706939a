/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"net/url"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

func newCA(validity time.Duration) *operatorca.CA {
	GinkgoHelper()
	ca, err := operatorca.NewCA("test-ca", validity, time.Now())
	Expect(err).NotTo(HaveOccurred())
	return ca
}

// handshake serves server over TLS on loopback and connects a client that
// verifies it with VerifyNode(pool, node) and, once connected, sends a
// secret. It returns what the server received and the client's error.
func handshake(server *tls.Certificate, pool func() *x509.CertPool, node string) ([]byte, error) {
	GinkgoHelper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*server}, MinVersion: tls.VersionTLS12})
	Expect(err).NotTo(HaveOccurred())
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(conn)
		got <- b
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // VerifyNode verifies the chain and the node name
		VerifyConnection:   operatorca.VerifyNode(pool, node),
	})
	if err == nil {
		_, _ = io.WriteString(conn, "Authorization: Bearer secret")
		conn.Close()
	}
	var received []byte
	Eventually(got).WithTimeout(10 * time.Second).Should(Receive(&received))
	return received, err
}

func fixedPool(p *x509.CertPool) func() *x509.CertPool { return func() *x509.CertPool { return p } }

func keyPairOf(ca *operatorca.CA) *tls.Certificate {
	GinkgoHelper()
	pair, err := tls.X509KeyPair(ca.CertPEM(), ca.KeyPEM())
	Expect(err).NotTo(HaveOccurred())
	return &pair
}

var _ = Describe("CA", func() {
	It("is a CA that can sign only end-entity certificates, and round-trips through PEM", func() {
		ca := newCA(24 * time.Hour)
		c := ca.Certificate()
		Expect(c.IsCA).To(BeTrue())
		Expect(c.MaxPathLenZero).To(BeTrue())
		Expect(c.KeyUsage & x509.KeyUsageCertSign).NotTo(BeZero())
		Expect(c.NotAfter).To(BeTemporally("~", time.Now().Add(24*time.Hour), time.Minute))

		loaded, err := operatorca.LoadCA(ca.CertPEM(), ca.KeyPEM())
		Expect(err).NotTo(HaveOccurred())
		Expect(loaded.Certificate().Equal(c)).To(BeTrue())
		leaf, err := loaded.IssueNode("a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(ca.Signed(leaf.Leaf)).To(BeTrue())
	})

	It("refuses to load a certificate that is not a CA, or a key that does not match", func() {
		ca := newCA(time.Hour)
		leaf, err := ca.IssueServing([]string{"x"}, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		certPEM, keyPEM, err := operatorca.EncodeKeyPair(leaf)
		Expect(err).NotTo(HaveOccurred())
		_, err = operatorca.LoadCA(certPEM, keyPEM)
		Expect(err).To(MatchError(ContainSubstring("not a CA")))
		_, err = operatorca.LoadCA(ca.CertPEM(), keyPEM)
		Expect(err).To(MatchError(ContainSubstring("does not match")))
		_, err = operatorca.LoadCA([]byte("garbage"), ca.KeyPEM())
		Expect(err).To(HaveOccurred())
	})

	It("issues serving, client and node certificates with only the usages and names they need", func() {
		ca := newCA(24 * time.Hour)

		serving, err := ca.IssueServing([]string{"svc.ns.svc", "127.0.0.1"}, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(serving.Leaf.IsCA).To(BeFalse())
		Expect(serving.Leaf.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
		Expect(serving.Leaf.KeyUsage).To(Equal(x509.KeyUsageDigitalSignature))
		Expect(serving.Leaf.DNSNames).To(Equal([]string{"svc.ns.svc"}))
		Expect(serving.Leaf.IPAddresses).To(HaveLen(1))
		_, err = serving.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "127.0.0.1"})
		Expect(err).NotTo(HaveOccurred())

		client, err := ca.IssueClient(operatorca.AggregatorCommonName, []string{"g1", "g2"}, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(client.Leaf.Subject.CommonName).To(Equal(operatorca.AggregatorCommonName))
		Expect(client.Leaf.Subject.Organization).To(Equal([]string{"g1", "g2"}))
		Expect(client.Leaf.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}))
		_, err = client.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		Expect(err).NotTo(HaveOccurred())

		node, err := ca.IssueNode("node-a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(node.Leaf.Subject.CommonName).To(Equal("system:code-sandbox:node:node-a"))
		Expect(node.Leaf.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
		Expect(node.Leaf.DNSNames).To(BeEmpty())
		Expect(node.Leaf.IPAddresses).To(BeEmpty())
		Expect(node.Leaf.NotAfter).To(BeTemporally("~", time.Now().Add(time.Hour), time.Minute))
		name, ok := operatorca.NodeNameOf(node.Leaf)
		Expect(ok).To(BeTrue())
		Expect(name).To(Equal("node-a"))

		_, err = ca.IssueNode("Not_A_Node", time.Hour)
		Expect(err).To(HaveOccurred())
		_, err = ca.IssueServing(nil, time.Hour)
		Expect(err).To(HaveOccurred())
		_, err = ca.IssueClient("", nil, time.Hour)
		Expect(err).To(HaveOccurred())
	})

	It("makes a self-signed certificate that names what it is asked to and chains to no CA", func() {
		ca := newCA(24 * time.Hour)
		forged, err := operatorca.SelfSigned(operatorca.NodeCommonName("node-a"), []string{"localhost", "node-a", "127.0.0.1"},
			x509.ExtKeyUsageServerAuth, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		leaf := forged.Leaf
		Expect(leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature)).To(Succeed(), "signed with its own key")
		Expect(leaf.Issuer.String()).To(Equal(leaf.Subject.String()))
		Expect(leaf.Subject.CommonName).To(Equal("system:code-sandbox:node:node-a"))
		Expect(leaf.DNSNames).To(Equal([]string{"localhost", "node-a"}))
		Expect(leaf.IPAddresses).To(HaveLen(1))
		Expect(leaf.IPAddresses[0].String()).To(Equal("127.0.0.1"))
		Expect(leaf.IsCA).To(BeFalse())
		Expect(leaf.KeyUsage).To(Equal(x509.KeyUsageDigitalSignature))
		Expect(leaf.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
		Expect(leaf.NotAfter).To(BeTemporally("~", time.Now().Add(time.Hour), time.Minute))
		Expect(leaf.NotBefore).To(BeTemporally("<", time.Now()))
		Expect(ca.Signed(leaf)).To(BeFalse())
		_, err = leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "localhost"})
		Expect(err).To(HaveOccurred())
		certPEM, keyPEM, err := operatorca.EncodeKeyPair(forged)
		Expect(err).NotTo(HaveOccurred())
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		Expect(err).NotTo(HaveOccurred(), "the key matches the certificate")
		Expect(pair.Leaf.Equal(leaf)).To(BeTrue())

		client, err := operatorca.SelfSigned(operatorca.AggregatorCommonName, nil, x509.ExtKeyUsageClientAuth, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(client.Leaf.Subject.CommonName).To(Equal(operatorca.AggregatorCommonName))
		Expect(client.Leaf.DNSNames).To(BeEmpty())
		Expect(client.Leaf.IPAddresses).To(BeEmpty())
		Expect(client.Leaf.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}))

		_, err = operatorca.SelfSigned("", nil, x509.ExtKeyUsageClientAuth, time.Hour)
		Expect(err).To(HaveOccurred())
		_, err = operatorca.SelfSigned("x", nil, x509.ExtKeyUsageClientAuth, 0)
		Expect(err).To(HaveOccurred())
	})

	It("makes a signing key pair, the private key as SEC 1 and the public key as PKIX", func() {
		keyPEM, pubPEM, err := operatorca.NewSigningKey()
		Expect(err).NotTo(HaveOccurred())
		keyBlock, rest := pem.Decode(keyPEM)
		Expect(rest).To(BeEmpty())
		Expect(keyBlock.Type).To(Equal("EC PRIVATE KEY"))
		key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
		Expect(err).NotTo(HaveOccurred())
		Expect(key.Curve).To(Equal(elliptic.P256()))
		pubBlock, rest := pem.Decode(pubPEM)
		Expect(rest).To(BeEmpty())
		Expect(pubBlock.Type).To(Equal("PUBLIC KEY"))
		pub, err := x509.ParsePKIXPublicKey(pubBlock.Bytes)
		Expect(err).NotTo(HaveOccurred())
		Expect(key.PublicKey.Equal(pub)).To(BeTrue())

		again, _, err := operatorca.NewSigningKey()
		Expect(err).NotTo(HaveOccurred())
		Expect(again).NotTo(Equal(keyPEM), "a new key each time")
	})

	It("never issues a certificate that outlives the CA, nor from an expired CA", func() {
		ca := newCA(2 * time.Hour)
		leaf, err := ca.IssueNode("a", 24*time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(leaf.Leaf.NotAfter).To(Equal(ca.Certificate().NotAfter))

		clk := clocktesting.NewFakeClock(ca.Certificate().NotAfter)
		_, err = ca.WithClock(clk).IssueNode("a", time.Hour)
		Expect(err).To(MatchError(ContainSubstring("expired")))
	})

	DescribeTable("NodeNameOf",
		func(cn string, want string, ok bool) {
			got, gotOK := operatorca.NodeNameOf(&x509.Certificate{Subject: pkix.Name{CommonName: cn}})
			Expect(gotOK).To(Equal(ok))
			Expect(got).To(Equal(want))
		},
		Entry("a node", "system:code-sandbox:node:worker-1.example", "worker-1.example", true),
		Entry("no node name", "system:code-sandbox:node:", "", false),
		Entry("not a node name", "system:code-sandbox:node:Worker_1", "", false),
		Entry("another prefix", "system:node:worker-1", "", false),
		Entry("the aggregated API server", operatorca.AggregatorCommonName, "", false),
	)

	Describe("SignCSR", func() {
		csrDER := func(tmpl *x509.CertificateRequest, key any) []byte {
			der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
			Expect(err).NotTo(HaveOccurred())
			return der
		}

		It("signs the request's key and names with the given usages, and nothing else from it", func() {
			ca := newCA(24 * time.Hour)
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			Expect(err).NotTo(HaveOccurred())
			der := csrDER(&x509.CertificateRequest{
				Subject:  pkix.Name{CommonName: operatorca.NodeCommonName("a"), Organization: []string{"system:masters"}},
				DNSNames: []string{"a.example"},
				URIs:     []*url.URL{{Scheme: "spiffe", Host: "x"}},
			}, key)
			certPEM, err := ca.SignCSR(der, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, time.Hour)
			Expect(err).NotTo(HaveOccurred())
			block, _ := pem.Decode(certPEM)
			Expect(block.Type).To(Equal("CERTIFICATE"))
			cert, err := x509.ParseCertificate(block.Bytes)
			Expect(err).NotTo(HaveOccurred())
			Expect(cert.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey)).To(BeTrue())
			Expect(cert.Subject.CommonName).To(Equal(operatorca.NodeCommonName("a")))
			Expect(cert.Subject.Organization).To(BeEmpty())
			Expect(cert.DNSNames).To(Equal([]string{"a.example"}))
			Expect(cert.URIs).To(BeEmpty())
			Expect(cert.IsCA).To(BeFalse())
			Expect(cert.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
			Expect(ca.Signed(cert)).To(BeTrue())
		})

		It("refuses a request with a broken signature or a weak key", func() {
			ca := newCA(24 * time.Hour)
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			Expect(err).NotTo(HaveOccurred())
			der := csrDER(&x509.CertificateRequest{Subject: pkix.Name{CommonName: "x"}}, key)
			der[len(der)-3] ^= 0xff
			_, err = ca.SignCSR(der, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, time.Hour)
			Expect(err).To(HaveOccurred())

			weak, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // the point of the test
			Expect(err).NotTo(HaveOccurred())
			_, err = ca.SignCSR(csrDER(&x509.CertificateRequest{Subject: pkix.Name{CommonName: "x"}}, weak),
				[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, time.Hour)
			Expect(err).To(MatchError(ContainSubstring("too short")))

			_, err = ca.SignCSR([]byte("garbage"), nil, time.Hour)
			Expect(err).To(HaveOccurred())
		})
	})
})

var _ = Describe("VerifyNode", func() {
	var ca *operatorca.CA
	BeforeEach(func() { ca = newCA(24 * time.Hour) })

	It("accepts the named node's certificate from the CA, on a real handshake", func() {
		cert, err := ca.IssueNode("node-a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		got, err := handshake(cert, fixedPool(ca.Pool()), "node-a")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(got)).To(Equal("Authorization: Bearer secret"))
	})

	refused := func(server func() *tls.Certificate, pool func() *x509.CertPool, node, want string) {
		GinkgoHelper()
		got, err := handshake(server(), pool, node)
		Expect(err).To(MatchError(ContainSubstring(want)))
		Expect(got).To(BeEmpty(), "the client must send nothing to a server it refused")
	}

	It("refuses another node's certificate", func() {
		refused(func() *tls.Certificate {
			c, err := ca.IssueNode("node-b", time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(ca.Pool()), "node-a", `names "system:code-sandbox:node:node-b"`)
	})

	It("refuses a self-signed impostor that names the node", func() {
		impostor, err := operatorca.NewCA(operatorca.NodeCommonName("node-a"), time.Hour, time.Now())
		Expect(err).NotTo(HaveOccurred())
		refused(func() *tls.Certificate { return keyPairOf(impostor) }, fixedPool(ca.Pool()), "node-a", "not from the operator CA")
	})

	It("refuses a self-signed end-entity certificate that names the node", func() {
		refused(func() *tls.Certificate {
			c, err := operatorca.SelfSigned(operatorca.NodeCommonName("node-a"), []string{"127.0.0.1"}, x509.ExtKeyUsageServerAuth, time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(ca.Pool()), "node-a", "not from the operator CA")
	})

	It("refuses a node certificate from another CA", func() {
		other := newCA(time.Hour)
		refused(func() *tls.Certificate {
			c, err := other.IssueNode("node-a", time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(ca.Pool()), "node-a", "not from the operator CA")
	})

	It("refuses a client-auth-only certificate that names the node", func() {
		refused(func() *tls.Certificate {
			c, err := ca.IssueClient(operatorca.NodeCommonName("node-a"), nil, time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(ca.Pool()), "node-a", "not from the operator CA")
	})

	It("refuses a serving certificate with the node's name only as a DNS name", func() {
		refused(func() *tls.Certificate {
			c, err := ca.IssueServing([]string{"node-a"}, time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(ca.Pool()), "node-a", `names "node-a"`)
	})

	It("refuses an expired chain: an expired CA, and an expired certificate from a valid CA", func() {
		past := time.Now().Add(-72 * time.Hour)
		oldCA, err := operatorca.NewCA("expired-ca", 48*time.Hour, past)
		Expect(err).NotTo(HaveOccurred())
		oldCA = oldCA.WithClock(clocktesting.NewFakeClock(past.Add(time.Hour)))
		refused(func() *tls.Certificate {
			c, err := oldCA.IssueNode("node-a", 2*time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(oldCA.Pool()), "node-a", "expired")

		refused(func() *tls.Certificate {
			c, err := ca.WithClock(clocktesting.NewFakeClock(time.Now().Add(-3*time.Hour))).IssueNode("node-a", time.Hour)
			Expect(err).NotTo(HaveOccurred())
			return c
		}, fixedPool(ca.Pool()), "node-a", "expired")
	})

	It("trusts no one without a bundle or without a node name", func() {
		cert, err := ca.IssueNode("node-a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		refused(func() *tls.Certificate { return cert }, fixedPool(nil), "node-a", "bundle is not loaded")
		refused(func() *tls.Certificate { return cert }, fixedPool(ca.Pool()), "", "not a node name")
	})

	It("asks for the pool on every handshake, so a rotated bundle takes effect at once", func() {
		next := newCA(24 * time.Hour)
		var current atomic.Pointer[x509.CertPool]
		current.Store(ca.Pool())
		pool := func() *x509.CertPool { return current.Load() }
		fromNext, err := next.IssueNode("node-a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		refused(func() *tls.Certificate { return fromNext }, pool, "node-a", "not from the operator CA")

		both := ca.Pool()
		both.AddCert(next.Certificate())
		current.Store(both)
		_, err = handshake(fromNext, pool, "node-a")
		Expect(err).NotTo(HaveOccurred())
	})
})
