package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/cache"
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
	// needs one for the server's audience, and (at debug level) the API
	// server's reason for each refusal it reviewed.
	Logger *slog.Logger
}

// TokenReviewAuth authenticates bearer tokens with the Kubernetes API's
// TokenReview, as kubelet does. The token is sent only to the API server
// for review, never used to act. Identities are "kube:<username>".
//
// Answers are cached by k8s.io/apiserver's token cache (the one its
// delegating authenticator uses): acceptances for tokenReviewTTL, refusals
// for tokenReviewNegativeTTL, and an API server that did not answer not at
// all. Each review has a cache of its own, so a token the
// API-server-audience review accepted can never be taken for one the
// server's own audience review accepted.
type TokenReviewAuth struct {
	reviewer  TokenReviewer
	audiences []string
	log       *slog.Logger
	// own reviews for audiences; api, set with AcceptAPIServerAudience,
	// for the API server's.
	own, api authenticator.Token

	mu sync.Mutex
	// reviewing counts the Authenticate calls in flight per token. A cache
	// miss reviews only such a token, so that Recognizes, which looks up
	// tokens no one has authenticated yet, never causes a TokenReview.
	reviewing map[string]int
}

// errNotReviewed is a cache miss for a token no Authenticate call is
// reviewing. It is an error, and so never cached.
var errNotReviewed = errors.New("token not reviewed")

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
	a := &TokenReviewAuth{reviewer: r, audiences: slices.Clone(opts.Audiences), log: opts.Logger, reviewing: map[string]int{}}
	if len(a.audiences) == 0 {
		a.audiences = []string{DefaultTokenAudience}
	}
	a.own = a.cached(a.audiences)
	if opts.AcceptAPIServerAudience {
		a.api = a.cached(nil)
	}
	return a
}

// cached is a cache of the reviews for audiences (nil: the API server's).
// Errors are not cached: the API server did not answer.
func (a *TokenReviewAuth) cached(audiences []string) authenticator.Token {
	return cache.New(authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		return a.review(ctx, audiences, token)
	}), false, tokenReviewTTL, tokenReviewNegativeTTL)
}

// Authenticate implements Authenticator. The token is reviewed for the
// server's own audiences; only when that review refuses it, and
// AcceptAPIServerAudience is set, is it reviewed again for the API server's
// audiences.
func (a *TokenReviewAuth) Authenticate(ctx context.Context, token string) (contract.Caller, error) {
	a.mu.Lock()
	a.reviewing[token]++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.reviewing[token]--; a.reviewing[token] == 0 {
			delete(a.reviewing, token)
		}
		a.mu.Unlock()
	}()
	if c, ok, err := lookup(ctx, a.own, token); ok || err != nil {
		return c, err
	}
	aud := strings.Join(a.audiences, " or ")
	err := fmt.Errorf("%w: the token is not valid for this server's audience, or not valid at all (this server wants a token for audience %s)", ErrUnauthenticated, aud)
	if a.api == nil {
		return contract.Caller{}, err
	}
	if c, ok, apiErr := lookup(ctx, a.api, token); ok || apiErr != nil {
		return c, apiErr
	}
	return contract.Caller{}, fmt.Errorf("%w; nor for the API server's audiences", err)
}

// lookup asks the cache t. A miss joins a lookup already under way for
// the token; when that was Recognizes', which reviews nothing, it asks
// once more, and then the review happens.
func lookup(ctx context.Context, t authenticator.Token, token string) (contract.Caller, bool, error) {
	resp, ok, err := t.AuthenticateToken(ctx, token)
	if errors.Is(err, errNotReviewed) {
		resp, ok, err = t.AuthenticateToken(ctx, token)
	}
	switch {
	case err != nil && !errors.Is(err, contract.ErrUnavailable):
		return contract.Caller{}, false, fmt.Errorf("%w: TokenReview: %w", contract.ErrUnavailable, err)
	case err != nil || !ok:
		return contract.Caller{}, false, err
	}
	return resp.User.(reviewedCaller).Caller, true, nil
}

// Recognizes implements TokenRecognizer: the token has an unexpired
// positive answer in the cache, from the review for the server's audiences
// or (with AcceptAPIServerAudience) the API server's.
func (a *TokenReviewAuth) Recognizes(token string) bool {
	for _, t := range []authenticator.Token{a.own, a.api} {
		if t != nil {
			if _, ok, err := t.AuthenticateToken(context.Background(), token); ok && err == nil {
				return true
			}
		}
	}
	return false
}

// review asks the API server once, when an Authenticate call is reviewing
// the token. With audiences the review names them and the answer must
// include one of them; without, the API server checks the token against
// its own. A refusal is (nil, false, nil), which the cache keeps without a
// reason.
func (a *TokenReviewAuth) review(ctx context.Context, audiences []string, token string) (*authenticator.Response, bool, error) {
	a.mu.Lock()
	wanted := a.reviewing[token] > 0
	a.mu.Unlock()
	if !wanted {
		return nil, false, errNotReviewed
	}
	ctx, cancel := context.WithTimeout(ctx, tokenReviewTimeout)
	defer cancel()
	res, err := a.reviewer.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("%w: TokenReview failed: %w", contract.ErrUnavailable, err)
	}
	st := res.Status
	if !st.Authenticated || st.User.Username == "" ||
		(audiences != nil && !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(audiences, s) })) {
		if a.log != nil {
			a.log.Debug("TokenReview refused a token", "audiences", audiences, "authenticated", st.Authenticated, "tokenAudiences", st.Audiences, "reason", st.Error)
		}
		return nil, false, nil
	}
	c := kubeCaller(st.User)
	if audiences == nil && a.log != nil {
		a.log.Info("accepted a token for the API server's audience (--accept-apiserver-audience); ask the caller for one with --audience "+a.audiences[0],
			"caller", contract.IdentityHash(c.ID))
	}
	return &authenticator.Response{User: reviewedCaller{c}}, true, nil
}

// reviewedCaller carries a reviewed Caller through the cache.
type reviewedCaller struct{ contract.Caller }

func (c reviewedCaller) GetName() string               { return c.Username }
func (c reviewedCaller) GetUID() string                { return c.UID }
func (c reviewedCaller) GetGroups() []string           { return c.Groups }
func (c reviewedCaller) GetExtra() map[string][]string { return c.Extra }

// kubeCaller keeps everything a SubjectAccessReview needs to decide for
// the reviewed user, not just the name.
func kubeCaller(u authnv1.UserInfo) contract.Caller {
	c := contract.Caller{ID: "kube:" + u.Username, Username: u.Username, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		c.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			c.Extra[k] = []string(v)
		}
	}
	return c
}
