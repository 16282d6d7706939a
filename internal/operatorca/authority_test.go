/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca_test

import (
	"context"
	"crypto/x509"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

func newAuthority(c client.Client, ns string, clk clock.PassiveClock) *operatorca.Authority {
	GinkgoHelper()
	a, err := operatorca.NewAuthority(c, operatorca.AuthorityOptions{Namespace: ns, Clock: clk})
	Expect(err).NotTo(HaveOccurred())
	return a
}

func caSecret(ns string) *corev1.Secret {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: operatorca.DefaultCASecret}, s)).To(Succeed())
	return s
}

func bundleConfigMap(ns string) *corev1.ConfigMap {
	GinkgoHelper()
	cm := &corev1.ConfigMap{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: operatorca.DefaultBundleConfigMap}, cm)).To(Succeed())
	return cm
}

func bundleCerts(ns string) []*x509.Certificate {
	GinkgoHelper()
	certs, err := operatorca.ParseCertificates([]byte(bundleConfigMap(ns).Data[operatorca.BundleKey]))
	Expect(err).NotTo(HaveOccurred())
	return certs
}

func verifies(pool *x509.CertPool, cert *x509.Certificate, at time.Time, usage x509.ExtKeyUsage) error {
	_, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

var _ = Describe("Authority", func() {
	ctx := context.Background()
	var ns string
	BeforeEach(func() { ns = cp.NewNamespace("operatorca-") })

	It("checks its options and defaults the names", func() {
		_, err := operatorca.NewAuthority(cp.Client, operatorca.AuthorityOptions{})
		Expect(err).To(MatchError(ContainSubstring("namespace")))
		_, err = operatorca.NewAuthority(nil, operatorca.AuthorityOptions{Namespace: ns})
		Expect(err).To(HaveOccurred())
		a := newAuthority(cp.Client, ns, nil)
		Expect(a.NeedLeaderElection()).To(BeFalse())
		Expect(a.Current()).To(BeNil(), "nothing before Ensure")
		Expect(a.Pool()).To(BeNil())
		_, err = a.ClientCertificate(operatorca.AggregatorCommonName)(nil)
		Expect(err).To(MatchError(ContainSubstring("not loaded")))
	})

	It("creates the CA Secret and publishes its certificate, and leaves both alone after", func() {
		a := newAuthority(cp.Client, ns, nil)
		Expect(a.Ensure(ctx)).To(Succeed())
		secret := caSecret(ns)
		Expect(secret.Data).To(HaveKey("ca.crt"))
		Expect(secret.Data).To(HaveKey("ca.key"))
		Expect(secret.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "code-sandbox-operator"))
		Expect(a.Current().CertPEM()).To(Equal(secret.Data["ca.crt"]))
		Expect(a.Current().Certificate().NotAfter).To(BeTemporally(">", time.Now().Add(9*365*24*time.Hour)))
		cm := bundleConfigMap(ns)
		Expect(cm.Data).To(Equal(map[string]string{"ca.crt": string(secret.Data["ca.crt"])}))
		Expect(a.BundlePEM()).To(Equal(secret.Data["ca.crt"]))

		leaf, err := a.Current().IssueNode("a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		Expect(verifies(a.Pool(), leaf.Leaf, time.Now(), x509.ExtKeyUsageServerAuth)).To(Succeed())

		// A restart adopts it.
		again := newAuthority(cp.Client, ns, nil)
		for range 3 {
			Expect(again.Ensure(ctx)).To(Succeed())
		}
		Expect(again.Current().Certificate().Equal(a.Current().Certificate())).To(BeTrue())
		Expect(caSecret(ns).ResourceVersion).To(Equal(secret.ResourceVersion))
		Expect(bundleConfigMap(ns).ResourceVersion).To(Equal(cm.ResourceVersion))
	})

	It("lets replicas racing on one Secret agree on one CA and one bundle", func() {
		const rounds, replicas = 10, 3
		for round := range rounds {
			roundNS := ns
			if round > 0 {
				roundNS = cp.NewNamespace("operatorca-race-")
			}
			authorities := make([]*operatorca.Authority, replicas)
			errs := make([]error, replicas)
			for i := range authorities {
				authorities[i] = newAuthority(cp.Client, roundNS, nil)
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range authorities {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					<-start
					errs[i] = authorities[i].Ensure(ctx)
				}()
			}
			close(start)
			wg.Wait()
			secret := caSecret(roundNS)
			for i, a := range authorities {
				Expect(errs[i]).NotTo(HaveOccurred(), "round %d replica %d", round, i)
				Expect(a.Current().CertPEM()).To(Equal(secret.Data["ca.crt"]), "round %d replica %d", round, i)
				Expect(a.BundlePEM()).To(Equal(secret.Data["ca.crt"]), "round %d replica %d", round, i)
			}
			Expect(bundleConfigMap(roundNS).Data["ca.crt"]).To(Equal(string(secret.Data["ca.crt"])), "round %d: only the winner's CA is published", round)
		}
	})

	It("rotates the CA a year before it expires, keeping the old one in the bundle until it expires", func() {
		clk := clocktesting.NewFakeClock(time.Now())
		a := newAuthority(cp.Client, ns, clk)
		Expect(a.Ensure(ctx)).To(Succeed())
		oldCA := a.Current().Certificate()
		oldLeaf, err := a.Current().IssueNode("a", 400*24*time.Hour)
		Expect(err).NotTo(HaveOccurred())

		// 366 days left: kept.
		clk.SetTime(oldCA.NotAfter.Add(-366 * 24 * time.Hour))
		Expect(a.Ensure(ctx)).To(Succeed())
		Expect(a.Current().Certificate().Equal(oldCA)).To(BeTrue())

		// 364 days left: a new CA signs; both are published.
		clk.SetTime(oldCA.NotAfter.Add(-364 * 24 * time.Hour))
		Expect(a.Ensure(ctx)).To(Succeed())
		newCA := a.Current().Certificate()
		Expect(newCA.Equal(oldCA)).To(BeFalse())
		Expect(newCA.Subject.CommonName).NotTo(Equal(oldCA.Subject.CommonName), "generations are told apart")
		Expect(newCA.NotAfter).To(BeTemporally(">", clk.Now().Add(9*365*24*time.Hour)))
		Expect(caSecret(ns).Data["ca.crt"]).To(Equal(a.Current().CertPEM()))
		Expect(bundleCerts(ns)).To(HaveExactElements(oldCA, newCA))

		// Both generations' certificates verify against the bundle, with
		// a replica that only now starts as well.
		newLeaf, err := a.Current().IssueNode("a", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		replica := newAuthority(cp.Client, ns, clk)
		Expect(replica.Ensure(ctx)).To(Succeed())
		Expect(replica.Current().Certificate().Equal(newCA)).To(BeTrue())
		for _, pool := range []*x509.CertPool{a.Pool(), replica.Pool()} {
			Expect(verifies(pool, newLeaf.Leaf, clk.Now(), x509.ExtKeyUsageServerAuth)).To(Succeed())
			Expect(verifies(pool, oldLeaf.Leaf, oldLeaf.Leaf.NotAfter.Add(-time.Hour), x509.ExtKeyUsageServerAuth)).To(Succeed())
		}

		// The old CA expires: it leaves the bundle.
		clk.SetTime(oldCA.NotAfter.Add(time.Second))
		Expect(a.Ensure(ctx)).To(Succeed())
		Expect(bundleCerts(ns)).To(HaveExactElements(newCA))
		Expect(a.Current().Certificate().Equal(newCA)).To(BeTrue())
	})

	DescribeTable("repairs a broken Secret and cleans the bundle",
		func(broken func() (map[string][]byte, string)) {
			data, bundle := broken()
			Expect(cp.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: operatorca.DefaultCASecret}, Data: data,
			})).To(Succeed())
			Expect(cp.Client.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: operatorca.DefaultBundleConfigMap},
				Data:       map[string]string{"ca.crt": bundle},
			})).To(Succeed())
			a := newAuthority(cp.Client, ns, nil)
			Expect(a.Ensure(ctx)).To(Succeed())
			Expect(caSecret(ns).Data["ca.crt"]).To(Equal(a.Current().CertPEM()))
			Expect(bundleConfigMap(ns).Data["ca.crt"]).To(Equal(string(a.Current().CertPEM())), "nothing else is trusted")
		},
		Entry("empty", func() (map[string][]byte, string) { return nil, "" }),
		Entry("garbage", func() (map[string][]byte, string) {
			return map[string][]byte{"ca.crt": []byte("garbage"), "ca.key": []byte("garbage")}, "garbage"
		}),
		Entry("a key that does not match, and a non-CA and an expired CA in the bundle", func() (map[string][]byte, string) {
			ca, other := newCA(time.Hour), newCA(time.Hour)
			leaf, err := ca.IssueServing([]string{"x"}, time.Hour)
			Expect(err).NotTo(HaveOccurred())
			certPEM, _, err := operatorca.EncodeKeyPair(leaf)
			Expect(err).NotTo(HaveOccurred())
			expired, err := operatorca.NewCA("expired", time.Hour, time.Now().Add(-3*time.Hour))
			Expect(err).NotTo(HaveOccurred())
			return map[string][]byte{"ca.crt": ca.CertPEM(), "ca.key": other.KeyPEM()}, string(certPEM) + string(expired.CertPEM())
		}),
		Entry("a CA with less than a year left", func() (map[string][]byte, string) {
			ca := newCA(300 * 24 * time.Hour)
			return map[string][]byte{"ca.crt": ca.CertPEM(), "ca.key": ca.KeyPEM()}, ""
		}),
	)

	It("keeps a client certificate until 2/3 of its life, then re-issues it; at once when its CA was revoked", func() {
		clk := clocktesting.NewFakeClock(time.Now())
		a := newAuthority(cp.Client, ns, clk)
		Expect(a.Ensure(ctx)).To(Succeed())
		get := a.ClientCertificate(operatorca.AggregatorCommonName)
		first, err := get(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(first.Leaf.Subject.CommonName).To(Equal(operatorca.AggregatorCommonName))
		Expect(first.Leaf.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}))
		Expect(first.Leaf.NotAfter).To(BeTemporally("~", clk.Now().Add(24*time.Hour), time.Second))
		Expect(verifies(a.Pool(), first.Leaf, clk.Now(), x509.ExtKeyUsageClientAuth)).To(Succeed())

		clk.Step(15 * time.Hour)
		again, err := get(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(BeIdenticalTo(first), "cached")

		clk.Step(2 * time.Hour) // past 2/3 of 24h (counted from the back-dated start)
		renewed, err := get(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(renewed.Leaf.SerialNumber).NotTo(Equal(first.Leaf.SerialNumber))

		// Revocation: the Secret and the ConfigMap are deleted.
		Expect(cp.Client.Delete(ctx, caSecret(ns))).To(Succeed())
		Expect(cp.Client.Delete(ctx, bundleConfigMap(ns))).To(Succeed())
		Expect(a.Ensure(ctx)).To(Succeed())
		fresh, err := get(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(fresh.Leaf.SerialNumber).NotTo(Equal(renewed.Leaf.SerialNumber))
		Expect(verifies(a.Pool(), fresh.Leaf, clk.Now(), x509.ExtKeyUsageClientAuth)).To(Succeed())
		Expect(verifies(a.Pool(), renewed.Leaf, clk.Now(), x509.ExtKeyUsageClientAuth)).NotTo(Succeed())
	})

	It("restores a deleted bundle while it runs, and stops with its context", func() {
		a, err := operatorca.NewAuthority(cp.Client, operatorca.AuthorityOptions{Namespace: ns, CheckInterval: 200 * time.Millisecond})
		Expect(err).NotTo(HaveOccurred())
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- a.Start(runCtx) }()
		Eventually(a.Current).WithTimeout(eventually).ShouldNot(BeNil())
		Expect(cp.Client.Delete(ctx, bundleConfigMap(ns))).To(Succeed())
		Eventually(func() error {
			return cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: operatorca.DefaultBundleConfigMap}, &corev1.ConfigMap{})
		}).WithTimeout(eventually).Should(Succeed())
		Expect(bundleConfigMap(ns).Data["ca.crt"]).To(Equal(string(a.Current().CertPEM())))
		cancel()
		Eventually(done).WithTimeout(5 * time.Second).Should(Receive(BeNil()))
	})
})
