/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// operatorEnv is an operator namespace as the shipped manifests make it:
// the webhook's ServiceAccount with the generated control-plane role (it holds the
// CA and runs the signer) and the manager's ServiceAccount with the
// generated manager role.
type operatorEnv struct {
	ns              string
	webhook         *identity
	managerSA       string
	managerUsername string
	authority       *operatorca.Authority
}

func newOperatorEnv(clk clock.PassiveClock) *operatorEnv {
	GinkgoHelper()
	e := &operatorEnv{ns: cp.NewNamespace("operator-"), managerSA: "controller-manager"}
	e.managerUsername = serviceAccountUsername(e.ns, e.managerSA)
	installShippedRole("config/webhook/role.yaml", e.ns, "webhook")
	installShippedRole("config/rbac/role.yaml", e.ns, e.managerSA)
	e.webhook = tokenFor(e.ns, "webhook", "")
	var err error
	e.authority, err = operatorca.NewAuthority(e.webhook.Client, operatorca.AuthorityOptions{Namespace: e.ns, Clock: clk})
	Expect(err).NotTo(HaveOccurred())
	// RBAC takes a moment to reach the authorizer.
	Eventually(e.authority.Ensure).WithContext(context.Background()).WithTimeout(eventually).Should(Succeed())
	return e
}

// node is a node name unique to this environment.
func (e *operatorEnv) node(suffix string) string { return e.ns + "-" + suffix }

// manager is the manager's ServiceAccount with a token bound to a Pod on
// node ("" for an unbound token).
func (e *operatorEnv) manager(node string) *identity {
	GinkgoHelper()
	return tokenFor(e.ns, e.managerSA, node)
}

// startSigner runs a Signer in a controller-runtime manager with the
// webhook's identity until the spec ends.
func (e *operatorEnv) startSigner(opts operatorca.SignerOptions) {
	GinkgoHelper()
	if opts.ManagerUsername == "" {
		opts.ManagerUsername = e.managerUsername
	}
	mgr, err := ctrl.NewManager(e.webhook.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(operatorca.NewSigner(mgr.GetClient(), e.authority, opts).SetupWithManager(mgr)).To(Succeed())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	DeferCleanup(func() {
		cancel()
		Eventually(done).WithTimeout(eventually).Should(Receive(BeNil()))
	})
}

type csrOptions struct {
	dnsNames   []string
	ips        []net.IP
	org        []string
	usages     []certificatesv1.KeyUsage
	expiration *int32
	signerName string
	commonName string
}

// createCSR creates a CSR with cs (whose identity the API server records in
// spec.username and spec.extra) for the node API of node.
func createCSR(cs kubernetes.Interface, node string, o csrOptions) *certificatesv1.CertificateSigningRequest {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	cn := operatorca.NodeCommonName(node)
	if o.commonName != "" {
		cn = o.commonName
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: cn, Organization: o.org},
		DNSNames: o.dnsNames, IPAddresses: o.ips,
	}, key)
	Expect(err).NotTo(HaveOccurred())
	if o.usages == nil {
		o.usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	}
	if o.signerName == "" {
		o.signerName = operatorca.NodeSignerName
	}
	csr, err := cs.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        o.signerName,
			Usages:            o.usages,
			ExpirationSeconds: o.expiration,
		},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		_ = cp.Clientset.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
	})
	return csr
}

func getCSR(name string) *certificatesv1.CertificateSigningRequest {
	GinkgoHelper()
	csr, err := cp.Clientset.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	return csr
}

func condition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == t {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

// decided waits until the CSR is signed, denied or failed.
func decided(name string) *certificatesv1.CertificateSigningRequest {
	GinkgoHelper()
	var csr *certificatesv1.CertificateSigningRequest
	Eventually(func() bool {
		csr = getCSR(name)
		return len(csr.Status.Certificate) > 0 || condition(csr, certificatesv1.CertificateDenied) != nil ||
			condition(csr, certificatesv1.CertificateFailed) != nil
	}).WithTimeout(eventually).WithPolling(100 * time.Millisecond).Should(BeTrue())
	return csr
}

func issuedCertificate(csr *certificatesv1.CertificateSigningRequest) *x509.Certificate {
	GinkgoHelper()
	certs, err := operatorca.ParseCertificates(csr.Status.Certificate)
	Expect(err).NotTo(HaveOccurred())
	Expect(certs).To(HaveLen(1))
	return certs[0]
}

var _ = Describe("Signer", func() {
	var e *operatorEnv
	var nodeA, nodeB string
	BeforeEach(func() {
		e = newOperatorEnv(nil)
		nodeA, nodeB = e.node("a"), e.node("b")
	})

	It("refuses to start without the manager's user name", func() {
		mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
		Expect(err).NotTo(HaveOccurred())
		Expect(operatorca.NewSigner(mgr.GetClient(), e.authority, operatorca.SignerOptions{}).SetupWithManager(mgr)).
			To(MatchError(ContainSubstring("user name")))
	})

	It("approves and signs a request made with the manager's token bound to a Pod on the node it names", func() {
		e.startSigner(operatorca.SignerOptions{})
		csr := createCSR(e.manager(nodeA).Clientset, nodeA, csrOptions{})
		// The API server, not the requester, filled in who asked.
		Expect(csr.Spec.Username).To(Equal(e.managerUsername))
		Expect(csr.Spec.Extra).To(HaveKeyWithValue(operatorca.NodeNameExtra, certificatesv1.ExtraValue{nodeA}))

		csr = decided(csr.Name)
		approved := condition(csr, certificatesv1.CertificateApproved)
		Expect(approved).NotTo(BeNil(), "conditions: %+v", csr.Status.Conditions)
		Expect(approved.Reason).To(Equal(operatorca.ReasonApproved))
		Expect(condition(csr, certificatesv1.CertificateDenied)).To(BeNil())
		cert := issuedCertificate(csr)
		Expect(cert.Subject.CommonName).To(Equal(operatorca.NodeCommonName(nodeA)))
		Expect(cert.DNSNames).To(BeEmpty())
		Expect(cert.IPAddresses).To(BeEmpty())
		Expect(cert.IsCA).To(BeFalse())
		Expect(cert.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
		Expect(cert.NotAfter).To(BeTemporally("~", time.Now().Add(operatorca.DefaultNodeCertValidity), time.Minute))
		Expect(verifies(e.authority.Pool(), cert, time.Now(), x509.ExtKeyUsageServerAuth)).To(Succeed())
		name, ok := operatorca.NodeNameOf(cert)
		Expect(ok).To(BeTrue())
		Expect(name).To(Equal(nodeA))
	})

	It("honours a shorter spec.expirationSeconds and key encipherment", func() {
		e.startSigner(operatorca.SignerOptions{})
		csr := decided(createCSR(e.manager(nodeA).Clientset, nodeA, csrOptions{
			expiration: ptr.To[int32](3600),
			usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment,
				certificatesv1.UsageServerAuth},
		}).Name)
		Expect(issuedCertificate(csr).NotAfter).To(BeTemporally("~", time.Now().Add(time.Hour), time.Minute))
	})

	type denial struct {
		requester func() *identity
		node      string
		opts      csrOptions
		reason    string
		message   []string
	}
	DescribeTable("denies, naming the problem",
		func(d func() denial) {
			e.startSigner(operatorca.SignerOptions{})
			c := d()
			csr := decided(createCSR(c.requester().Clientset, c.node, c.opts).Name)
			Expect(csr.Status.Certificate).To(BeEmpty())
			Expect(condition(csr, certificatesv1.CertificateApproved)).To(BeNil())
			denied := condition(csr, certificatesv1.CertificateDenied)
			Expect(denied).NotTo(BeNil(), "conditions: %+v", csr.Status.Conditions)
			Expect(denied.Status).To(Equal(corev1.ConditionTrue))
			Expect(denied.Reason).To(Equal(c.reason))
			for _, m := range c.message {
				Expect(denied.Message).To(ContainSubstring(m))
			}
		},
		Entry("another node in the common name", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeB, reason: operatorca.ReasonNodeBinding,
				message: []string{`would name node "` + nodeB + `"`, `bound to a Pod on node "` + nodeA + `"`}}
		}),
		Entry("another ServiceAccount, bound to a Pod on the node", func() denial {
			installShippedRole("config/rbac/role.yaml", e.ns, "intruder") // it may create CSRs
			return denial{requester: func() *identity { return tokenFor(e.ns, "intruder", nodeA) }, node: nodeA, reason: operatorca.ReasonRequester,
				message: []string{serviceAccountUsername(e.ns, "intruder"), e.managerUsername}}
		}),
		Entry("the manager's token not bound to a Pod", func() denial {
			return denial{requester: func() *identity { return e.manager("") }, node: nodeA, reason: operatorca.ReasonNodeBinding,
				message: []string{"not bound to a Pod on a node"}}
		}),
		Entry("a DNS subject alternative name", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeA, reason: operatorca.ReasonSubjectAltNames,
				opts: csrOptions{dnsNames: []string{"evil.example.com"}}, message: []string{"evil.example.com"}}
		}),
		Entry("an IP subject alternative name", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeA, reason: operatorca.ReasonSubjectAltNames,
				opts: csrOptions{ips: []net.IP{net.ParseIP("10.0.0.1")}}, message: []string{"10.0.0.1"}}
		}),
		Entry("client auth instead of server auth", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeA, reason: operatorca.ReasonUsages,
				opts:    csrOptions{usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}},
				message: []string{"client auth"}}
		}),
		Entry("client auth besides server auth", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeA, reason: operatorca.ReasonUsages,
				opts: csrOptions{usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth,
					certificatesv1.UsageClientAuth}}}
		}),
		Entry("an organization (a group) in the subject", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeA, reason: operatorca.ReasonSubject,
				opts: csrOptions{org: []string{"system:masters"}}, message: []string{"other than the common name"}}
		}),
		Entry("a common name that is not a node's", func() denial {
			return denial{requester: func() *identity { return e.manager(nodeA) }, node: nodeA, reason: operatorca.ReasonSubject,
				opts: csrOptions{commonName: operatorca.AggregatorCommonName}, message: []string{operatorca.AggregatorCommonName}}
		}),
	)

	It("never touches a CSR again once it is signed or denied", func() {
		e.startSigner(operatorca.SignerOptions{})
		manager := e.manager(nodeA)
		signed := decided(createCSR(manager.Clientset, nodeA, csrOptions{}).Name)
		denied := decided(createCSR(manager.Clientset, nodeB, csrOptions{}).Name)
		Expect(signed.Status.Certificate).NotTo(BeEmpty())
		Expect(condition(denied, certificatesv1.CertificateDenied)).NotTo(BeNil())

		// Any change makes the signer look again.
		for _, csr := range []*certificatesv1.CertificateSigningRequest{signed, denied} {
			csr.Labels = map[string]string{"touched": "yes"}
			_, err := cp.Clientset.CertificatesV1().CertificateSigningRequests().Update(context.Background(), csr, metav1.UpdateOptions{})
			Expect(err).NotTo(HaveOccurred())
		}
		Consistently(func() certificatesv1.CertificateSigningRequestStatus { return getCSR(signed.Name).Status }).
			WithTimeout(2 * time.Second).Should(Equal(signed.Status))
		Expect(getCSR(denied.Name).Status).To(Equal(denied.Status))
	})

	It("marks Failed, and does not sign, a CSR that someone else approved against the rules", func() {
		csr := createCSR(e.manager(nodeA).Clientset, nodeB, csrOptions{})
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AdminSaidSo",
		})
		_, err := cp.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(context.Background(), csr.Name, csr, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())

		e.startSigner(operatorca.SignerOptions{})
		csr = decided(csr.Name)
		Expect(csr.Status.Certificate).To(BeEmpty())
		failed := condition(csr, certificatesv1.CertificateFailed)
		Expect(failed).NotTo(BeNil(), "conditions: %+v", csr.Status.Conditions)
		Expect(failed.Reason).To(Equal(operatorca.ReasonSigningFailed))
		Expect(failed.Message).To(ContainSubstring(`bound to a Pod on node "` + nodeA + `"`))
	})

	It("leaves other signers' CSRs alone", func() {
		e.startSigner(operatorca.SignerOptions{})
		other := createCSR(e.manager(nodeA).Clientset, nodeA, csrOptions{signerName: "example.com/other"})
		mine := decided(createCSR(e.manager(nodeA).Clientset, nodeA, csrOptions{}).Name)
		Expect(mine.Status.Certificate).NotTo(BeEmpty())
		Consistently(func() []certificatesv1.CertificateSigningRequestCondition {
			return getCSR(other.Name).Status.Conditions
		}).
			WithTimeout(time.Second).Should(BeEmpty())
	})
})
