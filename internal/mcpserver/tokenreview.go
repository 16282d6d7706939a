package mcpserver

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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

// DefaultTokenAudience is the audience --auth kubernetes requires by
// default: callers get a token for it with
// `kubectl create token SA --audience code-sandbox-mcp`. Such a token is
// good for this server only: the API server refuses it, so a server (or
// anyone in the middle) that sees it cannot replay it against the cluster.
const DefaultTokenAudience = "code-sandbox-mcp"

// TokenReviewer is the part of the Kubernetes API that TokenReviewAuth
// uses; tests substitute it.
type TokenReviewer interface {
	Create(ctx context.Context, review *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// TokenReviewOptions configure TokenReviewAuth.
type TokenReviewOptions struct {
	// Audiences are the server's own audiences: a token must be valid for
	// one of them (RFC 8707 audience binding). Empty means
	// DefaultTokenAudience.
	Audiences []string
	// AcceptAPIServerAudience also accepts tokens valid for the API
	// server's own audiences (a TokenReview without spec.audiences), tried
	// only after the review for Audiences has refused the token. This is
	// weaker: such a token can be replayed against the API server, and any
	// token a caller hands to another service for the API server becomes a
	// credential for this one.
	AcceptAPIServerAudience bool
	// Logger, when set, records each newly accepted API-server-audience
	// token's identity (as a hash), so that an operator can see who still
	// needs one for the server's audience.
	Logger *slog.Logger
}

// TokenReviewAuth authenticates bearer tokens with the Kubernetes API's
// TokenReview, as kubelet does. The token is sent only to the API server
// for review, never used to act. Identities are "kube:<username>".
type TokenReviewAuth struct {
	reviewer  TokenReviewer
	audiences []string
	acceptAPI bool
	log       *slog.Logger

	mu    sync.Mutex
	cache map[[sha256.Size]byte]reviewResult
}

// reviewKind is which review a result answers. It is part of the cache
// key, so a token the API-server-audience review accepted can never be
// taken for one the server's own audience review accepted.
type reviewKind byte

const (
	ownAudience       reviewKind = 'o'
	apiServerAudience reviewKind = 'a'
)

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

// NewTokenReviewAuth reviews tokens through cfg's API server.
func NewTokenReviewAuth(cfg *rest.Config, opts TokenReviewOptions) (*TokenReviewAuth, error) {
	client, err := authnclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating TokenReview client: %w", err)
	}
	return NewTokenReviewAuthWithOptions(client.TokenReviews(), opts), nil
}

// NewTokenReviewAuthWith uses the given reviewer and requires audiences
// (DefaultTokenAudience when empty).
func NewTokenReviewAuthWith(r TokenReviewer, audiences []string) *TokenReviewAuth {
	return NewTokenReviewAuthWithOptions(r, TokenReviewOptions{Audiences: audiences})
}

// NewTokenReviewAuthWithOptions uses the given reviewer.
func NewTokenReviewAuthWithOptions(r TokenReviewer, opts TokenReviewOptions) *TokenReviewAuth {
	aud := slices.Clone(opts.Audiences)
	if len(aud) == 0 {
		aud = []string{DefaultTokenAudience}
	}
	return &TokenReviewAuth{reviewer: r, audiences: aud, acceptAPI: opts.AcceptAPIServerAudience, log: opts.Logger,
		cache: map[[sha256.Size]byte]reviewResult{}}
}

// Authenticate implements Authenticator. The token is reviewed for the
// server's own audiences; only when that review refuses it, and
// AcceptAPIServerAudience is set, is it reviewed again for the API server's
// audiences. Each review's answer is cached on its own.
func (a *TokenReviewAuth) Authenticate(ctx context.Context, token string) (Caller, error) {
	caller, err := a.cachedReview(ctx, ownAudience, token)
	if err == nil || !a.acceptAPI || !errors.Is(err, ErrUnauthenticated) {
		return caller, err
	}
	caller, apiErr := a.cachedReview(ctx, apiServerAudience, token)
	if apiErr == nil || !errors.Is(apiErr, ErrUnauthenticated) {
		return caller, apiErr
	}
	return Caller{}, fmt.Errorf("%w; for the API server's audiences: %s", err, strings.TrimPrefix(apiErr.Error(), ErrUnauthenticated.Error()+": "))
}

// Recognizes implements TokenRecognizer: the token has an unexpired
// positive answer in the cache, from the review for the server's audiences
// or (with AcceptAPIServerAudience) the API server's.
func (a *TokenReviewAuth) Recognizes(token string) bool {
	keys := [][sha256.Size]byte{a.cacheKey(ownAudience, token)}
	if a.acceptAPI {
		keys = append(keys, a.cacheKey(apiServerAudience, token))
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, key := range keys {
		if r, ok := a.cache[key]; ok && r.err == nil && now.Before(r.expires) {
			return true
		}
	}
	return false
}

// cacheKey separates the two reviews of one token: the kind and the
// audiences asked for are digested with it.
func (a *TokenReviewAuth) cacheKey(kind reviewKind, token string) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte{byte(kind), 0})
	if kind == ownAudience {
		for _, aud := range a.audiences {
			h.Write([]byte(aud))
			h.Write([]byte{0})
		}
	}
	h.Write([]byte{0})
	h.Write([]byte(token))
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}

func (a *TokenReviewAuth) cachedReview(ctx context.Context, kind reviewKind, token string) (Caller, error) {
	key := a.cacheKey(kind, token)
	now := time.Now()
	a.mu.Lock()
	if r, ok := a.cache[key]; ok && now.Before(r.expires) {
		a.mu.Unlock()
		return r.caller, r.err
	}
	a.mu.Unlock()

	caller, err := a.review(ctx, kind, token)
	if err != nil && !errors.Is(err, ErrUnauthenticated) {
		// The API server did not answer: do not cache, and do not call it
		// a bad token.
		return Caller{}, err
	}
	ttl := tokenReviewTTL
	if err != nil {
		ttl = tokenReviewNegativeTTL
	} else if kind == apiServerAudience && a.log != nil {
		a.log.Info("accepted a token for the API server's audience (--accept-apiserver-audience); ask the caller for one with --audience "+a.audiences[0],
			"caller", IdentityHash(caller.ID))
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

// review asks the API server once. For ownAudience the review names the
// server's audiences and the answer must include one of them; for
// apiServerAudience it names none, so the API server checks the token
// against its own.
func (a *TokenReviewAuth) review(ctx context.Context, kind reviewKind, token string) (Caller, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenReviewTimeout)
	defer cancel()
	var audiences []string
	if kind == ownAudience {
		audiences = a.audiences
	}
	res, err := a.reviewer.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: audiences}}, metav1.CreateOptions{})
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
		if kind == ownAudience {
			msg += fmt.Sprintf(" (this server wants a token for audience %s)", strings.Join(a.audiences, " or "))
		}
		return Caller{}, fmt.Errorf("%w: %s", ErrUnauthenticated, msg)
	case st.User.Username == "":
		return Caller{}, fmt.Errorf("%w: token has no username", ErrUnauthenticated)
	case kind == ownAudience && !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(a.audiences, s) }):
		return Caller{}, fmt.Errorf("%w: token is not valid for this server's audience %s", ErrUnauthenticated, strings.Join(a.audiences, " or "))
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
