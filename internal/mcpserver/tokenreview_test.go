package mcpserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// audienceReviewer is a TokenReview API that knows tokens by the audiences
// they were issued for: a review with spec.audiences accepts a token that
// has one of them; a review without accepts a token for the API server's
// own audience, apiAudience. It records the audiences of every review.
type audienceReviewer struct {
	mu      sync.Mutex
	tokens  map[string][]string // token -> audiences it was issued for
	reviews [][]string          // spec.audiences of each review, in order
	fail    error
}

const apiAudience = "https://kubernetes.default.svc.cluster.local"

func (r *audienceReviewer) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reviews = append(r.reviews, slices.Clone(tr.Spec.Audiences))
	if r.fail != nil {
		return nil, r.fail
	}
	want := tr.Spec.Audiences
	if len(want) == 0 {
		want = []string{apiAudience}
	}
	out := tr.DeepCopy()
	has, ok := r.tokens[tr.Spec.Token]
	var common []string
	for _, a := range want {
		if slices.Contains(has, a) {
			common = append(common, a)
		}
	}
	if !ok || len(common) == 0 {
		out.Status = authnv1.TokenReviewStatus{Error: "[invalid bearer token, token audiences " + strings.Join(has, ",") + " is invalid for the target audiences " + strings.Join(want, ",") + "]"}
		return out, nil
	}
	out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: common,
		User: authnv1.UserInfo{Username: "system:serviceaccount:team-a:" + tr.Spec.Token, Groups: []string{"system:serviceaccounts"}}}
	return out, nil
}

func (r *audienceReviewer) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reviews)
}

func (r *audienceReviewer) last() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reviews[len(r.reviews)-1]
}

func newAudienceReviewer() *audienceReviewer {
	return &audienceReviewer{tokens: map[string][]string{
		"mcp":  {DefaultTokenAudience},
		"api":  {apiAudience},
		"both": {DefaultTokenAudience, apiAudience},
		"else": {"https://vault.example"},
	}}
}

var _ = Describe("TokenReview audiences", Label("unit"), func() {
	ctx := context.Background()

	It("reviews for code-sandbox-mcp by default and refuses an API-server-audience token without a second review", func() {
		r := newAudienceReviewer()
		a := NewTokenReviewAuthWithOptions(r, TokenReviewOptions{})
		c, err := a.Authenticate(ctx, "mcp")
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Username).To(Equal("system:serviceaccount:team-a:mcp"))
		Expect(r.last()).To(Equal([]string{DefaultTokenAudience}), "the review did not ask for the server's audience")

		_, err = a.Authenticate(ctx, "api")
		Expect(err).To(MatchError(ErrUnauthenticated), "an API-server-audience token was accepted by default")
		Expect(err.Error()).To(ContainSubstring("wants a token for audience " + DefaultTokenAudience))
		Expect(r.count()).To(Equal(2), "the API server's audiences were tried without --accept-apiserver-audience: %v", r.reviews)
		Expect(r.last()).To(Equal([]string{DefaultTokenAudience}))
	})

	It("uses --token-audience instead of the default", func() {
		r := newAudienceReviewer()
		a := NewTokenReviewAuthWithOptions(r, TokenReviewOptions{Audiences: []string{"https://vault.example", "other"}})
		_, err := a.Authenticate(ctx, "else")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.last()).To(Equal([]string{"https://vault.example", "other"}))
		_, err = a.Authenticate(ctx, "mcp")
		Expect(err).To(MatchError(ErrUnauthenticated), "a token for the default audience was accepted by a server with other audiences")
	})

	It("refuses an answer that does not name the server's audience", func() {
		fr := &fakeReviewer{status: authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "u"}, Audiences: []string{apiAudience}}}
		_, err := NewTokenReviewAuthWithOptions(fr, TokenReviewOptions{}).Authenticate(ctx, "t")
		Expect(err).To(MatchError(ErrUnauthenticated))
		Expect(err.Error()).To(ContainSubstring("not valid for this server's audience"))
	})

	It("with AcceptAPIServerAudience, tries the API server's audiences only after the own review refuses", func() {
		r := newAudienceReviewer()
		a := NewTokenReviewAuthWithOptions(r, TokenReviewOptions{AcceptAPIServerAudience: true, Logger: slog.New(slog.DiscardHandler)})

		_, err := a.Authenticate(ctx, "mcp")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.reviews).To(Equal([][]string{{DefaultTokenAudience}}), "a token for the server's audience needs one review")

		_, err = a.Authenticate(ctx, "both")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.count()).To(Equal(2), "a token for both audiences was reviewed for the API server: %v", r.reviews)

		c, err := a.Authenticate(ctx, "api")
		Expect(err).NotTo(HaveOccurred(), "the API-server-audience token was refused with the flag")
		Expect(c.ID).To(Equal("kube:system:serviceaccount:team-a:api"))
		Expect(r.reviews[2:]).To(Equal([][]string{{DefaultTokenAudience}, nil}), "want the own review first, then one without audiences")

		_, err = a.Authenticate(ctx, "else")
		Expect(err).To(MatchError(ErrUnauthenticated), "a token for a third audience was accepted")
		Expect(err.Error()).To(ContainSubstring("for the API server's audiences"), "the refusal does not give both reasons")
		Expect(r.reviews[4:]).To(Equal([][]string{{DefaultTokenAudience}, nil}))
	})

	It("caches each review on its own: an API-audience acceptance never passes for an own-audience one", func() {
		r := newAudienceReviewer()
		a := NewTokenReviewAuthWithOptions(r, TokenReviewOptions{AcceptAPIServerAudience: true})
		Expect(a.api).NotTo(BeIdenticalTo(a.own), "the two reviews share a cache")

		_, err := a.Authenticate(ctx, "api")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.count()).To(Equal(2))
		// Within the TTLs both answers come from the cache.
		_, err = a.Authenticate(ctx, "api")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.count()).To(Equal(2), "cache not used: %v", r.reviews)
		Expect(a.Recognizes("api")).To(BeTrue())

		// The same caches, with the API server's audiences no longer
		// accepted: the cached acceptance must not count, and the own
		// review's refusal comes from the cache.
		api := a.api
		a.api = nil
		_, err = a.Authenticate(ctx, "api")
		Expect(err).To(MatchError(ErrUnauthenticated), "the API-audience review's cached acceptance was used for the server's own audience")
		Expect(r.count()).To(Equal(2), "the own review's refusal was not cached: %v", r.reviews)
		Expect(a.Recognizes("api")).To(BeFalse(), "the API-audience review's cached acceptance was recognized for the server's own audience")

		// Once the own review's negative answer (2 s) has expired, the own
		// audience is asked again, not taken from the API review's entry
		// (10 s).
		Eventually(func() int {
			_, err := a.Authenticate(ctx, "api")
			Expect(err).To(MatchError(ErrUnauthenticated))
			return r.count()
		}).WithTimeout(tokenReviewNegativeTTL+500*time.Millisecond).WithPolling(50*time.Millisecond).Should(Equal(3), "the expired own review was not redone")
		Expect(r.last()).To(Equal([]string{DefaultTokenAudience}))
		// The API review's acceptance is still cached.
		a.api = api
		_, err = a.Authenticate(ctx, "api")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.count()).To(Equal(3), "the API review's acceptance was not cached for its TTL: %v", r.reviews)
	})

	It("looks tokens up for Recognizes without reviewing them, and without failing a concurrent Authenticate", func() {
		r := newAudienceReviewer()
		a := NewTokenReviewAuthWithOptions(r, TokenReviewOptions{})
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { a.Recognizes("mcp") })
			wg.Go(func() {
				defer GinkgoRecover()
				_, err := a.Authenticate(ctx, "mcp")
				Expect(err).NotTo(HaveOccurred())
			})
		}
		wg.Wait()
		Expect(a.Recognizes("else")).To(BeFalse())
		Expect(r.count()).To(Equal(1), "want one review for a burst of one token, and none for Recognizes: %v", r.reviews)
	})

	It("does not fall back, nor cache, when the API server does not answer", func() {
		r := newAudienceReviewer()
		r.fail = errors.New("connection refused")
		a := NewTokenReviewAuthWithOptions(r, TokenReviewOptions{AcceptAPIServerAudience: true})
		_, err := a.Authenticate(ctx, "api")
		Expect(err).To(MatchError(ErrUnavailable))
		Expect(err).NotTo(MatchError(ErrUnauthenticated))
		Expect(r.count()).To(Equal(1), "fell back to the API server's audiences after an outage: %v", r.reviews)
		r.fail = nil
		_, err = a.Authenticate(ctx, "api")
		Expect(err).NotTo(HaveOccurred(), "the outage was cached")
	})
})

var _ = Describe("caller authorization", Label("unit"), func() {
	ctx := context.Background()
	alice := Caller{ID: "kube:alice", Username: "alice", Groups: []string{"devs", "system:authenticated"}}
	bob := Caller{ID: "kube:bob", Username: "bob", Groups: []string{"system:authenticated"}}

	It("admits the users and groups of an allow-list and no one else", func() {
		Expect(AllowList{Users: []string{"alice"}}.Authorize(ctx, alice)).To(Succeed())
		Expect(AllowList{Groups: []string{"devs"}}.Authorize(ctx, alice)).To(Succeed())
		err := AllowList{Users: []string{"alice"}, Groups: []string{"devs"}}.Authorize(ctx, bob)
		Expect(err).To(MatchError(ErrForbidden))
		Expect(err.Error()).To(ContainSubstring(`"bob"`))
		Expect(AllowList{Users: []string{"anonymous"}}.Authorize(ctx, Caller{ID: AnonymousIdentity})).To(MatchError(ErrForbidden), "a non-Kubernetes caller was admitted")
		Expect(AllowList{Users: []string{"Alice"}}.Authorize(ctx, alice)).To(MatchError(ErrForbidden), "names are not compared exactly")
	})

	It("answers 403 naming what is missing, after authentication", func() {
		fr := &fakeReviewer{status: authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "bob"}, Audiences: []string{DefaultTokenAudience}}}
		auth := WithAuthorization(NewTokenReviewAuthWith(fr, nil), AllowList{Users: []string{"alice"}})
		s, err := New(Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		h, err := NewHTTPServer(s, HTTPOptions{ResourceURL: "http://127.0.0.1:8080/mcp", AllowedHosts: []string{"127.0.0.1:8080"}, Auth: auth, Logger: slog.New(slog.DiscardHandler)})
		Expect(err).NotTo(HaveOccurred())
		// Shutdown stops the session sweeper that NewHTTPServer starts.
		DeferCleanup(func() { _ = h.Shutdown(context.Background()) })
		do := func(token string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			r.Host = "127.0.0.1:8080"
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer "+token)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		w := do("bobs-token")
		Expect(w.Code).To(Equal(http.StatusForbidden), "body %s", w.Body)
		Expect(w.Body.String()).To(And(HavePrefix("Forbidden: user \"bob\""), ContainSubstring("--allow-user")))

		fr.status.User.Username = "alice"
		Expect(do("alices-token").Code).NotTo(BeElementOf(http.StatusForbidden, http.StatusUnauthorized))

		fr.status = authnv1.TokenReviewStatus{Error: "expired"}
		Expect(do("expired-token").Code).To(Equal(http.StatusUnauthorized), "a failed authentication is no longer 401")
	})
})
