package mcpserver

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var _ = Describe("HostAllowed", Label("unit"), func() {
	allowed := []string{"localhost:8080", "127.0.0.1:8080", "[::1]:8080", "mcp.example.com"}
	DescribeTable("matches the Host header against the allowed hosts",
		func(host string, want bool) {
			Expect(HostAllowed(allowed, host)).To(Equal(want), "HostAllowed(%q)", host)
		},
		Entry("localhost:8080", "localhost:8080", true),
		Entry("LOCALHOST:8080", "LOCALHOST:8080", true),
		Entry("127.0.0.1:8080", "127.0.0.1:8080", true),
		Entry("[::1]:8080", "[::1]:8080", true),
		Entry("mcp.example.com:443", "mcp.example.com:443", true),
		Entry("mcp.example.com", "mcp.example.com", true),
		Entry("localhost:9090", "localhost:9090", false),
		Entry("evil.example:8080", "evil.example:8080", false),
		Entry("127.0.0.1.nip.io:8080", "127.0.0.1.nip.io:8080", false),
		Entry("an empty host", "", false),
	)
})

var _ = Describe("OriginAllowed", Label("unit"), func() {
	allowed := []string{"http://localhost:6274"}
	DescribeTable("matches the Origin header against the allowed origins",
		func(origin string, want bool) {
			Expect(OriginAllowed(allowed, origin)).To(Equal(want), "OriginAllowed(%q)", origin)
		},
		Entry("no origin", "", true),
		Entry("http://localhost:6274", "http://localhost:6274", true),
		Entry("http://localhost:6274/", "http://localhost:6274/", true),
		Entry("https://evil.example", "https://evil.example", false),
		Entry("null", "null", false),
		Entry("http://localhost:6275", "http://localhost:6275", false),
	)
})

var _ = Describe("sessions", Label("unit"), func() {
	It("are bound to the identity that created them", func() {
		store := newSessionStore(time.Hour)
		req := func(id string) *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			return r.WithContext(WithCaller(r.Context(), Caller{ID: id}))
		}
		alice := store.ResolveSessionIdManager(req("alice"))
		bob := store.ResolveSessionIdManager(req("bob"))
		sid := alice.Generate()
		Expect(sid).To(HaveLen(32), "session id %q is not 128 random bits in hex", sid)
		Expect(strings.Trim(sid, "0123456789abcdef")).To(BeEmpty(), "session id %q is not 128 random bits in hex", sid)
		_, err := alice.Validate(sid)
		Expect(err).NotTo(HaveOccurred(), "owner refused")
		_, err = bob.Validate(sid)
		Expect(err).To(HaveOccurred(), "another identity validated the session")
		notAllowed, _ := bob.Terminate(sid)
		Expect(notAllowed).To(BeTrue(), "another identity terminated the session")
		_, err = alice.Validate("unknown")
		Expect(err).To(HaveOccurred(), "unknown session validated")
		_, err = alice.Terminate(sid)
		Expect(err).NotTo(HaveOccurred())
		terminated, err := alice.Validate(sid)
		Expect(err).NotTo(HaveOccurred(), "terminated session")
		Expect(terminated).To(BeTrue(), "terminated session")
		// Housekeeping (no request) may touch any session.
		_, err = store.ResolveSessionIdManager(nil).Validate(sid)
		Expect(err).NotTo(HaveOccurred())
	})
})

var _ = Describe("StaticTokens", Label("unit"), func() {
	It("authenticates, reloads on rotation and keeps the tokens of a broken file", func() {
		f := filepath.Join(GinkgoT().TempDir(), "tokens")
		write := func(s string) {
			GinkgoHelper()
			Expect(os.WriteFile(f, []byte(s), 0o600)).To(Succeed())
		}
		write("# comment\n\naaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n")
		st, err := NewStaticTokens(f, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		ctx := context.Background()
		c, err := st.Authenticate(ctx, "bbbbbbbbbbbbbbbbbbbb")
		Expect(err).NotTo(HaveOccurred(), "got %+v", c)
		Expect(c.ID).To(Equal("bob"), "got %+v", c)
		_, err = st.Authenticate(ctx, "cccccccccccccccccccc")
		Expect(err).To(MatchError(ErrUnauthenticated), "unknown token")
		// Rotation: the file changes, the old token stops working.
		write("cccccccccccccccccccc carol\n")
		future := time.Now().Add(2 * time.Second)
		_ = os.Chtimes(f, future, future)
		st.checkedAt = time.Time{}
		c, err = st.Authenticate(ctx, "cccccccccccccccccccc")
		Expect(err).NotTo(HaveOccurred(), "after reload: %+v", c)
		Expect(c.ID).To(Equal("carol"), "after reload: %+v", c)
		_, err = st.Authenticate(ctx, "aaaaaaaaaaaaaaaaaaaa")
		Expect(err).To(HaveOccurred(), "rotated-out token still works")
		// A broken file keeps the previous tokens.
		write("short carol\n")
		future = future.Add(2 * time.Second)
		_ = os.Chtimes(f, future, future)
		st.checkedAt = time.Time{}
		_, err = st.Authenticate(ctx, "cccccccccccccccccccc")
		Expect(err).NotTo(HaveOccurred(), "broken file dropped the tokens")
	})

	DescribeTable("parseTokens refuses a malformed file",
		func(bad string) {
			_, err := parseTokens([]byte(bad))
			Expect(err).To(HaveOccurred(), "parseTokens(%q) accepted", bad)
		},
		Entry("empty", ""),
		Entry("short token", "short alice\n"),
		Entry("no identity", "aaaaaaaaaaaaaaaaaaaa\n"),
		Entry("duplicate token", "aaaaaaaaaaaaaaaaaaaa a\naaaaaaaaaaaaaaaaaaaa b\n"),
	)
})

type fakeReviewer struct {
	calls  int
	status authnv1.TokenReviewStatus
}

func (f *fakeReviewer) Create(_ context.Context, r *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.calls++
	out := r.DeepCopy()
	out.Status = f.status
	return out, nil
}

var _ = Describe("TokenReview authentication", Label("unit"), func() {
	It("accepts reviewed tokens for the audience, caches them and refuses the rest", func() {
		fr := &fakeReviewer{status: authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:team-a:agent", Groups: []string{"g"}}, Audiences: []string{"code-sandbox-mcp"}}}
		a := NewTokenReviewAuthWith(fr, []string{"code-sandbox-mcp"})
		ctx := context.Background()
		c, err := a.Authenticate(ctx, "tok")
		Expect(err).NotTo(HaveOccurred(), "got %+v", c)
		Expect(c.ID).To(Equal("kube:system:serviceaccount:team-a:agent"), "got %+v", c)
		Expect(c.Groups).To(HaveLen(1), "got %+v", c)
		_, err = a.Authenticate(ctx, "tok")
		Expect(err).NotTo(HaveOccurred(), "cache not used")
		Expect(fr.calls).To(Equal(1), "cache not used")
		fr.status.Audiences = []string{"https://kubernetes.default.svc"}
		_, err = a.Authenticate(ctx, "other")
		Expect(err).To(MatchError(ErrUnauthenticated), "wrong audience accepted")
		fr.status = authnv1.TokenReviewStatus{Authenticated: false, Error: "expired"}
		_, err = a.Authenticate(ctx, "third")
		Expect(err).To(MatchError(ErrUnauthenticated), "unauthenticated token accepted")
	})
})

var _ = Describe("the HTTP middleware", Label("unit"), func() {
	It("checks the host, origin, token and body size, and serves /healthz", func() {
		s, err := New(Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		f := filepath.Join(GinkgoT().TempDir(), "tokens")
		_ = os.WriteFile(f, []byte("aaaaaaaaaaaaaaaaaaaa alice\n"), 0o600)
		auth, err := NewStaticTokens(f, nil)
		Expect(err).NotTo(HaveOccurred())
		h, err := NewHTTPServer(s, HTTPOptions{
			ResourceURL:  "http://127.0.0.1:8080/mcp",
			AllowedHosts: []string{"127.0.0.1:8080"},
			Auth:         auth,
			MaxBodyBytes: 1024,
			Logger:       slog.New(slog.DiscardHandler),
		})
		Expect(err).NotTo(HaveOccurred())
		do := func(host, origin, token, target, body string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
			r.Host = host
			r.Header.Set("Content-Type", "application/json")
			if origin != "" {
				r.Header.Set("Origin", origin)
			}
			if token != "" {
				r.Header.Set("Authorization", "Bearer "+token)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		const ping = `{"jsonrpc":"2.0","id":1,"method":"ping"}`
		good := "aaaaaaaaaaaaaaaaaaaa"
		Expect(do("evil:8080", "", good, "/mcp", ping).Code).To(Equal(http.StatusForbidden), "rebinding host")
		Expect(do("127.0.0.1:8080", "https://evil.example", good, "/mcp", ping).Code).To(Equal(http.StatusForbidden), "evil origin")
		w := do("127.0.0.1:8080", "", "", "/mcp", ping)
		Expect(w.Code).To(Equal(http.StatusUnauthorized), "no token")
		Expect(w.Header().Get("WWW-Authenticate")).To(ContainSubstring(`resource_metadata="http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"`), "no token")
		w = do("127.0.0.1:8080", "", "nope", "/mcp", ping)
		Expect(w.Code).To(Equal(http.StatusUnauthorized), "bad token")
		Expect(w.Header().Get("WWW-Authenticate")).To(ContainSubstring("invalid_token"), "bad token")
		Expect(do("127.0.0.1:8080", "", "", "/mcp?access_token="+good, ping).Code).To(Equal(http.StatusBadRequest), "query token")
		Expect(do("127.0.0.1:8080", "", good, "/mcp", strings.Repeat("x", 2048)).Code).To(Equal(http.StatusRequestEntityTooLarge), "big body")
		Expect(do("10.0.0.1:8080", "", "", "/healthz", "").Code).To(Equal(http.StatusOK), "healthz")
	})

	It("rate-limits each identity separately", func() {
		s, err := New(Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		f := filepath.Join(GinkgoT().TempDir(), "tokens")
		_ = os.WriteFile(f, []byte("aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n"), 0o600)
		auth, err := NewStaticTokens(f, nil)
		Expect(err).NotTo(HaveOccurred())
		h, err := NewHTTPServer(s, HTTPOptions{
			ResourceURL:       "http://127.0.0.1:8080/mcp",
			AllowedHosts:      []string{"127.0.0.1:8080"},
			Auth:              auth,
			RequestsPerSecond: 0.001, // no refill within the test
			Burst:             3,
			Logger:            slog.New(slog.DiscardHandler),
		})
		Expect(err).NotTo(HaveOccurred())
		do := func(token string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			r.Host = "127.0.0.1:8080"
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer "+token)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		for i := range 3 {
			Expect(do("aaaaaaaaaaaaaaaaaaaa").Code).NotTo(Equal(http.StatusTooManyRequests), "request %d within the burst was limited", i+1)
		}
		w := do("aaaaaaaaaaaaaaaaaaaa")
		Expect(w.Code).To(Equal(http.StatusTooManyRequests), "request beyond the burst: want 429 with Retry-After")
		Expect(w.Header().Get("Retry-After")).NotTo(BeEmpty(), "request beyond the burst: want 429 with Retry-After")
		Expect(w.Body.String()).To(ContainSubstring("per second"), "429 body does not say why")
		Expect(do("bbbbbbbbbbbbbbbbbbbb").Code).NotTo(Equal(http.StatusTooManyRequests), "another identity was limited by alice's requests")
	})
})
