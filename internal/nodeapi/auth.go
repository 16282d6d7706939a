/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// The manager asks the API server who a caller is and whether RBAC lets
// them act on a Sandbox, as kubelet does for its own API.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Defaults of AuthOptions. Short, so that a revoked RoleBinding or a deleted
// ServiceAccount stops working within seconds, yet a busy agent does not
// send a review per command.
const (
	DefaultTokenCacheTTL = time.Minute
	DefaultAllowCacheTTL = 30 * time.Second
	DefaultDenyCacheTTL  = 10 * time.Second
)

// AuthOptions configure NewDelegatingAuth.
type AuthOptions struct {
	// ClientCAFile, when set, also accepts client certificates signed by
	// this CA bundle; the user is the certificate's CommonName and the
	// groups its Organizations (as kubelet's --client-ca-file). The file is
	// re-read when it changes.
	ClientCAFile string
	// TokenCacheTTL is how long a TokenReview answer is reused.
	TokenCacheTTL time.Duration
	// AllowCacheTTL and DenyCacheTTL are how long SubjectAccessReview
	// answers are reused.
	AllowCacheTTL time.Duration
	DenyCacheTTL  time.Duration
	// ReviewTimeout bounds one TokenReview or SubjectAccessReview.
	ReviewTimeout time.Duration
}

// Auth is the delegating authenticator and authorizer of the node API.
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// clientCA reloads ClientCAFile; nil without one.
	clientCA *dynamiccertificates.DynamicFileCAContent
}

// NewDelegatingAuth builds authentication by TokenReview (and optionally
// client certificates) and authorisation by SubjectAccessReview against the
// API server that cs talks to. Run Start (a manager Runnable) to follow
// changes of the client CA file.
func NewDelegatingAuth(cs kubernetes.Interface, opts AuthOptions) (*Auth, error) {
	if opts.TokenCacheTTL <= 0 {
		opts.TokenCacheTTL = DefaultTokenCacheTTL
	}
	if opts.AllowCacheTTL <= 0 {
		opts.AllowCacheTTL = DefaultAllowCacheTTL
	}
	if opts.DenyCacheTTL <= 0 {
		opts.DenyCacheTTL = DefaultDenyCacheTTL
	}
	if opts.ReviewTimeout <= 0 {
		opts.ReviewTimeout = 10 * time.Second
	}
	// A review that fails for a transient reason is retried briefly; past
	// that the caller gets 401/403 and retries themselves.
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 3}

	a := &Auth{}
	authnConfig := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  cs.AuthenticationV1(),
		TokenAccessReviewTimeout: opts.ReviewTimeout,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 opts.TokenCacheTTL,
	}
	if opts.ClientCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("node-api-client-ca", opts.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("loading node API client CA %s: %w", opts.ClientCAFile, err)
		}
		a.clientCA = ca
		authnConfig.ClientCertificateCAContentProvider = ca
	}
	authn, _, err := authnConfig.New()
	if err != nil {
		return nil, fmt.Errorf("building node API authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             opts.AllowCacheTTL,
		DenyCacheTTL:              opts.DenyCacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("building node API authorizer: %w", err)
	}
	a.Authenticator, a.Authorizer = authn, authz
	return a, nil
}

// RequestsClientCerts reports whether the TLS server should ask clients for
// a certificate.
func (a *Auth) RequestsClientCerts() bool { return a != nil && a.clientCA != nil }

// Start follows changes of the client CA file until ctx ends. It is a
// manager Runnable.
func (a *Auth) Start(ctx context.Context) error {
	if a.clientCA != nil {
		a.clientCA.Run(ctx, 1)
		return nil
	}
	<-ctx.Done()
	return nil
}

// NeedLeaderElection is false: every node's manager serves its own API.
func (a *Auth) NeedLeaderElection() bool { return false }

// statusCodecs encode the impersonation filter's refusals as metav1.Status.
var statusCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return serializer.NewCodecFactory(s)
}()

// withImpersonation applies Impersonate-User, -Group, -Uid and -Extra-*
// headers exactly as kube-apiserver does: every impersonated attribute needs
// the "impersonate" verb on users, groups, serviceaccounts, uids or
// userextras for the authenticated caller, checked by SubjectAccessReview.
// After it, the request acts as the impersonated user for authorisation,
// history and logs.
func withImpersonation(next http.Handler, authz authorizer.Authorizer) http.Handler {
	filter := impersonation.WithImpersonation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Accept")
		if accept, ok := r.Context().Value(acceptKey{}).([]string); ok {
			r.Header["Accept"] = accept
		}
		next.ServeHTTP(w, r)
	}), authz, statusCodecs.WithoutConversion())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The filter negotiates its error bodies from Accept; our clients
		// may accept only NDJSON or tar, and a refusal must still be a
		// 403 Status rather than a 406.
		if accept := r.Header.Values("Accept"); len(accept) > 0 {
			r = r.WithContext(context.WithValue(r.Context(), acceptKey{}, accept))
			r.Header.Set("Accept", "application/json")
		}
		filter.ServeHTTP(w, r)
	})
}

type acceptKey struct{}

// authenticate runs the authenticator and stores the user in the request's
// context, where the impersonation filter and the handlers find it.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, ok, err := s.cfg.Authenticator.AuthenticateRequest(r)
		if err != nil || !ok {
			log := s.log.WithValues("path", r.URL.Path, "remote", r.RemoteAddr)
			if err != nil {
				log.V(1).Info("authentication failed", "error", err.Error())
			}
			// Like kube-apiserver, say nothing about why: a probing caller
			// learns only that the credentials were not accepted.
			writeError(w, newError(http.StatusUnauthorized, metav1.StatusReasonUnauthorized,
				"Unauthorized: send a Kubernetes bearer token (Authorization: Bearer …) or a client certificate the node API trusts"))
			return
		}
		// Credentials go no further than this filter.
		r.Header.Del("Authorization")
		next.ServeHTTP(w, r.WithContext(genericrequest.WithUser(r.Context(), resp.User)))
	})
}

// authorize checks RBAC on the Sandbox's subresource for the (possibly
// impersonated) user.
func (s *Server) authorize(ctx context.Context, rt route) *apiError {
	u, ok := genericrequest.UserFrom(ctx)
	if !ok {
		return newError(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
	}
	attrs := authorizer.AttributesRecord{
		User:            u,
		Verb:            rt.verb,
		Namespace:       rt.namespace,
		APIGroup:        sandboxv1alpha1.GroupVersion.Group,
		APIVersion:      sandboxv1alpha1.GroupVersion.Version,
		Resource:        "sandboxes",
		Subresource:     rt.rbacSubresource,
		Name:            rt.name,
		ResourceRequest: true,
		Path:            rt.path,
	}
	decision, reason, err := s.cfg.Authorizer.Authorize(ctx, attrs)
	if decision == authorizer.DecisionAllow {
		return nil
	}
	if err != nil {
		s.log.Error(err, "authorisation check failed", "user", u.GetName())
	}
	msg := fmt.Sprintf("%s %q is forbidden: User %q cannot %s resource \"sandboxes/%s\" in API group %q in the namespace %q",
		"sandboxes", rt.name, u.GetName(), rt.verb, rt.rbacSubresource, sandboxv1alpha1.GroupVersion.Group, rt.namespace)
	if reason != "" {
		msg += ": " + reason
	}
	return newError(http.StatusForbidden, metav1.StatusReasonForbidden, "%s", msg)
}

// callerName is who history and logs record for a request.
func callerName(ctx context.Context) string {
	if u, ok := genericrequest.UserFrom(ctx); ok {
		return u.GetName()
	}
	return user.Anonymous
}
