/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authentication/user"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// NewFrontProxyAuthenticator is the node API's only authenticator. The node
// API is a backend of the operator's aggregated API server, exactly as that
// server is a backend of kube-apiserver: it trusts a request only when the
// TLS client certificate chains to the operator CA (pool, re-read on every
// request so that a rotated CA takes effect), is for client auth, and names
// one of allowedNames. The end user that the front proxy authenticated and
// authorised arrives in the X-Remote-User/-Group/-Extra-* headers, which are
// used only to record who ran what. A node never sees a bearer token and
// never asks the API server about one.
func NewFrontProxyAuthenticator(pool func() *x509.CertPool, allowedNames []string) (authenticator.Request, error) {
	if pool == nil || len(allowedNames) == 0 {
		return nil, errors.New("node API: a client CA and at least one allowed client name are required")
	}
	verify := func() (x509.VerifyOptions, bool) {
		p := pool()
		if p == nil {
			return x509.VerifyOptions{}, false
		}
		return x509.VerifyOptions{Roots: p, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
	}
	return headerrequest.NewDynamicVerifyOptionsSecure(verify,
		headerrequest.StaticStringSlice(allowedNames),
		headerrequest.StaticStringSlice{subresource.HeaderRemoteUser},
		headerrequest.StaticStringSlice{subresource.HeaderRemoteUID},
		headerrequest.StaticStringSlice{subresource.HeaderRemoteGroup},
		headerrequest.StaticStringSlice{subresource.HeaderRemoteExtraPrefix},
	), nil
}

// VerifyClientChain is the TLS-level check of the same rule, so that a peer
// without an operator client certificate is refused in the handshake,
// before it can send a byte of HTTP.
func VerifyClientChain(pool func() *x509.CertPool) func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	return func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
		if len(rawCerts) == 0 {
			return errors.New("node API: a client certificate issued by the operator CA is required")
		}
		certs := make([]*x509.Certificate, 0, len(rawCerts))
		for _, raw := range rawCerts {
			c, err := x509.ParseCertificate(raw)
			if err != nil {
				return fmt.Errorf("node API: client certificate: %w", err)
			}
			certs = append(certs, c)
		}
		p := pool()
		if p == nil {
			return errors.New("node API: the operator CA bundle is not loaded yet")
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: p, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if err != nil {
			return fmt.Errorf("node API: client certificate %q is not from the operator CA: %w", certs[0].Subject.CommonName, err)
		}
		return nil
	}
}

// authenticate runs the authenticator and stores the user in the request's
// context, where the handlers find it.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, ok, err := s.cfg.Authenticator.AuthenticateRequest(r)
		if err != nil || !ok {
			log := s.log.WithValues("path", r.URL.Path, "remote", r.RemoteAddr)
			if err != nil {
				log.V(1).Info("authentication failed", "error", err.Error())
			}
			writeError(w, newError(http.StatusUnauthorized, metav1.StatusReasonUnauthorized,
				"Unauthorized: the node API serves only the operator's aggregated API server; use kubectl sandbox or the API server's sandboxes/{exec,files,log,history} subresources"))
			return
		}
		// A bearer token has no business here; make sure none travels on.
		r.Header.Del("Authorization")
		next.ServeHTTP(w, r.WithContext(genericrequest.WithUser(r.Context(), resp.User)))
	})
}

// callerName is who history and logs record for a request.
func callerName(ctx context.Context) string {
	if u, ok := genericrequest.UserFrom(ctx); ok {
		return u.GetName()
	}
	return user.Anonymous
}
