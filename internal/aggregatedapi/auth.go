/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package aggregatedapi

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	genericserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
)

// Auth is the delegating authentication and authorisation of the
// aggregated API server, built by k8s.io/apiserver exactly as for any
// extension API server: kube-apiserver's front-proxy certificate and
// allowed names, its client CA and the X-Remote-* header names are read
// from the kube-system/extension-apiserver-authentication ConfigMap and
// followed as they change; bearer tokens of direct callers go to
// TokenReview; decisions come from SubjectAccessReview. Answers are cached
// briefly, so a busy agent costs the API server little.
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	clientCA      interface {
		RunOnce(context.Context) error
		Run(context.Context, int)
	}
}

// Cache lifetimes of the reviews: short, so that a revoked RoleBinding
// stops working within seconds.
const (
	tokenCacheTTL = 10 * time.Second
	allowCacheTTL = 10 * time.Second
	denyCacheTTL  = 5 * time.Second
)

// NewDelegatingAuth builds Auth. kubeconfig is the file the server's own
// client uses (empty: the in-cluster configuration); k8s.io/apiserver's
// options read it themselves.
func NewDelegatingAuth(kubeconfig string, cs kubernetes.Interface) (*Auth, error) {
	authnOpts := options.NewDelegatingAuthenticationOptions()
	authnOpts.RemoteKubeConfigFile = kubeconfig
	authnOpts.CacheTTL = tokenCacheTTL
	var (
		authnInfo   genericserver.AuthenticationInfo
		servingInfo genericserver.SecureServingInfo
	)
	if err := authnOpts.ApplyTo(&authnInfo, &servingInfo, nil); err != nil {
		return nil, fmt.Errorf("aggregated API authentication: %w", err)
	}
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 3}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             allowCacheTTL,
		DenyCacheTTL:              denyCacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("aggregated API authorisation: %w", err)
	}
	a := &Auth{Authenticator: authnInfo.Authenticator, Authorizer: authz}
	if r, ok := servingInfo.ClientCA.(interface {
		RunOnce(context.Context) error
		Run(context.Context, int)
	}); ok {
		a.clientCA = r
	}
	return a, nil
}

// TLSConfig asks every client for a certificate without checking it in
// the handshake: kube-apiserver's front-proxy certificate and callers'
// client certificates are verified by the authenticator against CAs that
// may change while the server runs.
func (a *Auth) TLSConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getCertificate,
		ClientAuth:     tls.RequestClientCert,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// Start follows changes of the front-proxy and client CAs until ctx ends.
// It is a manager Runnable.
func (a *Auth) Start(ctx context.Context) error {
	if a.clientCA != nil {
		if err := a.clientCA.RunOnce(ctx); err != nil {
			return fmt.Errorf("loading the API server's client CAs: %w", err)
		}
		a.clientCA.Run(ctx, 1)
	}
	<-ctx.Done()
	return nil
}

// NeedLeaderElection is false: every replica serves.
func (a *Auth) NeedLeaderElection() bool { return false }
