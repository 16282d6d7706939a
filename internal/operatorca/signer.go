/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca

import (
	"context"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// The signer reads every CSR (a watch cannot be limited to one signer),
// approves or denies and signs only those for NodeSignerName.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=approve;sign,resourceNames=code-sandbox.dev/node-api

// DefaultNodeCertValidity is the lifetime of a node API serving certificate;
// NodeCertificate renews it at 2/3.
const DefaultNodeCertValidity = 7 * 24 * time.Hour

// Condition reasons the Signer writes.
const (
	ReasonApproved = "CodeSandboxNodeCertificate"
	// Denied: the requester is not the node manager ServiceAccount.
	ReasonRequester = "RequesterNotNodeManager"
	// Denied: the requester's token is not bound to a Pod on the node
	// the certificate would name.
	ReasonNodeBinding = "NodeBindingMismatch"
	// Denied: the request does not parse, or its signature is wrong.
	ReasonInvalidRequest = "InvalidRequest"
	// Denied: a subject other than CN=NodeCommonName(<node>).
	ReasonSubject = "InvalidSubject"
	// Denied: subject alternative names were requested.
	ReasonSubjectAltNames = "SubjectAltNamesNotAllowed"
	// Denied: usages other than digital signature (+ key encipherment)
	// and server auth.
	ReasonUsages = "InvalidUsages"
	// Denied: a key type or size the operator does not sign.
	ReasonPublicKey = "UnsupportedPublicKey"
	// Failed: approved by someone else although the rules refuse it, or
	// signing failed.
	ReasonSigningFailed = "SigningFailed"
)

// SignerOptions say whose requests are signed and for how long.
type SignerOptions struct {
	// ManagerUsername is the node managers' ServiceAccount user name
	// (system:serviceaccount:<ns>:<name>); only its requests are signed.
	ManagerUsername string
	// NodeCertValidity defaults to DefaultNodeCertValidity. A shorter
	// spec.expirationSeconds wins.
	NodeCertValidity time.Duration
}

// Signer approves and signs the node managers' CSRs for NodeSignerName,
// and denies the rest with a reason. It never touches a CSR that already
// has a certificate, or is denied or failed. A CSR that someone else
// approved is still checked: it is marked Failed rather than signed if the
// rules refuse it.
type Signer struct {
	client    client.Client
	authority *Authority
	opts      SignerOptions
}

// NewSigner returns a Signer that signs with a's current CA.
func NewSigner(c client.Client, a *Authority, opts SignerOptions) *Signer {
	if opts.NodeCertValidity <= 0 {
		opts.NodeCertValidity = DefaultNodeCertValidity
	}
	return &Signer{client: c, authority: a, opts: opts}
}

// SetupWithManager registers the Signer for CSRs of NodeSignerName.
func (s *Signer) SetupWithManager(mgr ctrl.Manager) error {
	if s.opts.ManagerUsername == "" {
		return errors.New("node certificate signer: the node manager's user name is not set")
	}
	if s.authority == nil || s.client == nil {
		return errors.New("node certificate signer: no CA or no client")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("node-certificate-signer").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			csr, ok := o.(*certificatesv1.CertificateSigningRequest)
			return ok && csr.Spec.SignerName == NodeSignerName
		}))).
		Complete(s)
}

// Reconcile decides one CSR.
func (s *Signer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := s.client.Get(ctx, req.NamespacedName, csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != NodeSignerName || len(csr.Status.Certificate) > 0 ||
		hasCondition(csr, certificatesv1.CertificateDenied) || hasCondition(csr, certificatesv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	ca := s.authority.Current()
	if ca == nil {
		return ctrl.Result{}, errors.New("the operator CA is not loaded yet")
	}

	der, reason, problem := s.check(csr)
	if reason != "" {
		log.Info("refusing a node certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", reason, "problem", problem)
		if hasCondition(csr, certificatesv1.CertificateApproved) {
			return ctrl.Result{}, s.fail(ctx, csr, "approved, but the signer refuses it: "+problem)
		}
		setCondition(csr, certificatesv1.CertificateDenied, reason, problem)
		return ctrl.Result{}, s.client.SubResource("approval").Update(ctx, csr)
	}
	if !hasCondition(csr, certificatesv1.CertificateApproved) {
		setCondition(csr, certificatesv1.CertificateApproved, ReasonApproved,
			"requested by the node manager for its own node")
		if err := s.client.SubResource("approval").Update(ctx, csr); err != nil {
			return ctrl.Result{}, err
		}
	}
	validity := s.opts.NodeCertValidity
	if es := csr.Spec.ExpirationSeconds; es != nil && time.Duration(*es)*time.Second < validity {
		validity = time.Duration(*es) * time.Second
	}
	certPEM, err := ca.SignCSR(der, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, validity)
	if err != nil {
		return ctrl.Result{}, s.fail(ctx, csr, err.Error())
	}
	csr.Status.Certificate = certPEM
	if err := s.client.Status().Update(ctx, csr); err != nil {
		return ctrl.Result{}, err
	}
	log.Info("signed a node certificate", "csr", csr.Name, "node", csr.Spec.Extra[NodeNameExtra], "validity", validity)
	return ctrl.Result{}, nil
}

func (s *Signer) fail(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, msg string) error {
	setCondition(csr, certificatesv1.CertificateFailed, ReasonSigningFailed, msg)
	return s.client.Status().Update(ctx, csr)
}

var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// check applies the rules; it returns the DER request when they allow it,
// else a reason and a message naming the problem.
func (s *Signer) check(csr *certificatesv1.CertificateSigningRequest) (der []byte, reason, problem string) {
	if csr.Spec.Username != s.opts.ManagerUsername {
		return nil, ReasonRequester, fmt.Sprintf("requested by %q; only the node manager %q may request node certificates",
			csr.Spec.Username, s.opts.ManagerUsername)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, ReasonInvalidRequest, "spec.request holds no PEM CERTIFICATE REQUEST"
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, ReasonInvalidRequest, fmt.Sprintf("spec.request does not parse: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, ReasonInvalidRequest, fmt.Sprintf("spec.request's signature: %v", err)
	}
	node, ok := strings.CutPrefix(req.Subject.CommonName, NodeCommonNamePrefix)
	if !ok || !validNodeName(node) {
		return nil, ReasonSubject, fmt.Sprintf("common name %q is not %s<node name>", req.Subject.CommonName, NodeCommonNamePrefix)
	}
	if len(req.Subject.Names) != 1 || !req.Subject.Names[0].Type.Equal(oidCommonName) {
		return nil, ReasonSubject, fmt.Sprintf("subject %q has attributes other than the common name", req.Subject.String())
	}
	bound := csr.Spec.Extra[NodeNameExtra]
	if len(bound) != 1 || bound[0] != node {
		what := "is not bound to a Pod on a node"
		if len(bound) > 0 {
			what = fmt.Sprintf("is bound to a Pod on node %q", strings.Join(bound, ","))
		}
		return nil, ReasonNodeBinding, fmt.Sprintf("the certificate would name node %q, but the requester's token %s", node, what)
	}
	if len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return nil, ReasonSubjectAltNames, fmt.Sprintf("subject alternative names are not allowed (DNS %v, IP %v, email %v, URI %v)",
			req.DNSNames, req.IPAddresses, req.EmailAddresses, req.URIs)
	}
	if !allowedUsages(csr.Spec.Usages) {
		return nil, ReasonUsages, fmt.Sprintf("usages %q: want exactly %q and %q (%q allowed)", csr.Spec.Usages,
			certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageKeyEncipherment)
	}
	if err := checkPublicKey(req.PublicKey); err != nil {
		return nil, ReasonPublicKey, err.Error()
	}
	return block.Bytes, "", ""
}

func allowedUsages(usages []certificatesv1.KeyUsage) bool {
	has := map[certificatesv1.KeyUsage]bool{}
	for _, u := range usages {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageKeyEncipherment:
			has[u] = true
		default:
			return false
		}
	}
	return has[certificatesv1.UsageDigitalSignature] && has[certificatesv1.UsageServerAuth]
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	return slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
		return c.Type == t && c.Status == corev1.ConditionTrue
	})
}

func setCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType, reason, msg string) {
	now := metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg,
		LastUpdateTime: now, LastTransitionTime: now,
	})
}
