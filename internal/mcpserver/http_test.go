package mcpserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestHostAllowed(t *testing.T) {
	allowed := []string{"localhost:8080", "127.0.0.1:8080", "[::1]:8080", "mcp.example.com"}
	for host, want := range map[string]bool{
		"localhost:8080":        true,
		"LOCALHOST:8080":        true,
		"127.0.0.1:8080":        true,
		"[::1]:8080":            true,
		"mcp.example.com:443":   true,
		"mcp.example.com":       true,
		"localhost:9090":        false,
		"evil.example:8080":     false,
		"127.0.0.1.nip.io:8080": false,
		"":                      false,
	} {
		if got := HostAllowed(allowed, host); got != want {
			t.Errorf("HostAllowed(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestOriginAllowed(t *testing.T) {
	allowed := []string{"http://localhost:6274"}
	for origin, want := range map[string]bool{
		"":                       true,
		"http://localhost:6274":  true,
		"http://localhost:6274/": true,
		"https://evil.example":   false,
		"null":                   false,
		"http://localhost:6275":  false,
	} {
		if got := OriginAllowed(allowed, origin); got != want {
			t.Errorf("OriginAllowed(%q) = %v, want %v", origin, got, want)
		}
	}
}

func TestSessionsAreBoundToIdentity(t *testing.T) {
	store := newSessionStore(time.Hour)
	req := func(id string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		return r.WithContext(WithCaller(r.Context(), Caller{ID: id}))
	}
	alice := store.ResolveSessionIdManager(req("alice"))
	bob := store.ResolveSessionIdManager(req("bob"))
	sid := alice.Generate()
	if len(sid) != 32 || strings.Trim(sid, "0123456789abcdef") != "" {
		t.Fatalf("session id %q is not 128 random bits in hex", sid)
	}
	if _, err := alice.Validate(sid); err != nil {
		t.Fatalf("owner refused: %v", err)
	}
	if _, err := bob.Validate(sid); err == nil {
		t.Fatal("another identity validated the session")
	}
	if notAllowed, _ := bob.Terminate(sid); !notAllowed {
		t.Fatal("another identity terminated the session")
	}
	if _, err := alice.Validate("unknown"); err == nil {
		t.Fatal("unknown session validated")
	}
	if _, err := alice.Terminate(sid); err != nil {
		t.Fatal(err)
	}
	if terminated, err := alice.Validate(sid); err != nil || !terminated {
		t.Fatalf("terminated session: %v %v", terminated, err)
	}
	// Housekeeping (no request) may touch any session.
	if _, err := store.ResolveSessionIdManager(nil).Validate(sid); err != nil {
		t.Fatal(err)
	}
}

func TestStaticTokens(t *testing.T) {
	f := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# comment\n\naaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n")
	st, err := NewStaticTokens(f, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if c, err := st.Authenticate(ctx, "bbbbbbbbbbbbbbbbbbbb"); err != nil || c.ID != "bob" {
		t.Fatalf("got %+v %v", c, err)
	}
	if _, err := st.Authenticate(ctx, "cccccccccccccccccccc"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unknown token: %v", err)
	}
	// Rotation: the file changes, the old token stops working.
	write("cccccccccccccccccccc carol\n")
	future := time.Now().Add(2 * time.Second)
	_ = os.Chtimes(f, future, future)
	st.checkedAt = time.Time{}
	if c, err := st.Authenticate(ctx, "cccccccccccccccccccc"); err != nil || c.ID != "carol" {
		t.Fatalf("after reload: %+v %v", c, err)
	}
	if _, err := st.Authenticate(ctx, "aaaaaaaaaaaaaaaaaaaa"); err == nil {
		t.Fatal("rotated-out token still works")
	}
	// A broken file keeps the previous tokens.
	write("short carol\n")
	future = future.Add(2 * time.Second)
	_ = os.Chtimes(f, future, future)
	st.checkedAt = time.Time{}
	if _, err := st.Authenticate(ctx, "cccccccccccccccccccc"); err != nil {
		t.Fatalf("broken file dropped the tokens: %v", err)
	}
	for _, bad := range []string{"", "short alice\n", "aaaaaaaaaaaaaaaaaaaa\n", "aaaaaaaaaaaaaaaaaaaa a\naaaaaaaaaaaaaaaaaaaa b\n"} {
		if _, err := parseTokens([]byte(bad)); err == nil {
			t.Errorf("parseTokens(%q) accepted", bad)
		}
	}
}

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

func TestTokenReviewAuth(t *testing.T) {
	fr := &fakeReviewer{status: authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:team-a:agent", Groups: []string{"g"}}, Audiences: []string{"code-sandbox-mcp"}}}
	a := NewTokenReviewAuthWith(fr, []string{"code-sandbox-mcp"})
	ctx := context.Background()
	c, err := a.Authenticate(ctx, "tok")
	if err != nil || c.ID != "kube:system:serviceaccount:team-a:agent" || len(c.Groups) != 1 {
		t.Fatalf("got %+v %v", c, err)
	}
	if _, err := a.Authenticate(ctx, "tok"); err != nil || fr.calls != 1 {
		t.Fatalf("cache not used: calls=%d err=%v", fr.calls, err)
	}
	fr.status.Audiences = []string{"https://kubernetes.default.svc"}
	if _, err := a.Authenticate(ctx, "other"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("wrong audience accepted: %v", err)
	}
	fr.status = authnv1.TokenReviewStatus{Authenticated: false, Error: "expired"}
	if _, err := a.Authenticate(ctx, "third"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unauthenticated token accepted: %v", err)
	}
}

func TestHTTPMiddleware(t *testing.T) {
	s, err := New(Config{}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "tokens")
	_ = os.WriteFile(f, []byte("aaaaaaaaaaaaaaaaaaaa alice\n"), 0o600)
	auth, err := NewStaticTokens(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHTTPServer(s, HTTPOptions{
		ResourceURL:  "http://127.0.0.1:8080/mcp",
		AllowedHosts: []string{"127.0.0.1:8080"},
		Auth:         auth,
		MaxBodyBytes: 1024,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
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
	if w := do("evil:8080", "", good, "/mcp", ping); w.Code != http.StatusForbidden {
		t.Errorf("rebinding host: %d", w.Code)
	}
	if w := do("127.0.0.1:8080", "https://evil.example", good, "/mcp", ping); w.Code != http.StatusForbidden {
		t.Errorf("evil origin: %d", w.Code)
	}
	w := do("127.0.0.1:8080", "", "", "/mcp", ping)
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Header().Get("WWW-Authenticate"), `resource_metadata="http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"`) {
		t.Errorf("no token: %d %q", w.Code, w.Header().Get("WWW-Authenticate"))
	}
	if w := do("127.0.0.1:8080", "", "nope", "/mcp", ping); w.Code != http.StatusUnauthorized || !strings.Contains(w.Header().Get("WWW-Authenticate"), "invalid_token") {
		t.Errorf("bad token: %d", w.Code)
	}
	if w := do("127.0.0.1:8080", "", "", "/mcp?access_token="+good, ping); w.Code != http.StatusBadRequest {
		t.Errorf("query token: %d", w.Code)
	}
	if w := do("127.0.0.1:8080", "", good, "/mcp", strings.Repeat("x", 2048)); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("big body: %d", w.Code)
	}
	if w := do("10.0.0.1:8080", "", "", "/healthz", ""); w.Code != http.StatusOK {
		t.Errorf("healthz: %d", w.Code)
	}
}

func TestRateLimitPerIdentity(t *testing.T) {
	s, err := New(Config{}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "tokens")
	_ = os.WriteFile(f, []byte("aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n"), 0o600)
	auth, err := NewStaticTokens(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHTTPServer(s, HTTPOptions{
		ResourceURL:       "http://127.0.0.1:8080/mcp",
		AllowedHosts:      []string{"127.0.0.1:8080"},
		Auth:              auth,
		RequestsPerSecond: 0.001, // no refill within the test
		Burst:             3,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
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
		if w := do("aaaaaaaaaaaaaaaaaaaa"); w.Code == http.StatusTooManyRequests {
			t.Fatalf("request %d within the burst was limited", i+1)
		}
	}
	w := do("aaaaaaaaaaaaaaaaaaaa")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("request beyond the burst: %d, Retry-After %q; want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if !strings.Contains(w.Body.String(), "per second") {
		t.Errorf("429 body does not say why: %q", w.Body.String())
	}
	if w := do("bbbbbbbbbbbbbbbbbbbb"); w.Code == http.StatusTooManyRequests {
		t.Fatal("another identity was limited by alice's requests")
	}
}
