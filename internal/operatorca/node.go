/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// The RBAC this needs (CSRs create/get/list/watch/delete, the bundle
// ConfigMap get/list/watch) is declared in package noderbac, because the
// node manager's role is generated from other packages than the webhook's.

// LabelNodeCertificate marks a node manager's CSRs with its node (the node
// name, or a hash of it when it is too long for a label value), so that it
// can find and delete its old ones.
const LabelNodeCertificate = "code-sandbox.dev/node-certificate"

// NodeCertificateOptions say which node this is and where the bundle is.
type NodeCertificateOptions struct {
	// NodeName is the node the certificate names.
	NodeName string
	// Namespace and BundleConfigMap (default DefaultBundleConfigMap) name
	// the operator CA bundle.
	Namespace       string
	BundleConfigMap string
	// Clock decides renewal (default the real clock).
	Clock clock.PassiveClock
	// CheckInterval bounds the time between two renewal checks (default one
	// minute); tests with a fake clock shorten it.
	CheckInterval time.Duration
	// RequestTimeout is how long one CSR may wait for the signer before it
	// is deleted and a new one made (default five minutes).
	RequestTimeout time.Duration
}

// NodeCertificate is the node manager's serving certificate for its node
// API. It generates an ECDSA key in memory (never stored), requests a
// certificate with a CertificateSigningRequest for NodeSignerName, serves
// it through GetCertificate and renews it, with a new key, at 2/3 of its
// lifetime. CSRs it made are deleted once used or refused. Pool follows the
// bundle ConfigMap through a watch.
//
// The CSR is made with cs's credentials: in a cluster the manager's
// Pod-bound ServiceAccount token, whose node binding the Signer checks.
type NodeCertificate struct {
	cs   kubernetes.Interface
	opts NodeCertificateOptions

	cert atomic.Pointer[tls.Certificate]
	pool atomic.Pointer[x509.CertPool]

	certReady, bundleReady         chan struct{}
	certReadyOnce, bundleReadyOnce sync.Once
}

// NewNodeCertificate checks the options; nothing happens before Start.
func NewNodeCertificate(cs kubernetes.Interface, opts NodeCertificateOptions) (*NodeCertificate, error) {
	switch {
	case cs == nil:
		return nil, errors.New("node certificate: no Kubernetes client")
	case !validNodeName(opts.NodeName):
		return nil, fmt.Errorf("node certificate: %q is not a node name", opts.NodeName)
	case opts.Namespace == "":
		return nil, errors.New("node certificate: the operator namespace is not set")
	}
	if opts.BundleConfigMap == "" {
		opts.BundleConfigMap = DefaultBundleConfigMap
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = time.Minute
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 5 * time.Minute
	}
	return &NodeCertificate{cs: cs, opts: opts, certReady: make(chan struct{}), bundleReady: make(chan struct{})}, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (n *NodeCertificate) NeedLeaderElection() bool { return false }

// GetCertificate is for tls.Config.GetCertificate.
func (n *NodeCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := n.cert.Load(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("the serving certificate of node %s is not issued yet", n.opts.NodeName)
}

// Pool is the operator CA bundle, nil until it is loaded.
func (n *NodeCertificate) Pool() *x509.CertPool { return n.pool.Load() }

// WaitReady returns once the first certificate and the bundle are loaded.
func (n *NodeCertificate) WaitReady(ctx context.Context) error {
	for _, ch := range []chan struct{}{n.certReady, n.bundleReady} {
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the node API certificate of %s (is the signer running, and the manager's token bound to a Pod on this node?): %w",
				n.opts.NodeName, context.Cause(ctx))
		}
	}
	return nil
}

// Start implements manager.Runnable: it follows the bundle and keeps the
// certificate current until ctx ends.
func (n *NodeCertificate) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("node-certificate").WithValues("node", n.opts.NodeName)
	ctx = logf.IntoContext(ctx, log)
	if err := n.watchBundle(ctx); err != nil {
		return err
	}
	backoff := wait.Backoff{Duration: 2 * time.Second, Factor: 2, Jitter: 0.1, Steps: 100, Cap: 5 * time.Minute}
	for {
		sleep := n.opts.CheckInterval
		if c := n.cert.Load(); c == nil || !n.opts.Clock.Now().Before(RenewalTime(c.Leaf)) {
			if c, err := n.request(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				sleep = backoff.Step()
				log.Error(err, "requesting the node API certificate; retrying", "after", sleep)
			} else {
				n.cert.Store(c)
				n.certReadyOnce.Do(func() { close(n.certReady) })
				backoff = wait.Backoff{Duration: 2 * time.Second, Factor: 2, Jitter: 0.1, Steps: 100, Cap: 5 * time.Minute}
				log.Info("serving a new node API certificate", "notAfter", c.Leaf.NotAfter, "renewAt", RenewalTime(c.Leaf))
			}
		}
		if c := n.cert.Load(); c != nil {
			if until := RenewalTime(c.Leaf).Sub(n.opts.Clock.Now()); until < sleep {
				sleep = max(until, time.Second)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(sleep):
		}
	}
}

// watchBundle keeps Pool in step with the bundle ConfigMap.
func (n *NodeCertificate) watchBundle(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(n.cs, 0,
		informers.WithNamespace(n.opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", n.opts.BundleConfigMap).String()
		}))
	informer := factory.Core().V1().ConfigMaps().Informer()
	load := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok || cm.Name != n.opts.BundleConfigMap {
			return
		}
		if err := n.loadBundle([]byte(cm.Data[BundleKey])); err != nil {
			logf.FromContext(ctx).Error(err, "the operator CA bundle is unusable; keeping the previous one", "configMap", cm.Namespace+"/"+cm.Name)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    load,
		UpdateFunc: func(_, obj any) { load(obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	return nil
}

func (n *NodeCertificate) loadBundle(bundle []byte) error {
	certs, err := ParseCertificates(bundle)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	count := 0
	for _, c := range certs {
		if c.IsCA {
			pool.AddCert(c)
			count++
		}
	}
	if count == 0 {
		return fmt.Errorf("%s holds no CA certificate", BundleKey)
	}
	n.pool.Store(pool)
	n.bundleReadyOnce.Do(func() { close(n.bundleReady) })
	return nil
}

// request makes one CSR, waits for the signer, and deletes it (and older
// ones of ours) once it has the certificate or a refusal.
func (n *NodeCertificate) request(ctx context.Context) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: NodeCommonName(n.opts.NodeName)},
	}, key)
	if err != nil {
		return nil, err
	}
	csrs := n.cs.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{
			Name:   csrName(n.opts.NodeName),
			Labels: map[string]string{LabelNodeCertificate: nodeLabelValue(n.opts.NodeName), LabelManagedBy: ManagedByValue},
		},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: NodeSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating a CertificateSigningRequest: %w", err)
	}
	defer n.cleanUp(ctx, csr)

	var certPEM []byte
	var refused error
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, n.opts.RequestTimeout, true, func(ctx context.Context) (bool, error) {
		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				refused = errors.New("deleted before it was signed")
				return true, nil
			}
			return false, nil // transient; the timeout bounds it
		}
		for _, c := range got.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				refused = fmt.Errorf("%s: %s: %s", c.Type, c.Reason, c.Message)
				return true, nil
			}
		}
		certPEM = got.Status.Certificate
		return len(certPEM) > 0, nil
	})
	switch {
	case refused != nil:
		return nil, fmt.Errorf("CertificateSigningRequest %s: %w", csr.Name, refused)
	case err != nil:
		return nil, fmt.Errorf("CertificateSigningRequest %s was not signed: %w", csr.Name, err)
	}
	return n.keyPair(certPEM, key)
}

// keyPair checks that the issued certificate is for key and this node.
func (n *NodeCertificate) keyPair(certPEM []byte, key *ecdsa.PrivateKey) (*tls.Certificate, error) {
	certs, err := ParseCertificates(certPEM)
	if err != nil || len(certs) == 0 {
		return nil, fmt.Errorf("the signer returned no usable certificate: %v", err)
	}
	leaf := certs[0]
	if !key.PublicKey.Equal(leaf.PublicKey) {
		return nil, errors.New("the signer returned a certificate for another key")
	}
	if node, ok := NodeNameOf(leaf); !ok || node != n.opts.NodeName {
		return nil, fmt.Errorf("the signer returned a certificate for %q, not %q", leaf.Subject.CommonName, NodeCommonName(n.opts.NodeName))
	}
	out := &tls.Certificate{PrivateKey: key, Leaf: leaf}
	for _, c := range certs {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, nil
}

// cleanUp deletes csr and every older CSR of this node's that the same user
// made (a manager that restarted, or an attempt that timed out).
func (n *NodeCertificate) cleanUp(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) {
	log := logf.FromContext(ctx)
	// ctx may be ending (shutdown); the clean-up still gets a moment.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	csrs := n.cs.CertificatesV1().CertificateSigningRequests()
	if err := csrs.Delete(ctx, csr.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		log.Error(err, "deleting a used CertificateSigningRequest", "csr", csr.Name)
	}
	list, err := csrs.List(ctx, metav1.ListOptions{LabelSelector: LabelNodeCertificate + "=" + nodeLabelValue(n.opts.NodeName)})
	if err != nil {
		log.Error(err, "listing old CertificateSigningRequests")
		return
	}
	for _, old := range list.Items {
		if old.Name == csr.Name || old.Spec.SignerName != NodeSignerName || old.Spec.Username != csr.Spec.Username ||
			old.CreationTimestamp.After(csr.CreationTimestamp.Time) {
			continue
		}
		if err := csrs.Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			log.Error(err, "deleting an old CertificateSigningRequest", "csr", old.Name)
		}
	}
}

// csrName is code-sandbox-node-<node>-<random>, within the 253 characters
// of an object name.
func csrName(node string) string {
	const prefix = "code-sandbox-node-"
	if maxNode := 253 - len(prefix) - 9; len(node) > maxNode {
		node = strings.TrimRight(node[:maxNode], ".-")
	}
	return prefix + node + "-" + utilrand.String(8)
}

func nodeLabelValue(node string) string {
	if len(node) <= 63 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "sha256-" + hex.EncodeToString(sum[:])[:48]
}
