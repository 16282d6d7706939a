/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package webhookcert gives the admission webhook a serving certificate
// without cert-manager: it keeps a CA and a certificate signed by it in a
// Secret that every webhook replica shares, writes them where the webhook
// server reads them, and injects the CA into the
// ValidatingWebhookConfiguration so that the API server trusts it. It
// renews the certificate well before it expires; the webhook server reloads
// the files by itself.
package webhookcert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// The webhook reads and writes its own certificate Secret and patches the
// CA into its own webhook configuration, nothing else. The Secret rule is
// namespaced to the webhook's namespace ("system" before kustomize's
// namespace transform); create cannot be limited by name.
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;update;patch,resourceNames=code-sandbox-validating-webhook-configuration

// Secret data keys.
const (
	KeyCACert = "ca.crt"
	KeyCAKey  = "ca.key"
	KeyCert   = "tls.crt"
	KeyKey    = "tls.key"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 365 * 24 * time.Hour
	// renewBefore: a certificate with less than this left is replaced.
	renewBefore = 90 * 24 * time.Hour
)

// Options say where the certificate lives and whom it is for.
type Options struct {
	// Namespace and SecretName name the Secret holding the CA and the
	// serving certificate.
	Namespace  string
	SecretName string
	// WebhookConfiguration is the ValidatingWebhookConfiguration whose
	// webhooks get the CA bundle; empty skips injection.
	WebhookConfiguration string
	// Hosts are the DNS names and IP addresses the certificate covers:
	// the Service's names in a cluster, 127.0.0.1 for a local run.
	Hosts []string
	// CertDir receives tls.crt and tls.key for the webhook server.
	CertDir string
	// Clock is injectable for tests of renewal.
	Clock clock.PassiveClock
}

// Manager keeps the certificate current.
type Manager struct {
	client client.Client
	opts   Options
}

// New returns a Manager; c should read from the API server directly, since
// it runs before any cache has started.
func New(c client.Client, opts Options) (*Manager, error) {
	switch {
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
	return &Manager{client: c, opts: opts}, nil
}

// Prepare makes sure the Secret holds a valid certificate for the hosts and
// writes it to CertDir. Replicas race safely: creating and updating the
// Secret is optimistic, and a loser adopts the winner's.
func (m *Manager) Prepare(ctx context.Context) ([]byte, error) {
	secret, err := m.ensureSecret(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.writeFiles(secret); err != nil {
		return nil, err
	}
	return secret.Data[KeyCACert], nil
}

// Ensure prepares the certificate and injects its CA into the webhook
// configuration.
func (m *Manager) Ensure(ctx context.Context) error {
	caPEM, err := m.Prepare(ctx)
	if err != nil {
		return err
	}
	return m.inject(ctx, caPEM)
}

// Start implements manager.Runnable: it re-checks periodically, which
// renews the certificate and restores the CA bundle if the webhook
// configuration was re-applied without it.
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
	for attempt := 0; attempt < 5; attempt++ {
		secret := &corev1.Secret{}
		err := m.client.Get(ctx, key, secret)
		if apierrors.IsNotFound(err) {
			data, err := m.generate(nil)
			if err != nil {
				return nil, err
			}
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: key.Namespace, Name: key.Name,
					Labels: map[string]string{"app.kubernetes.io/managed-by": "code-sandbox-operator"},
				},
				Type: corev1.SecretTypeTLS,
				Data: data,
			}
			err = m.client.Create(ctx, secret)
			if apierrors.IsAlreadyExists(err) {
				continue // another replica won; use theirs
			}
			if err != nil {
				return nil, fmt.Errorf("creating Secret %s: %w", key, err)
			}
			return secret, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading Secret %s: %w", key, err)
		}
		if m.valid(secret.Data) {
			return secret, nil
		}
		data, err := m.generate(secret.Data)
		if err != nil {
			return nil, err
		}
		secret.Data = data
		err = m.client.Update(ctx, secret)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("updating Secret %s: %w", key, err)
		}
		return secret, nil
	}
	return nil, fmt.Errorf("Secret %s kept changing under us; giving up for now", key)
}

// valid reports whether data holds a CA and a matching serving certificate
// that covers every host and has more than renewBefore left.
func (m *Manager) valid(data map[string][]byte) bool {
	ca, _, err := parseCA(data)
	if err != nil || m.opts.Clock.Now().Add(renewBefore).After(ca.NotAfter) {
		return false
	}
	pair, err := tls.X509KeyPair(data[KeyCert], data[KeyKey])
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || m.opts.Clock.Now().Add(renewBefore).After(leaf.NotAfter) {
		return false
	}
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		return false
	}
	for _, h := range m.opts.Hosts {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// generate returns a serving certificate for the hosts, signed by the CA in
// old when that CA is still good for long enough, else by a new CA.
func (m *Manager) generate(old map[string][]byte) (map[string][]byte, error) {
	now := m.opts.Clock.Now()
	ca, caKey, err := parseCA(old)
	caPEM, caKeyPEM := old[KeyCACert], old[KeyCAKey]
	if err != nil || now.Add(certValidity+renewBefore).After(ca.NotAfter) {
		ca, caKey, caPEM, caKeyPEM, err = newCA(now)
		if err != nil {
			return nil, err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: m.opts.Hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range m.opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the webhook certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		KeyCACert: caPEM,
		KeyCAKey:  caKeyPEM,
		KeyCert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyKey:    pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "code-sandbox-webhook-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("creating the webhook CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return ca, key,
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func parseCA(data map[string][]byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data[KeyCACert])
	if block == nil {
		return nil, nil, errors.New("no CA certificate")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, err
	}
	keyBlock, _ := pem.Decode(data[KeyCAKey])
	if keyBlock == nil {
		return nil, nil, errors.New("no CA key")
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	if !key.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("the CA key does not match the CA certificate")
	}
	return ca, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
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

// inject puts the CA into every webhook of the configuration.
func (m *Manager) inject(ctx context.Context, caPEM []byte) error {
	if m.opts.WebhookConfiguration == "" {
		return nil
	}
	for attempt := 0; attempt < 5; attempt++ {
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := m.client.Get(ctx, client.ObjectKey{Name: m.opts.WebhookConfiguration}, cfg); err != nil {
			return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", m.opts.WebhookConfiguration, err)
		}
		changed := false
		for i := range cfg.Webhooks {
			if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, caPEM) {
				cfg.Webhooks[i].ClientConfig.CABundle = slices.Clone(caPEM)
				changed = true
			}
		}
		if !changed {
			return nil
		}
		err := m.client.Update(ctx, cfg)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("injecting the CA into ValidatingWebhookConfiguration %s: %w", m.opts.WebhookConfiguration, err)
		}
		return nil
	}
	return fmt.Errorf("ValidatingWebhookConfiguration %s kept changing under us", m.opts.WebhookConfiguration)
}
