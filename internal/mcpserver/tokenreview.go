package mcpserver

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TokenReview cache lifetimes: short, so that a revoked token stops working
// within seconds, but long enough that a burst of MCP requests costs one
// API call.
const (
	tokenReviewTTL         = 10 * time.Second
	tokenReviewNegativeTTL = 2 * time.Second
	tokenReviewCacheMax    = 10000
	tokenReviewTimeout     = 10 * time.Second
)

// TokenReviewer is the part of the Kubernetes API that TokenReviewAuth
// uses; tests substitute it.
type TokenReviewer interface {
	Create(ctx context.Context, review *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// TokenReviewAuth authenticates bearer tokens with the Kubernetes API's
// TokenReview, as kubelet does. The token is sent only to the API server
// for review, never used to act. Identities are "kube:<username>".
type TokenReviewAuth struct {
	reviewer  TokenReviewer
	audiences []string

	mu    sync.Mutex
	cache map[[sha256.Size]byte]reviewResult
}

type reviewResult struct {
	caller  Caller
	err     error
	expires time.Time
}

// KubeRESTConfig loads a kubeconfig file, or the in-cluster configuration
// when the path is empty.
func KubeRESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// NewTokenReviewAuth reviews tokens through cfg's API server. audiences,
// when set, are required: a token must be valid for one of them (RFC 8707
// audience binding); otherwise the API server's own audiences apply.
func NewTokenReviewAuth(cfg *rest.Config, audiences []string) (*TokenReviewAuth, error) {
	client, err := authnclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating TokenReview client: %w", err)
	}
	return NewTokenReviewAuthWith(client.TokenReviews(), audiences), nil
}

// NewTokenReviewAuthWith uses the given reviewer.
func NewTokenReviewAuthWith(r TokenReviewer, audiences []string) *TokenReviewAuth {
	return &TokenReviewAuth{reviewer: r, audiences: audiences, cache: map[[sha256.Size]byte]reviewResult{}}
}

// Authenticate implements Authenticator.
func (a *TokenReviewAuth) Authenticate(ctx context.Context, token string) (Caller, error) {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	a.mu.Lock()
	if r, ok := a.cache[key]; ok && now.Before(r.expires) {
		a.mu.Unlock()
		return r.caller, r.err
	}
	a.mu.Unlock()

	caller, err := a.review(ctx, token)
	if err != nil && !errors.Is(err, ErrUnauthenticated) {
		// The API server did not answer: do not cache, and do not call it
		// a bad token.
		return Caller{}, err
	}
	ttl := tokenReviewTTL
	if err != nil {
		ttl = tokenReviewNegativeTTL
	}
	a.mu.Lock()
	if len(a.cache) >= tokenReviewCacheMax {
		for k, r := range a.cache {
			if now.After(r.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= tokenReviewCacheMax {
			clear(a.cache)
		}
	}
	a.cache[key] = reviewResult{caller: caller, err: err, expires: now.Add(ttl)}
	a.mu.Unlock()
	return caller, err
}

func (a *TokenReviewAuth) review(ctx context.Context, token string) (Caller, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenReviewTimeout)
	defer cancel()
	res, err := a.reviewer.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.audiences}}, metav1.CreateOptions{})
	if err != nil {
		return Caller{}, fmt.Errorf("%w: TokenReview failed: %w", ErrUnavailable, err)
	}
	st := res.Status
	switch {
	case !st.Authenticated:
		msg := st.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return Caller{}, fmt.Errorf("%w: %s", ErrUnauthenticated, msg)
	case st.User.Username == "":
		return Caller{}, fmt.Errorf("%w: token has no username", ErrUnauthenticated)
	case len(a.audiences) > 0 && !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(a.audiences, s) }):
		return Caller{}, fmt.Errorf("%w: token is not valid for this server's audience", ErrUnauthenticated)
	}
	return kubeCaller(st.User), nil
}

// kubeCaller keeps everything a SubjectAccessReview needs to decide for
// the reviewed user, not just the name.
func kubeCaller(u authnv1.UserInfo) Caller {
	c := Caller{ID: "kube:" + u.Username, Username: u.Username, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		c.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			c.Extra[k] = []string(v)
		}
	}
	return c
}
