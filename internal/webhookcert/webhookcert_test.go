/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package webhookcert_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookcert"
)

var secretSeq atomic.Int64

// uniqueName keeps the specs independent of each other in one API server.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, secretSeq.Add(1))
}

var defaultHosts = []string{"webhook-service.system.svc", "webhook-service.system.svc.cluster.local", "127.0.0.1"}

// newManager returns a Manager with its own Authority for the operator CA
// in ns (the default Secret and ConfigMap names), as a replica or a restart
// has. The Authority shares the Manager's clock.
func newManager(ns, secret string, hosts []string, certDir string, mutate ...func(*webhookcert.Options)) *webhookcert.Manager {
	GinkgoHelper()
	opts := webhookcert.Options{Namespace: ns, SecretName: secret, Hosts: hosts, CertDir: certDir}
	for _, m := range mutate {
		m(&opts)
	}
	m, err := webhookcert.New(cp.Client, newAuthority(ns, opts.Clock), opts)
	Expect(err).NotTo(HaveOccurred())
	return m
}

func newAuthority(ns string, clk clock.PassiveClock) *operatorca.Authority {
	GinkgoHelper()
	a, err := operatorca.NewAuthority(cp.Client, operatorca.AuthorityOptions{Namespace: ns, Clock: clk})
	Expect(err).NotTo(HaveOccurred())
	return a
}

// published is the operator CA bundle as the Authority published it.
func published(ns string) []byte {
	GinkgoHelper()
	cm := &corev1.ConfigMap{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: operatorca.DefaultBundleConfigMap}, cm)).To(Succeed())
	return []byte(cm.Data[operatorca.BundleKey])
}

// operatorCA is the CA certificate in the operator CA Secret of ns.
func operatorCA(ns string) []byte {
	GinkgoHelper()
	return getSecret(ns, operatorca.DefaultCASecret).Data[operatorca.BundleKey]
}

func parseBundle(b []byte) []*x509.Certificate {
	GinkgoHelper()
	certs, err := operatorca.ParseCertificates(b)
	Expect(err).NotTo(HaveOccurred())
	return certs
}

func getSecret(ns, name string) *corev1.Secret {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
	return s
}

func parseCert(pemBytes []byte) *x509.Certificate {
	GinkgoHelper()
	block, _ := pem.Decode(pemBytes)
	Expect(block).NotTo(BeNil(), "no PEM block in %q", pemBytes)
	Expect(block.Type).To(Equal("CERTIFICATE"))
	c, err := x509.ParseCertificate(block.Bytes)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// verifyServing checks that the serving certificate in data chains to its
// ca.crt for every host, for server authentication, at time at.
func verifyServing(data map[string][]byte, hosts []string, at time.Time) {
	GinkgoHelper()
	_, err := tls.X509KeyPair(data[webhookcert.KeyCert], data[webhookcert.KeyKey])
	Expect(err).NotTo(HaveOccurred(), "tls.crt and tls.key must be a pair")
	leaf := parseCert(data[webhookcert.KeyCert])
	ca := parseCert(data[webhookcert.KeyCACert])
	Expect(ca.IsCA).To(BeTrue())
	Expect(leaf.IsCA).To(BeFalse())
	Expect(leaf.ExtKeyUsage).To(ContainElement(x509.ExtKeyUsageServerAuth))
	Expect(leaf.NotAfter).To(BeTemporally("<=", ca.NotAfter), "the serving certificate must not outlive its CA")
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, h := range hosts {
		_, err := leaf.Verify(x509.VerifyOptions{
			DNSName: h, Roots: roots, CurrentTime: at,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		Expect(err).NotTo(HaveOccurred(), "certificate for host %s", h)
	}
}

func readFiles(dir string) map[string][]byte {
	GinkgoHelper()
	out := map[string][]byte{}
	for _, name := range []string{webhookcert.KeyCert, webhookcert.KeyKey} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		Expect(err).NotTo(HaveOccurred())
		out[name] = b
	}
	return out
}

func expectFilesMatch(dir string, secret *corev1.Secret) {
	GinkgoHelper()
	files := readFiles(dir)
	Expect(files[webhookcert.KeyCert]).To(Equal(secret.Data[webhookcert.KeyCert]))
	Expect(files[webhookcert.KeyKey]).To(Equal(secret.Data[webhookcert.KeyKey]))
}

// inertWebhookConfiguration has two webhooks that can never be called: they
// select no namespace (and no object) and match only a group that does not
// exist.
func inertWebhookConfiguration(name string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	never := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "code-sandbox.dev/never-matches", Operator: metav1.LabelSelectorOpExists,
	}}}
	hook := func(n string) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{
			Name:                    n,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/" + n)},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			NamespaceSelector:       never,
			ObjectSelector:          never,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"nothing.webhookcert.test"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"},
				},
			}},
		}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{hook("one.webhookcert.test"), hook("two.webhookcert.test")},
	}
}

func createWebhookConfiguration(name string) {
	GinkgoHelper()
	cfg := inertWebhookConfiguration(name)
	Expect(cp.Client.Create(context.Background(), cfg)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(cp.Client.Delete(context.Background(), cfg))).To(Succeed())
	})
}

func caBundles(name string) [][]byte {
	GinkgoHelper()
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, cfg)).To(Succeed())
	out := [][]byte{}
	for _, w := range cfg.Webhooks {
		out = append(out, w.ClientConfig.CABundle)
	}
	return out
}

func wipeCABundles(name string) {
	GinkgoHelper()
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, cfg)).To(Succeed())
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig.CABundle = nil
	}
	Expect(cp.Client.Update(context.Background(), cfg)).To(Succeed())
	Expect(caBundles(name)).To(Equal([][]byte{nil, nil}))
}

var _ = Describe("webhook certificate", func() {
	var ns string
	ctx := context.Background()

	BeforeEach(func() {
		ns = cp.NewNamespace("webhookcert-")
	})

	Describe("New", func() {
		valid := webhookcert.Options{Namespace: "ns", SecretName: "s", Hosts: []string{"h"}, CertDir: "/tmp/x"}
		It("needs an operator CA", func() {
			m, err := webhookcert.New(cp.Client, nil, valid)
			Expect(err).To(MatchError("webhook certificate: no operator CA to issue it"))
			Expect(m).To(BeNil())
		})
		DescribeTable("rejects incomplete options with a clear error",
			func(mutate func(*webhookcert.Options), want string) {
				opts := valid
				mutate(&opts)
				m, err := webhookcert.New(cp.Client, newAuthority("ns", nil), opts)
				Expect(err).To(MatchError(want))
				Expect(m).To(BeNil())
			},
			Entry("namespace", func(o *webhookcert.Options) { o.Namespace = "" },
				"webhook certificate: the namespace is not set (--webhook-namespace or POD_NAMESPACE)"),
			Entry("secret", func(o *webhookcert.Options) { o.SecretName = "" },
				"webhook certificate: --webhook-cert-secret is empty"),
			Entry("hosts nil", func(o *webhookcert.Options) { o.Hosts = nil },
				"webhook certificate: no host names (--webhook-service or --webhook-cert-hosts)"),
			Entry("hosts empty", func(o *webhookcert.Options) { o.Hosts = []string{} },
				"webhook certificate: no host names (--webhook-service or --webhook-cert-hosts)"),
			Entry("cert dir", func(o *webhookcert.Options) { o.CertDir = "" },
				"webhook certificate: no directory to write it to"),
		)

		It("accepts complete options, defaults the clock and needs no leader election", func() {
			m, err := webhookcert.New(cp.Client, newAuthority("ns", nil), valid)
			Expect(err).NotTo(HaveOccurred())
			Expect(m.NeedLeaderElection()).To(BeFalse())
		})
	})

	Describe("Prepare", func() {
		It("creates a TLS Secret and writes a certificate that verifies for every host", func() {
			secretName := uniqueName("cert")
			dir := filepath.Join(GinkgoT().TempDir(), "not", "yet", "there")
			m := newManager(ns, secretName, defaultHosts, dir)

			caPEM, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())

			secret := getSecret(ns, secretName)
			Expect(secret.Type).To(Equal(corev1.SecretTypeTLS))
			Expect(secret.Data).To(HaveLen(3), "no CA key: the operator CA Secret alone holds it")
			Expect(secret.Data).To(HaveKey(webhookcert.KeyCACert))
			Expect(secret.Data).To(HaveKey(webhookcert.KeyCert))
			Expect(secret.Data).To(HaveKey(webhookcert.KeyKey))
			// Issued by the operator CA, and the bundle it returns is the
			// published one, which holds that CA.
			Expect(secret.Data[webhookcert.KeyCACert]).To(Equal(operatorCA(ns)))
			Expect(caPEM).To(Equal(published(ns)))
			Expect(caPEM).To(Equal(secret.Data[webhookcert.KeyCACert]))

			verifyServing(secret.Data, defaultHosts, time.Now())

			leaf := parseCert(secret.Data[webhookcert.KeyCert])
			Expect(leaf.DNSNames).To(ConsistOf("webhook-service.system.svc", "webhook-service.system.svc.cluster.local"))
			Expect(leaf.IPAddresses).To(HaveLen(1))
			Expect(leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1"))).To(BeTrue())
			Expect(leaf.NotAfter).To(BeTemporally(">", time.Now().Add(300*24*time.Hour)))

			// A host it was not issued for does not verify.
			roots := x509.NewCertPool()
			roots.AddCert(parseCert(caPEM))
			for _, other := range []string{"evil.example.com", "127.0.0.2", "svc"} {
				_, err := leaf.Verify(x509.VerifyOptions{DNSName: other, Roots: roots})
				Expect(err).To(HaveOccurred(), "host %s", other)
			}

			// Files: the pair, mode 0600, equal to the Secret.
			expectFilesMatch(dir, secret)
			for _, name := range []string{webhookcert.KeyCert, webhookcert.KeyKey} {
				st, err := os.Stat(filepath.Join(dir, name))
				Expect(err).NotTo(HaveOccurred())
				Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o600)), name)
				_, err = os.Stat(filepath.Join(dir, name+".tmp"))
				Expect(os.IsNotExist(err)).To(BeTrue(), "temporary file %s.tmp left behind", name)
			}
		})

		It("serves TLS that a client trusting only ca.crt accepts for the IP and DNS names", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			caPEM, err := newManager(ns, secretName, defaultHosts, dir).Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())

			pair, err := tls.LoadX509KeyPair(filepath.Join(dir, webhookcert.KeyCert), filepath.Join(dir, webhookcert.KeyKey))
			Expect(err).NotTo(HaveOccurred())
			ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
			Expect(err).NotTo(HaveOccurred())
			defer ln.Close()
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer conn.Close()
						_, _ = io.WriteString(conn, "ok")
					}()
				}
			}()

			roots := x509.NewCertPool()
			Expect(roots.AppendCertsFromPEM(caPEM)).To(BeTrue())
			for _, serverName := range []string{"127.0.0.1", "webhook-service.system.svc"} {
				conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12})
				Expect(err).NotTo(HaveOccurred(), "server name %s", serverName)
				b, err := io.ReadAll(conn)
				Expect(err).NotTo(HaveOccurred())
				Expect(string(b)).To(Equal("ok"))
				conn.Close()
			}
			_, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "other.example.com", MinVersion: tls.VersionTLS12})
			Expect(err).To(HaveOccurred())
			_, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
			Expect(err).To(HaveOccurred(), "a client that does not trust the CA must refuse")
		})

		It("lets replicas racing on a new Secret agree on one certificate", func() {
			const rounds, replicas = 15, 3
			for round := 0; round < rounds; round++ {
				secretName := uniqueName("race")
				dirs := make([]string, replicas)
				managers := make([]*webhookcert.Manager, replicas)
				for i := range managers {
					dirs[i] = GinkgoT().TempDir()
					managers[i] = newManager(ns, secretName, defaultHosts, dirs[i])
				}
				cas := make([][]byte, replicas)
				errs := make([]error, replicas)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range managers {
					wg.Add(1)
					go func() {
						defer GinkgoRecover()
						defer wg.Done()
						<-start
						cas[i], errs[i] = managers[i].Prepare(ctx)
					}()
				}
				close(start)
				wg.Wait()

				secret := getSecret(ns, secretName)
				verifyServing(secret.Data, defaultHosts, time.Now())
				for i := range managers {
					Expect(errs[i]).NotTo(HaveOccurred(), "round %d replica %d", round, i)
					Expect(cas[i]).To(Equal(secret.Data[webhookcert.KeyCACert]), "round %d replica %d", round, i)
					expectFilesMatch(dirs[i], secret)
				}
			}
		})

		It("lets replicas racing to repair a broken Secret agree on one certificate", func() {
			const rounds, replicas = 10, 3
			for round := 0; round < rounds; round++ {
				secretName := uniqueName("race-repair")
				Expect(cp.Client.Create(ctx, &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName},
					Type:       corev1.SecretTypeTLS,
					Data:       map[string][]byte{"tls.crt": []byte("junk"), "tls.key": []byte("junk")},
				})).To(Succeed())
				dirs := make([]string, replicas)
				errs := make([]error, replicas)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range dirs {
					dirs[i] = GinkgoT().TempDir()
					m := newManager(ns, secretName, defaultHosts, dirs[i])
					wg.Add(1)
					go func() {
						defer GinkgoRecover()
						defer wg.Done()
						<-start
						_, errs[i] = m.Prepare(ctx)
					}()
				}
				close(start)
				wg.Wait()
				secret := getSecret(ns, secretName)
				verifyServing(secret.Data, defaultHosts, time.Now())
				for i := range dirs {
					Expect(errs[i]).NotTo(HaveOccurred(), "round %d replica %d", round, i)
					expectFilesMatch(dirs[i], secret)
				}
			}
		})

		It("leaves a good Secret and its files alone", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			m := newManager(ns, secretName, defaultHosts, dir)
			_, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			before := getSecret(ns, secretName)
			statBefore, err := os.Stat(filepath.Join(dir, webhookcert.KeyCert))
			Expect(err).NotTo(HaveOccurred())

			// Same hosts in another order, from a fresh Manager (a restart).
			again := newManager(ns, secretName, []string{defaultHosts[2], defaultHosts[0], defaultHosts[1]}, dir)
			for i := 0; i < 3; i++ {
				caPEM, err := again.Prepare(ctx)
				Expect(err).NotTo(HaveOccurred())
				Expect(caPEM).To(Equal(before.Data[webhookcert.KeyCACert]))
			}
			after := getSecret(ns, secretName)
			Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
			Expect(after.Data).To(Equal(before.Data))
			statAfter, err := os.Stat(filepath.Join(dir, webhookcert.KeyCert))
			Expect(err).NotTo(HaveOccurred())
			Expect(os.SameFile(statBefore, statAfter)).To(BeTrue(), "an unchanged certificate must not be rewritten")
		})

		It("keeps a certificate that covers more hosts than asked for", func() {
			secretName := uniqueName("cert")
			_, err := newManager(ns, secretName, defaultHosts, GinkgoT().TempDir()).Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			before := getSecret(ns, secretName)
			_, err = newManager(ns, secretName, defaultHosts[:1], GinkgoT().TempDir()).Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(getSecret(ns, secretName).ResourceVersion).To(Equal(before.ResourceVersion))
		})

		It("re-issues the serving certificate, keeping the CA, when a host is added", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			_, err := newManager(ns, secretName, defaultHosts, dir).Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			before := getSecret(ns, secretName)

			more := append(append([]string{}, defaultHosts...), "webhook.example.test", "::1")
			caPEM, err := newManager(ns, secretName, more, dir).Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			after := getSecret(ns, secretName)
			Expect(after.UID).To(Equal(before.UID))
			Expect(after.ResourceVersion).NotTo(Equal(before.ResourceVersion))
			Expect(after.Data[webhookcert.KeyCACert]).To(Equal(before.Data[webhookcert.KeyCACert]))
			Expect(after.Data[webhookcert.KeyCert]).NotTo(Equal(before.Data[webhookcert.KeyCert]))
			Expect(after.Data[webhookcert.KeyKey]).NotTo(Equal(before.Data[webhookcert.KeyKey]))
			Expect(caPEM).To(Equal(before.Data[webhookcert.KeyCACert]))
			verifyServing(after.Data, more, time.Now())
			expectFilesMatch(dir, after)
		})

		It("renews the serving certificate within 90 days of its expiry, and not before", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			clk := clocktesting.NewFakeClock(time.Now())
			m := newManager(ns, secretName, defaultHosts, dir, func(o *webhookcert.Options) { o.Clock = clk })
			_, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			first := getSecret(ns, secretName)
			leaf := parseCert(first.Data[webhookcert.KeyCert])

			clk.SetTime(leaf.NotAfter.Add(-91 * 24 * time.Hour))
			_, err = m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(getSecret(ns, secretName).ResourceVersion).To(Equal(first.ResourceVersion), "91 days left is long enough")

			clk.SetTime(leaf.NotAfter.Add(-89 * 24 * time.Hour))
			_, err = m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			renewed := getSecret(ns, secretName)
			Expect(renewed.Data[webhookcert.KeyCert]).NotTo(Equal(first.Data[webhookcert.KeyCert]))
			Expect(renewed.Data[webhookcert.KeyCACert]).To(Equal(first.Data[webhookcert.KeyCACert]), "the CA still has years left")
			newLeaf := parseCert(renewed.Data[webhookcert.KeyCert])
			Expect(newLeaf.NotAfter).To(BeTemporally("~", clk.Now().Add(365*24*time.Hour), 2*time.Second))
			verifyServing(renewed.Data, defaultHosts, clk.Now())
			expectFilesMatch(dir, renewed)

			// Renewed once: asking again at the same time changes nothing.
			_, err = m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(getSecret(ns, secretName).ResourceVersion).To(Equal(renewed.ResourceVersion))
		})

		It("re-issues from the new operator CA when the CA is rotated a year before its expiry", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			clk := clocktesting.NewFakeClock(time.Now())
			m := newManager(ns, secretName, defaultHosts, dir, func(o *webhookcert.Options) { o.Clock = clk })
			_, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			first := getSecret(ns, secretName)
			oldCA := parseCert(first.Data[webhookcert.KeyCACert])
			Expect(oldCA.NotAfter).To(BeTemporally(">", time.Now().Add(9*365*24*time.Hour)))

			// 364 days left: the Authority rotates; the serving certificate
			// (expired long ago) comes from the new CA, and the bundle holds
			// both CAs until the old one expires.
			clk.SetTime(oldCA.NotAfter.Add(-364 * 24 * time.Hour))
			bundle, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			renewed := getSecret(ns, secretName)
			Expect(renewed.Data[webhookcert.KeyCACert]).NotTo(Equal(first.Data[webhookcert.KeyCACert]))
			Expect(renewed.Data[webhookcert.KeyCACert]).To(Equal(operatorCA(ns)))
			newCA := parseCert(renewed.Data[webhookcert.KeyCACert])
			Expect(newCA.NotAfter).To(BeTemporally(">", clk.Now().Add(9*365*24*time.Hour)))
			Expect(bundle).To(Equal(published(ns)))
			Expect(parseBundle(bundle)).To(HaveExactElements(oldCA, newCA))
			verifyServing(renewed.Data, defaultHosts, clk.Now())
			expectFilesMatch(dir, renewed)
		})

		It("keeps a certificate from a rotated-out CA that is still in the bundle until its own renewal, and never outlives its CA", func() {
			secretName := uniqueName("cert")
			clk := clocktesting.NewFakeClock(time.Now())
			m := newManager(ns, secretName, defaultHosts, GinkgoT().TempDir(), func(o *webhookcert.Options) { o.Clock = clk })
			_, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			oldCA := parseCert(getSecret(ns, secretName).Data[webhookcert.KeyCACert])

			// The CA has 366 days left and the serving certificate expired
			// long ago: a one-year certificate still fits in the CA.
			clk.SetTime(oldCA.NotAfter.Add(-366 * 24 * time.Hour))
			_, err = m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			issued := getSecret(ns, secretName)
			Expect(parseCert(issued.Data[webhookcert.KeyCACert]).Equal(oldCA)).To(BeTrue(), "the CA is not rotated yet")
			leaf := parseCert(issued.Data[webhookcert.KeyCert])
			Expect(leaf.NotAfter).To(BeTemporally("<=", oldCA.NotAfter))

			// Two days on the CA is rotated, but the certificate chains to
			// the bundle and has almost a year left: it is kept.
			clk.Step(2 * 24 * time.Hour)
			bundle, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(parseBundle(bundle)).To(HaveLen(2))
			Expect(operatorCA(ns)).NotTo(Equal(issued.Data[webhookcert.KeyCACert]))
			Expect(getSecret(ns, secretName).ResourceVersion).To(Equal(issued.ResourceVersion))

			// At its renewal it moves to the new CA.
			clk.SetTime(leaf.NotAfter.Add(-89 * 24 * time.Hour))
			_, err = m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			renewed := getSecret(ns, secretName)
			Expect(renewed.Data[webhookcert.KeyCACert]).To(Equal(operatorCA(ns)))
			verifyServing(renewed.Data, defaultHosts, clk.Now())
		})

		It("replaces the certificate at once when its CA is no longer in the bundle (a revoked CA)", func() {
			secretName := uniqueName("cert")
			m := newManager(ns, secretName, defaultHosts, GinkgoT().TempDir())
			_, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			before := getSecret(ns, secretName)

			// What an administrator does to revoke the CA.
			Expect(cp.Client.Delete(ctx, getSecret(ns, operatorca.DefaultCASecret))).To(Succeed())
			Expect(cp.Client.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: operatorca.DefaultBundleConfigMap}})).To(Succeed())

			bundle, err := m.Prepare(ctx)
			Expect(err).NotTo(HaveOccurred())
			after := getSecret(ns, secretName)
			Expect(parseBundle(bundle)).To(HaveLen(1))
			Expect(after.Data[webhookcert.KeyCACert]).To(Equal(bundle))
			Expect(after.Data[webhookcert.KeyCACert]).NotTo(Equal(before.Data[webhookcert.KeyCACert]))
			verifyServing(after.Data, defaultHosts, time.Now())
		})

		DescribeTable("repairs a Secret that holds no usable certificate",
			func(corrupt func(good map[string][]byte) map[string][]byte) {
				// A good pair from another Secret, to build corruptions from.
				donor := uniqueName("donor")
				_, err := newManager(ns, donor, defaultHosts, GinkgoT().TempDir()).Prepare(ctx)
				Expect(err).NotTo(HaveOccurred())
				good := getSecret(ns, donor).Data

				secretName := uniqueName("broken")
				Expect(cp.Client.Create(ctx, &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName},
					Type:       corev1.SecretTypeTLS,
					Data:       corrupt(good),
				})).To(Succeed())
				created := getSecret(ns, secretName)

				dir := GinkgoT().TempDir()
				caPEM, err := newManager(ns, secretName, defaultHosts, dir).Prepare(ctx)
				Expect(err).NotTo(HaveOccurred())
				repaired := getSecret(ns, secretName)
				Expect(repaired.UID).To(Equal(created.UID), "repaired in place")
				Expect(repaired.ResourceVersion).NotTo(Equal(created.ResourceVersion))
				Expect(caPEM).To(Equal(repaired.Data[webhookcert.KeyCACert]))
				Expect(repaired.Data).To(HaveLen(3), "nothing else is kept, no old CA key in particular")
				verifyServing(repaired.Data, defaultHosts, time.Now())
				expectFilesMatch(dir, repaired)
			},
			Entry("garbage everywhere", func(map[string][]byte) map[string][]byte {
				return map[string][]byte{
					webhookcert.KeyCACert: []byte("garbage"), "ca.key": []byte("garbage"),
					webhookcert.KeyCert: []byte("garbage"), webhookcert.KeyKey: []byte("garbage"),
				}
			}),
			Entry("empty values", func(map[string][]byte) map[string][]byte {
				return map[string][]byte{webhookcert.KeyCert: {}, webhookcert.KeyKey: {}}
			}),
			Entry("a PEM block that is not a certificate", func(good map[string][]byte) map[string][]byte {
				out := clone(good)
				out[webhookcert.KeyCACert] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
				return out
			}),
			Entry("a serving key that does not match the certificate", func(good map[string][]byte) map[string][]byte {
				out := clone(good)
				_, _, out[webhookcert.KeyKey] = foreignServing()
				return out
			}),
			Entry("a serving certificate from a CA outside the bundle", func(good map[string][]byte) map[string][]byte {
				out := clone(good)
				out[webhookcert.KeyCACert], out[webhookcert.KeyCert], out[webhookcert.KeyKey] = foreignServing()
				return out
			}),
			Entry("a ca.crt that did not issue the serving certificate", func(good map[string][]byte) map[string][]byte {
				out := clone(good)
				out[webhookcert.KeyCACert], _, _ = foreignServing()
				return out
			}),
			Entry("the serving certificate used as the CA", func(good map[string][]byte) map[string][]byte {
				out := clone(good)
				out[webhookcert.KeyCACert] = good[webhookcert.KeyCert]
				return out
			}),
			Entry("the format before the operator CA: the Secret's own CA and its key", func(map[string][]byte) map[string][]byte {
				out := map[string][]byte{}
				out[webhookcert.KeyCACert], out[webhookcert.KeyCert], out[webhookcert.KeyKey] = foreignServing()
				out["ca.key"] = []byte("-----BEGIN EC PRIVATE KEY-----\n...\n-----END EC PRIVATE KEY-----\n")
				return out
			}),
		)

		It("fails clearly when the namespace does not exist", func() {
			_, err := newManager("no-such-namespace", uniqueName("cert"), defaultHosts, GinkgoT().TempDir()).Prepare(ctx)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring("creating Secret no-such-namespace/"))
			Expect(apierrors.IsNotFound(err)).To(BeTrue())
		})

		It("fails clearly when the certificate directory cannot be created", func() {
			file := filepath.Join(GinkgoT().TempDir(), "a-file")
			Expect(os.WriteFile(file, nil, 0o600)).To(Succeed())
			_, err := newManager(ns, uniqueName("cert"), defaultHosts, filepath.Join(file, "sub")).Prepare(ctx)
			Expect(err).To(MatchError(ContainSubstring("webhook certificate directory")))
		})
	})

	Describe("Ensure", func() {
		It("injects the CA into every webhook and restores it after it is wiped", func() {
			cfgName := uniqueName("webhookcert-test")
			createWebhookConfiguration(cfgName)
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			m := newManager(ns, secretName, defaultHosts, dir, func(o *webhookcert.Options) { o.WebhookConfiguration = cfgName })

			Expect(m.Ensure(ctx)).To(Succeed())
			caPEM := getSecret(ns, secretName).Data[webhookcert.KeyCACert]
			Expect(caPEM).NotTo(BeEmpty())
			Expect(caBundles(cfgName)).To(Equal([][]byte{caPEM, caPEM}))
			expectFilesMatch(dir, getSecret(ns, secretName))

			// Nothing to do: the configuration is not written again.
			cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			Expect(cp.Client.Get(ctx, client.ObjectKey{Name: cfgName}, cfg)).To(Succeed())
			rv := cfg.ResourceVersion
			Expect(m.Ensure(ctx)).To(Succeed())
			Expect(cp.Client.Get(ctx, client.ObjectKey{Name: cfgName}, cfg)).To(Succeed())
			Expect(cfg.ResourceVersion).To(Equal(rv))

			wipeCABundles(cfgName)
			Expect(m.Ensure(ctx)).To(Succeed())
			Expect(caBundles(cfgName)).To(Equal([][]byte{caPEM, caPEM}))

			// Only one webhook wrong: it is fixed, the other kept.
			Expect(cp.Client.Get(ctx, client.ObjectKey{Name: cfgName}, cfg)).To(Succeed())
			cfg.Webhooks[1].ClientConfig.CABundle = []byte("stale")
			Expect(cp.Client.Update(ctx, cfg)).To(Succeed())
			Expect(m.Ensure(ctx)).To(Succeed())
			Expect(caBundles(cfgName)).To(Equal([][]byte{caPEM, caPEM}))
		})

		It("injects both CAs while a rotated CA overlaps the new one, then only the new one", func() {
			cfgName := uniqueName("webhookcert-test")
			createWebhookConfiguration(cfgName)
			secretName := uniqueName("cert")
			clk := clocktesting.NewFakeClock(time.Now())
			m := newManager(ns, secretName, defaultHosts, GinkgoT().TempDir(), func(o *webhookcert.Options) {
				o.WebhookConfiguration = cfgName
				o.Clock = clk
			})
			Expect(m.Ensure(ctx)).To(Succeed())
			oldCA := getSecret(ns, secretName).Data[webhookcert.KeyCACert]
			Expect(caBundles(cfgName)).To(Equal([][]byte{oldCA, oldCA}))

			clk.SetTime(parseCert(oldCA).NotAfter.Add(-time.Hour))
			Expect(m.Ensure(ctx)).To(Succeed())
			newCA := getSecret(ns, secretName).Data[webhookcert.KeyCACert]
			Expect(newCA).NotTo(Equal(oldCA))
			both := append(append([]byte{}, oldCA...), newCA...)
			Expect(published(ns)).To(Equal(both))
			Expect(caBundles(cfgName)).To(Equal([][]byte{both, both}))

			clk.Step(2 * time.Hour)
			Expect(m.Ensure(ctx)).To(Succeed())
			Expect(published(ns)).To(Equal(newCA))
			Expect(caBundles(cfgName)).To(Equal([][]byte{newCA, newCA}))
		})

		It("injects the CA bundle into the named APIService and restores it after it is wiped", func() {
			name := createAPIService(ns)
			secretName := uniqueName("cert")
			m := newManager(ns, secretName, defaultHosts, GinkgoT().TempDir(), func(o *webhookcert.Options) { o.APIService = name })
			Expect(m.Ensure(ctx)).To(Succeed())
			bundle := published(ns)
			Expect(apiServiceCABundle(name)).To(Equal(bundle))
			rv := getAPIService(name).GetResourceVersion()
			Expect(m.Ensure(ctx)).To(Succeed())
			Expect(getAPIService(name).GetResourceVersion()).To(Equal(rv), "nothing to do: not written again")

			svc := getAPIService(name)
			Expect(unstructured.SetNestedField(svc.Object, base64.StdEncoding.EncodeToString([]byte("stale")), "spec", "caBundle")).To(Succeed())
			Expect(cp.Client.Update(ctx, svc)).To(Succeed())
			Expect(apiServiceCABundle(name)).To(Equal([]byte("stale")))
			Expect(m.Ensure(ctx)).To(Succeed())
			Expect(apiServiceCABundle(name)).To(Equal(bundle))
		})

		It("names the APIService when it does not exist", func() {
			m := newManager(ns, uniqueName("cert"), defaultHosts, GinkgoT().TempDir(), func(o *webhookcert.Options) { o.APIService = "v1.absent.webhookcert.test" })
			err := m.Ensure(ctx)
			Expect(err).To(MatchError(ContainSubstring("APIService v1.absent.webhookcert.test")))
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the cause is kept: %v", err)
		})

		It("names the webhook configuration when it does not exist, after preparing the certificate", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			m := newManager(ns, secretName, defaultHosts, dir, func(o *webhookcert.Options) { o.WebhookConfiguration = "no-such-webhook-configuration" })
			err := m.Ensure(ctx)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring("ValidatingWebhookConfiguration no-such-webhook-configuration"))
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the cause is kept: %v", err)
			// The certificate itself is ready: the server can still start.
			expectFilesMatch(dir, getSecret(ns, secretName))
		})

		It("only prepares the certificate when no webhook configuration is named", func() {
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			Expect(newManager(ns, secretName, defaultHosts, dir).Ensure(ctx)).To(Succeed())
			expectFilesMatch(dir, getSecret(ns, secretName))
		})
	})

	Describe("Start", func() {
		It("retries after an error, injects once the configuration appears, and stops with its context", func() {
			cfgName := uniqueName("webhookcert-test")
			secretName := uniqueName("cert")
			dir := GinkgoT().TempDir()
			m := newManager(ns, secretName, defaultHosts, dir, func(o *webhookcert.Options) { o.WebhookConfiguration = cfgName })

			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				defer GinkgoRecover()
				done <- m.Start(runCtx)
			}()

			// The first pass prepares the certificate and fails to inject.
			Eventually(func() error {
				_, err := os.Stat(filepath.Join(dir, webhookcert.KeyCert))
				return err
			}).WithTimeout(10 * time.Second).Should(Succeed())

			createWebhookConfiguration(cfgName)
			Expect(caBundles(cfgName)).To(Equal([][]byte{nil, nil}))
			caPEM := getSecret(ns, secretName).Data[webhookcert.KeyCACert]
			// The retry after an error comes within 5s.
			Eventually(func() [][]byte { return caBundles(cfgName) }).
				WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).
				Should(Equal([][]byte{caPEM, caPEM}))
			Consistently(done).WithTimeout(500 * time.Millisecond).ShouldNot(Receive())

			cancel()
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(BeNil()))
		})

		It("returns at once with a cancelled context", func() {
			m := newManager(ns, uniqueName("cert"), defaultHosts, GinkgoT().TempDir(), func(o *webhookcert.Options) { o.WebhookConfiguration = "absent" })
			runCtx, cancel := context.WithCancel(ctx)
			cancel()
			done := make(chan error, 1)
			go func() { done <- m.Start(runCtx) }()
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(BeNil()))
		})
	})
})

// createAPIService registers an APIService for a group nothing uses,
// backed by a Service that does not exist: it is never called.
func createAPIService(ns string) string {
	GinkgoHelper()
	version := fmt.Sprintf("v%d", secretSeq.Add(1))
	svc := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"group": "nothing.webhookcert.test", "version": version,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": ns, "name": "nothing", "port": int64(443)},
		},
	}}
	svc.SetGroupVersionKind(webhookcert.APIServiceGVK)
	svc.SetName(version + ".nothing.webhookcert.test")
	Expect(cp.Client.Create(context.Background(), svc)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(cp.Client.Delete(context.Background(), svc))).To(Succeed())
	})
	return svc.GetName()
}

func getAPIService(name string) *unstructured.Unstructured {
	GinkgoHelper()
	svc := &unstructured.Unstructured{}
	svc.SetGroupVersionKind(webhookcert.APIServiceGVK)
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, svc)).To(Succeed())
	return svc
}

func apiServiceCABundle(name string) []byte {
	GinkgoHelper()
	s, _, err := unstructured.NestedString(getAPIService(name).Object, "spec", "caBundle")
	Expect(err).NotTo(HaveOccurred())
	b, err := base64.StdEncoding.DecodeString(s)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// foreignServing is a serving certificate for defaultHosts from a CA that
// is not the operator's, PEM-encoded with that CA.
func foreignServing() (caPEM, certPEM, keyPEM []byte) {
	GinkgoHelper()
	ca, err := operatorca.NewCA("not-the-operator-ca", 2*365*24*time.Hour, time.Now())
	Expect(err).NotTo(HaveOccurred())
	pair, err := ca.IssueServing(defaultHosts, 365*24*time.Hour)
	Expect(err).NotTo(HaveOccurred())
	certPEM, keyPEM, err = operatorca.EncodeKeyPair(pair)
	Expect(err).NotTo(HaveOccurred())
	return ca.CertPEM(), certPEM, keyPEM
}

func clone(m map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = append([]byte(nil), v...)
	}
	return out
}
