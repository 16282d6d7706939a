/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package webhookcert gives the admission webhook (and any other in-cluster
// HTTPS server of the operator, such as the aggregated API server) a serving
// certificate without cert-manager. The certificate is issued by the
// operator CA (operatorca.Authority) and kept in a Secret that every replica
// shares; it is written where the server reads it, and the CA bundle is
// injected into the ValidatingWebhookConfiguration and the APIService so
// that the API server trusts it. It renews the certificate well before it
// expires; the server reloads the files by itself.
package webhookcert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// The webhook reads and writes its own certificate Secret and patches the
// CA bundle into its own webhook configuration and APIService, nothing
// else. The Secret rule is namespaced to the webhook's namespace ("system"
// before kustomize's namespace transform); create cannot be limited by name.
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;update;patch,resourceNames=code-sandbox-validating-webhook-configuration
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=get;update;patch,resourceNames=v1alpha1.subresources.sandbox.code-sandbox.dev

// Secret data keys: the serving pair and the CA certificate that issued it.
const (
	KeyCACert = "ca.crt"
	KeyCert   = "tls.crt"
	KeyKey    = "tls.key"
)

const (
	certValidity = 365 * 24 * time.Hour
	// renewBefore: a certificate with less than this left is replaced.
	renewBefore = 90 * 24 * time.Hour
)

// APIServiceGVK is the kind of Options.APIService, handled as unstructured
// data so that the kube-aggregator types are not needed.
var APIServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// Options say where the certificate lives and whom it is for.
type Options struct {
	// Namespace and SecretName name the Secret holding the serving
	// certificate.
	Namespace  string
	SecretName string
	// WebhookConfiguration is the ValidatingWebhookConfiguration whose
	// webhooks get the CA bundle; empty skips injection.
	WebhookConfiguration string
	// APIService is the apiregistration.k8s.io/v1 APIService whose
	// spec.caBundle gets the CA bundle; empty skips injection.
	APIService string
	// Hosts are the DNS names and IP addresses the certificate covers:
	// the Service's names in a cluster, 127.0.0.1 for a local run.
	Hosts []string
	// CertDir receives tls.crt and tls.key for the server.
	CertDir string
	// Clock is injectable for tests of renewal; it should be the
	// Authority's.
	Clock clock.PassiveClock
}

// Manager keeps the certificate current.
type Manager struct {
	client    client.Client
	authority *operatorca.Authority
	opts      Options
}

// New returns a Manager whose certificate authority issues the
// certificate; Prepare keeps the authority current too (Ensure). c should
// read from the API server directly, since it runs before any cache has
// started.
func New(c client.Client, authority *operatorca.Authority, opts Options) (*Manager, error) {
	switch {
	case authority == nil:
		return nil, errors.New("webhook certificate: no operator CA to issue it")
	case opts.Namespace == "":
		return nil, errors.New("webhook certificate: the namespace is not set (--webhook-namespace or POD_NAMESPACE)")
	case opts.SecretName == "":
		return nil, errors.New("webhook certificate: --webhook-cert-secret is empty")
	case len(opts.Hosts) == 0:
		return nil, errors.New("webhook certificate: no host names (--webhook-service or --webhook-cert-hosts)")
	case opts.CertDir == "":
		return nil, errors.New("webhook certificate: no directory to write it to")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Manager{client: c, authority: authority, opts: opts}, nil
}

// Prepare makes sure the operator CA is current, that the Secret holds a
// valid certificate from it for the hosts, and writes that to CertDir. It
// returns the CA bundle to inject. Replicas race safely: creating and
// updating the Secret is optimistic, and a loser adopts the winner's.
func (m *Manager) Prepare(ctx context.Context) ([]byte, error) {
	if err := m.authority.Ensure(ctx); err != nil {
		return nil, err
	}
	secret, err := m.ensureSecret(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.writeFiles(secret); err != nil {
		return nil, err
	}
	return m.authority.BundlePEM(), nil
}

// Ensure prepares the certificate and injects the CA bundle into the
// webhook configuration and the APIService.
func (m *Manager) Ensure(ctx context.Context) error {
	bundle, err := m.Prepare(ctx)
	if err != nil {
		return err
	}
	if err := m.injectWebhook(ctx, bundle); err != nil {
		return err
	}
	return m.injectAPIService(ctx, bundle)
}

// Start implements manager.Runnable: it re-checks periodically, which
// renews the certificate, follows the CA's rotation and restores the CA
// bundle if the webhook configuration or APIService was re-applied without
// it.
func (m *Manager) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("webhook-cert")
	for {
		interval := time.Minute
		if err := m.Ensure(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "keeping the webhook certificate current; retrying")
			interval = 5 * time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica serves with the certificate, so every replica keeps it.
func (m *Manager) NeedLeaderElection() bool { return false }

func (m *Manager) ensureSecret(ctx context.Context) (*corev1.Secret, error) {
	key := client.ObjectKey{Namespace: m.opts.Namespace, Name: m.opts.SecretName}
	// A replacement drops whatever else was there (an old CA key).
	secret, _, err := operatorca.EnsureSecret(ctx, m.client, key, corev1.SecretTypeTLS, m.valid,
		func(map[string][]byte) (map[string][]byte, error) { return m.generate() })
	return secret, err
}

// valid reports whether data holds a serving certificate and its key that
// chain to the operator CA bundle for server authentication, were issued by
// the CA in ca.crt, cover every host and have more than renewBefore left.
// A certificate from a CA that was rotated out but is still in the bundle
// stays valid until its own renewal.
func (m *Manager) valid(data map[string][]byte) bool {
	now := m.opts.Clock.Now()
	pair, err := tls.X509KeyPair(data[KeyCert], data[KeyKey])
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || now.Add(renewBefore).After(leaf.NotAfter) {
		return false
	}
	issuers, err := operatorca.ParseCertificates(data[KeyCACert])
	if err != nil || len(issuers) != 1 || leaf.CheckSignatureFrom(issuers[0]) != nil {
		return false
	}
	pool := m.authority.Pool()
	if pool == nil {
		return false
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return false
	}
	for _, h := range m.opts.Hosts {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// generate issues a serving certificate for the hosts from the current
// operator CA.
func (m *Manager) generate() (map[string][]byte, error) {
	ca := m.authority.Current()
	if ca == nil {
		return nil, errors.New("webhook certificate: the operator CA is not loaded")
	}
	pair, err := ca.IssueServing(m.opts.Hosts, certValidity)
	if err != nil {
		return nil, fmt.Errorf("issuing the webhook certificate: %w", err)
	}
	certPEM, keyPEM, err := operatorca.EncodeKeyPair(pair)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{KeyCACert: ca.CertPEM(), KeyCert: certPEM, KeyKey: keyPEM}, nil
}

// writeFiles writes the pair atomically (rename), only when it changed, so
// that the webhook server's file watcher sees whole files.
func (m *Manager) writeFiles(secret *corev1.Secret) error {
	if err := os.MkdirAll(m.opts.CertDir, 0o700); err != nil {
		return fmt.Errorf("webhook certificate directory: %w", err)
	}
	for _, name := range []string{KeyKey, KeyCert} {
		path := filepath.Join(m.opts.CertDir, name)
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, secret.Data[name]) {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, secret.Data[name], 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return nil
}

// injectWebhook puts the CA bundle into every webhook of the
// configuration.
func (m *Manager) injectWebhook(ctx context.Context, bundle []byte) error {
	if m.opts.WebhookConfiguration == "" {
		return nil
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: m.opts.WebhookConfiguration}}
	return m.updateCABundle(ctx, cfg, "ValidatingWebhookConfiguration "+cfg.Name, func() bool {
		changed := false
		for i := range cfg.Webhooks {
			if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
				cfg.Webhooks[i].ClientConfig.CABundle = slices.Clone(bundle)
				changed = true
			}
		}
		return changed
	})
}

// injectAPIService puts the CA bundle into the APIService's spec.caBundle.
func (m *Manager) injectAPIService(ctx context.Context, bundle []byte) error {
	if m.opts.APIService == "" {
		return nil
	}
	svc := &unstructured.Unstructured{}
	svc.SetGroupVersionKind(APIServiceGVK)
	svc.SetName(m.opts.APIService)
	want := base64.StdEncoding.EncodeToString(bundle)
	return m.updateCABundle(ctx, svc, "APIService "+m.opts.APIService, func() bool {
		if cur, _, _ := unstructured.NestedString(svc.Object, "spec", "caBundle"); cur == want {
			return false
		}
		// A missing spec is the API server's business to refuse.
		_ = unstructured.SetNestedField(svc.Object, want, "spec", "caBundle")
		return true
	})
}

// updateCABundle reads obj, lets set change it, and writes it back when
// set reports a change, retrying on conflicts.
func (m *Manager) updateCABundle(ctx context.Context, obj client.Object, what string, set func() bool) error {
	key := client.ObjectKeyFromObject(obj)
	for attempt := 0; attempt < 5; attempt++ {
		if err := m.client.Get(ctx, key, obj); err != nil {
			return fmt.Errorf("reading %s: %w", what, err)
		}
		if !set() {
			return nil
		}
		err := m.client.Update(ctx, obj)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("injecting the CA into %s: %w", what, err)
		}
		return nil
	}
	return fmt.Errorf("%s kept changing under us", what)
}
