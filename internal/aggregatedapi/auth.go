/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package aggregatedapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	genericserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
)

// Auth is the authentication and authorisation of the aggregated API
// server, built by k8s.io/apiserver as for any extension API server:
// kube-apiserver's front-proxy CA, allowed names and X-Remote-* header names
// are read from the kube-system/extension-apiserver-authentication ConfigMap
// and followed as they change, and decisions come from SubjectAccessReview,
// cached briefly so that a busy agent costs the API server little.
//
// Only kube-apiserver's front proxy authenticates: there is no TokenReview,
// no client-certificate login and no anonymous user. A caller who reaches
// the Service directly, even with a valid token, is refused, so every
// request has passed kube-apiserver's authentication, RBAC and audit log,
// and no caller credential reaches this server either.
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	clientCA      interface {
		RunOnce(context.Context) error
		Run(context.Context, int)
	}
}

// Cache lifetimes of the access reviews: short, so that a revoked
// RoleBinding stops working within seconds.
const (
	allowCacheTTL = 10 * time.Second
	denyCacheTTL  = 5 * time.Second
)

// NewDelegatingAuth builds Auth. kubeconfig is the file the server's own
// client uses (empty: the in-cluster configuration); k8s.io/apiserver's
// options read it themselves to find the front-proxy configuration.
func NewDelegatingAuth(kubeconfig string, cs kubernetes.Interface) (*Auth, error) {
	authnOpts := options.NewDelegatingAuthenticationOptions()
	authnOpts.RemoteKubeConfigFile = kubeconfig
	var (
		authnInfo   genericserver.AuthenticationInfo
		servingInfo genericserver.SecureServingInfo
	)
	if err := authnOpts.ApplyTo(&authnInfo, &servingInfo, nil); err != nil {
		return nil, fmt.Errorf("aggregated API authentication: %w", err)
	}
	if authnInfo.RequestHeaderConfig == nil {
		return nil, errors.New("aggregated API authentication: kube-apiserver publishes no front-proxy configuration (kube-system/extension-apiserver-authentication has no requestheader-client-ca-file); start it with --requestheader-client-ca-file and --proxy-client-cert-file")
	}
	// Of everything ApplyTo offers, keep the front proxy alone.
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{RequestHeaderConfig: authnInfo.RequestHeaderConfig}.New()
	if err != nil {
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
	a := &Auth{Authenticator: authn, Authorizer: authz}
	if r, ok := servingInfo.ClientCA.(interface {
		RunOnce(context.Context) error
		Run(context.Context, int)
	}); ok {
		a.clientCA = r
	}
	return a, nil
}

// TLSConfig asks every client for a certificate without checking it in
// the handshake: kube-apiserver's front-proxy certificate is verified by the
// authenticator against a CA that may change while the server runs.
func (a *Auth) TLSConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getCertificate,
		ClientAuth:     tls.RequestClientCert,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// Start follows changes of the front-proxy configuration until ctx ends.
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
