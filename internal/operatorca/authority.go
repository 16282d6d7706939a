/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// The CA holder (the --role control-plane Deployment) reads and writes the CA
// Secret and the bundle ConfigMap in its own namespace ("system" before
// kustomize's namespace transform); create cannot be limited by name.
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets;configmaps,verbs=get;create;update

const (
	// CAValidity is the lifetime of a new operator CA.
	CAValidity = 10 * 365 * 24 * time.Hour
	// CARotateBefore: a CA with less than this left is replaced by a new
	// one; the old one stays in the bundle until it expires, so everything
	// it issued keeps verifying meanwhile.
	CARotateBefore = 365 * 24 * time.Hour
	// ClientCertValidity is the lifetime of the in-process client
	// certificates (ClientCertificate); they are re-issued at 2/3 of it.
	ClientCertValidity = 24 * time.Hour
	// caCommonName prefixes each generation's CA name; the creation time
	// follows, so that generations are told apart.
	caCommonName = "code-sandbox-operator-ca"
)

// LabelManagedBy marks the objects the operator creates for itself.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "code-sandbox-operator"
)

// AuthorityOptions say where the CA lives.
type AuthorityOptions struct {
	// Namespace holds the Secret and the ConfigMap (the operator's).
	Namespace string
	// SecretName is the CA Secret (default DefaultCASecret), readable
	// only by the CA holder.
	SecretName string
	// BundleConfigMap publishes the CA certificates (default
	// DefaultBundleConfigMap), readable by the node managers.
	BundleConfigMap string
	// Clock decides expiry and rotation (default the real clock).
	Clock clock.PassiveClock
	// CheckInterval is how often Start re-checks (default one minute).
	CheckInterval time.Duration
}

// Authority is the operator CA kept in the Secret <Namespace>/<SecretName>
// (keys ca.crt, ca.key). Whichever replica comes first creates it; the
// others adopt it (creates and updates are optimistic). The public bundle,
// every CA certificate still valid, is published in the ConfigMap
// <Namespace>/<BundleConfigMap> under ca.crt before anything is signed with
// a new CA. A CA with less than CARotateBefore left is replaced; the old
// certificate stays in the bundle until it expires.
//
// To revoke the CA (a leaked key), delete both the Secret and the ConfigMap:
// the next Ensure makes a new CA and a bundle that holds only it.
type Authority struct {
	client client.Client
	opts   AuthorityOptions

	mu        sync.RWMutex
	current   *CA
	bundlePEM []byte
	pool      *x509.CertPool

	clientMu sync.Mutex
	clients  map[string]*tls.Certificate
}

// NewAuthority returns an Authority; c should read from the API server
// directly, since Ensure runs before any cache has started.
func NewAuthority(c client.Client, opts AuthorityOptions) (*Authority, error) {
	if c == nil {
		return nil, errors.New("operator CA: no Kubernetes client")
	}
	if opts.Namespace == "" {
		return nil, errors.New("operator CA: the namespace is not set (POD_NAMESPACE)")
	}
	if opts.SecretName == "" {
		opts.SecretName = DefaultCASecret
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
	return &Authority{client: c, opts: opts, clients: map[string]*tls.Certificate{}}, nil
}

// Ensure makes sure the Secret holds a CA good for more than
// CARotateBefore and that the bundle ConfigMap holds it, then makes it the
// current CA.
func (a *Authority) Ensure(ctx context.Context) error {
	ca, err := a.ensureSecret(ctx)
	if err != nil {
		return err
	}
	bundlePEM, err := a.ensureBundle(ctx, ca)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundlePEM)
	a.mu.Lock()
	a.current, a.bundlePEM, a.pool = ca.WithClock(a.opts.Clock), bundlePEM, pool
	a.mu.Unlock()
	return nil
}

// Start implements manager.Runnable: it re-checks every CheckInterval
// (rotation, a deleted Secret or ConfigMap), and retries failures sooner.
func (a *Authority) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("operator-ca")
	for {
		interval := a.opts.CheckInterval
		if err := a.Ensure(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "keeping the operator CA current; retrying")
			interval = min(interval, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica issues certificates, so every replica loads the CA.
func (a *Authority) NeedLeaderElection() bool { return false }

// Current is the CA that signs, nil before the first successful Ensure.
func (a *Authority) Current() *CA {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.current
}

// Pool is the bundle: every CA certificate still valid. Nil before the
// first successful Ensure.
func (a *Authority) Pool() *x509.CertPool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.pool
}

// BundlePEM is the bundle PEM-encoded, as published (for caBundle fields).
func (a *Authority) BundlePEM() []byte {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return bytes.Clone(a.bundlePEM)
}

// ClientCertificate returns a tls.Config.GetClientCertificate callback with
// a client certificate for commonName issued by the current CA. It is
// cached and re-issued at 2/3 of ClientCertValidity, or at once when its CA
// has left the bundle.
func (a *Authority) ClientCertificate(commonName string) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return a.clientCertificate(commonName)
	}
}

func (a *Authority) clientCertificate(commonName string) (*tls.Certificate, error) {
	a.clientMu.Lock()
	defer a.clientMu.Unlock()
	now := a.opts.Clock.Now()
	pool := a.Pool()
	if c := a.clients[commonName]; c != nil && now.Before(RenewalTime(c.Leaf)) && pool != nil {
		if _, err := c.Leaf.Verify(x509.VerifyOptions{
			Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}); err == nil {
			return c, nil
		}
	}
	ca := a.Current()
	if ca == nil {
		return nil, errors.New("the operator CA is not loaded yet")
	}
	c, err := ca.IssueClient(commonName, nil, ClientCertValidity)
	if err != nil {
		return nil, err
	}
	a.clients[commonName] = c
	return c, nil
}

// RenewalTime is when a certificate should be replaced: at 2/3 of its
// lifetime.
func RenewalTime(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// usable reports whether ca can go on signing at now.
func (a *Authority) usable(ca *CA, now time.Time) bool {
	return now.Add(CARotateBefore).Before(ca.Certificate().NotAfter)
}

func (a *Authority) newCA() (*CA, error) {
	now := a.opts.Clock.Now()
	return NewCA(fmt.Sprintf("%s@%d", caCommonName, now.Unix()), CAValidity, now)
}

func (a *Authority) ensureSecret(ctx context.Context) (*CA, error) {
	key := client.ObjectKey{Namespace: a.opts.Namespace, Name: a.opts.SecretName}
	load := func(data map[string][]byte) (*CA, error) { return LoadCA(data[BundleKey], data[KeyCAKey]) }
	secret, written, err := EnsureSecret(ctx, a.client, key, corev1.SecretTypeOpaque,
		func(data map[string][]byte) bool {
			ca, err := load(data)
			return err == nil && a.usable(ca, a.opts.Clock.Now())
		},
		// Missing, broken or near its end: replace it.
		func(old map[string][]byte) (map[string][]byte, error) {
			ca, err := a.newCA()
			if err != nil {
				return nil, err
			}
			data := map[string][]byte{}
			for k, v := range old {
				data[k] = v
			}
			data[BundleKey], data[KeyCAKey] = ca.CertPEM(), ca.KeyPEM()
			return data, nil
		})
	if err != nil {
		return nil, err
	}
	ca, err := load(secret.Data)
	if err != nil {
		return nil, fmt.Errorf("operator CA Secret %s: %w", key, err)
	}
	if written {
		logf.FromContext(ctx).Info("stored a new operator CA", "secret", key, "notAfter", ca.Certificate().NotAfter)
	}
	return ca, nil
}

// ensureBundle makes the ConfigMap hold ca and every other CA certificate
// it held that is still valid, in their order, and returns that bundle.
func (a *Authority) ensureBundle(ctx context.Context, ca *CA) ([]byte, error) {
	key := client.ObjectKey{Namespace: a.opts.Namespace, Name: a.opts.BundleConfigMap}
	for range 5 {
		cm := &corev1.ConfigMap{}
		err := a.client.Get(ctx, key, cm)
		if apierrors.IsNotFound(err) {
			want := a.bundle(nil, ca)
			cm = &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
				Data:       map[string]string{BundleKey: string(want)},
			}
			err = a.client.Create(ctx, cm)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("creating ConfigMap %s: %w", key, err)
			}
			return want, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading ConfigMap %s: %w", key, err)
		}
		want := a.bundle([]byte(cm.Data[BundleKey]), ca)
		if cm.Data[BundleKey] == string(want) {
			return want, nil
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[BundleKey] = string(want)
		err = a.client.Update(ctx, cm)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("updating ConfigMap %s: %w", key, err)
		}
		return want, nil
	}
	return nil, fmt.Errorf("ConfigMap %s kept changing under us; giving up for now", key)
}

// bundle keeps the CA certificates of old that are still valid, once each
// (anything else is dropped), and adds current if it is missing.
func (a *Authority) bundle(old []byte, current *CA) []byte {
	now := a.opts.Clock.Now()
	var out []byte
	seen := map[string]bool{}
	for rest := old; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil || !c.IsCA || !now.Before(c.NotAfter) || seen[string(c.Raw)] {
			continue
		}
		seen[string(c.Raw)] = true
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	if !seen[string(current.Certificate().Raw)] {
		out = append(out, current.CertPEM()...)
	}
	return out
}
