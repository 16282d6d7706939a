/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// startNodeCertificate runs a NodeCertificate for node with the manager's
// token bound to a Pod on podNode, until the spec ends.
func (e *operatorEnv) startNodeCertificate(node, podNode string, clk clock.PassiveClock) *operatorca.NodeCertificate {
	GinkgoHelper()
	nc, err := operatorca.NewNodeCertificate(e.manager(podNode).Clientset, operatorca.NodeCertificateOptions{
		NodeName: node, Namespace: e.ns, Clock: clk, CheckInterval: 100 * time.Millisecond,
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(nc.NeedLeaderElection()).To(BeFalse())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- nc.Start(ctx) }()
	DeferCleanup(func() {
		cancel()
		Eventually(done).WithTimeout(eventually).Should(Receive(BeNil()))
	})
	return nc
}

func waitReady(nc *operatorca.NodeCertificate) {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	Expect(nc.WaitReady(ctx)).To(Succeed())
}

func servedCertificate(nc *operatorca.NodeCertificate) *tls.Certificate {
	GinkgoHelper()
	c, err := nc.GetCertificate(nil)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// nodeCSRs are the CSRs a node's manager has left.
func nodeCSRs(node string) []string {
	GinkgoHelper()
	list, err := cp.Clientset.CertificatesV1().CertificateSigningRequests().List(context.Background(),
		metav1.ListOptions{LabelSelector: operatorca.LabelNodeCertificate + "=" + node})
	Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, c := range list.Items {
		names = append(names, c.Name)
	}
	return names
}

var _ = Describe("NodeCertificate", func() {
	It("checks its options", func() {
		cs := fake.NewClientset()
		_, err := operatorca.NewNodeCertificate(nil, operatorca.NodeCertificateOptions{NodeName: "a", Namespace: "ns"})
		Expect(err).To(HaveOccurred())
		_, err = operatorca.NewNodeCertificate(cs, operatorca.NodeCertificateOptions{NodeName: "Not_A_Node", Namespace: "ns"})
		Expect(err).To(MatchError(ContainSubstring("not a node name")))
		_, err = operatorca.NewNodeCertificate(cs, operatorca.NodeCertificateOptions{NodeName: "a"})
		Expect(err).To(MatchError(ContainSubstring("namespace")))
		nc, err := operatorca.NewNodeCertificate(cs, operatorca.NodeCertificateOptions{NodeName: "a", Namespace: "ns"})
		Expect(err).NotTo(HaveOccurred())
		_, err = nc.GetCertificate(nil)
		Expect(err).To(MatchError(ContainSubstring("not issued yet")))
		Expect(nc.Pool()).To(BeNil())
	})

	It("gets its node's certificate from the Signer with the manager's Pod-bound token, serves it, and deletes its CSR", func() {
		e := newOperatorEnv(nil)
		e.startSigner(operatorca.SignerOptions{})
		nodeA := e.node("a")
		nc := e.startNodeCertificate(nodeA, nodeA, nil)
		waitReady(nc)

		cert := servedCertificate(nc)
		Expect(cert.Leaf.Subject.CommonName).To(Equal(operatorca.NodeCommonName(nodeA)))
		Expect(verifies(nc.Pool(), cert.Leaf, time.Now(), x509.ExtKeyUsageServerAuth)).To(Succeed())
		Expect(nc.Pool().Equal(e.authority.Pool())).To(BeTrue(), "the bundle came from the ConfigMap")

		// What a client of the node API sees: the right node passes, the
		// same server is refused as another node.
		got, err := handshake(cert, e.authority.Pool, nodeA)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).NotTo(BeEmpty())
		got, err = handshake(cert, e.authority.Pool, e.node("b"))
		Expect(err).To(MatchError(ContainSubstring("names")))
		Expect(got).To(BeEmpty())

		Eventually(func() []string { return nodeCSRs(nodeA) }).WithTimeout(eventually).Should(BeEmpty())
	})

	It("renews at 2/3 of the certificate's life with a new key, and after a CA rotation moves to the new CA and trusts both", func() {
		// The CA's clock and the node's: the CA's moves first, as the
		// Authority re-checks before the node would notice the time.
		caClock, nodeClock := clocktesting.NewFakeClock(time.Now()), clocktesting.NewFakeClock(time.Now())
		setTime := func(t time.Time) {
			caClock.SetTime(t)
			nodeClock.SetTime(t)
		}
		e := newOperatorEnv(caClock)
		e.startSigner(operatorca.SignerOptions{})
		nodeA := e.node("a")
		nc := e.startNodeCertificate(nodeA, nodeA, nodeClock)
		waitReady(nc)
		first := servedCertificate(nc)
		Expect(first.Leaf.NotAfter).To(BeTemporally("~", caClock.Now().Add(operatorca.DefaultNodeCertValidity), time.Minute))

		// Just before the renewal time nothing happens.
		setTime(operatorca.RenewalTime(first.Leaf).Add(-time.Minute))
		Consistently(func() *tls.Certificate { return servedCertificate(nc) }).WithTimeout(time.Second).Should(BeIdenticalTo(first))

		setTime(operatorca.RenewalTime(first.Leaf).Add(time.Minute))
		var second *tls.Certificate
		Eventually(func() *tls.Certificate { second = servedCertificate(nc); return second }).
			WithTimeout(eventually).ShouldNot(BeIdenticalTo(first))
		Expect(second.Leaf.SerialNumber).NotTo(Equal(first.Leaf.SerialNumber))
		Expect(second.Leaf.PublicKey).NotTo(Equal(first.Leaf.PublicKey), "a new key")
		Expect(second.Leaf.NotAfter).To(BeTemporally("~", caClock.Now().Add(operatorca.DefaultNodeCertValidity), time.Minute))
		Consistently(func() *tls.Certificate { return servedCertificate(nc) }).WithTimeout(time.Second).Should(BeIdenticalTo(second),
			"renewed once")
		Eventually(func() []string { return nodeCSRs(nodeA) }).WithTimeout(eventually).Should(BeEmpty())

		// A year before the CA expires it is rotated. The node's
		// certificate from the old CA has long expired by then: the next
		// one comes from the new CA, and the bundle holds both.
		oldCA := e.authority.Current().Certificate()
		caClock.SetTime(oldCA.NotAfter.Add(-364 * 24 * time.Hour))
		Expect(e.authority.Ensure(context.Background())).To(Succeed())
		newCA := e.authority.Current().Certificate()
		Expect(newCA.Equal(oldCA)).To(BeFalse())
		nodeClock.SetTime(caClock.Now())
		Eventually(func() error { return servedCertificate(nc).Leaf.CheckSignatureFrom(newCA) }).
			WithTimeout(eventually).Should(Succeed())
		Eventually(func() error {
			return verifies(nc.Pool(), servedCertificate(nc).Leaf, caClock.Now(), x509.ExtKeyUsageServerAuth)
		}).WithTimeout(eventually).Should(Succeed(), "the new CA is trusted")
		Expect(verifies(nc.Pool(), first.Leaf, first.Leaf.NotAfter.Add(-time.Hour), x509.ExtKeyUsageServerAuth)).To(Succeed(),
			"the old CA is still trusted")
	})

	It("gets nothing for another node than its token's, retries, and leaves no CSR behind", func() {
		e := newOperatorEnv(nil)
		e.startSigner(operatorca.SignerOptions{})
		nodeA, nodeB := e.node("a"), e.node("b")
		nc := e.startNodeCertificate(nodeB, nodeA, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		Expect(nc.WaitReady(ctx)).To(MatchError(ContainSubstring("waiting for the node API certificate of " + nodeB)))
		_, err := nc.GetCertificate(nil)
		Expect(err).To(HaveOccurred())
		Eventually(func() []string { return nodeCSRs(nodeB) }).WithTimeout(eventually).Should(BeEmpty())
	})
})
