package transport

import (
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

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
	DescribeTable("matches the Origin header against the allowed origins and the request's own loopback origin",
		func(origin, host string, want bool) {
			Expect(OriginAllowed(allowed, origin, host)).To(Equal(want), "OriginAllowed(%q, Host %q)", origin, host)
		},
		Entry("no origin", "", "127.0.0.1:8080", true),
		Entry("http://localhost:6274", "http://localhost:6274", "127.0.0.1:8080", true),
		Entry("http://localhost:6274/", "http://localhost:6274/", "127.0.0.1:8080", true),
		Entry("https://evil.example", "https://evil.example", "127.0.0.1:8080", false),
		Entry("null", "null", "127.0.0.1:8080", false),
		Entry("http://localhost:6275", "http://localhost:6275", "127.0.0.1:8080", false),
		// Same-origin loopback: what a browser client served by this server
		// sends (the conformance suite's dns-rebinding-protection scenario).
		Entry("same origin, localhost", "http://localhost:8080", "localhost:8080", true),
		Entry("same origin, 127.0.0.1", "http://127.0.0.1:8080", "127.0.0.1:8080", true),
		Entry("same origin, [::1]", "http://[::1]:8080", "[::1]:8080", true),
		Entry("same origin, https", "https://localhost:8080", "localhost:8080", true),
		Entry("another loopback port", "http://localhost:9999", "localhost:8080", false),
		Entry("a loopback origin for a non-loopback host", "http://localhost:8080", "mcp.example.com:8080", false),
		Entry("a non-loopback same origin", "https://mcp.example.com", "mcp.example.com", false),
		Entry("a rebinding name's own origin", "http://evil.example:8080", "evil.example:8080", false),
		Entry("loopback host without a port", "http://localhost", "localhost", false),
	)
})

var _ = Describe("sessions", Label("unit"), func() {
	req := func(id string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		return r.WithContext(contract.WithCaller(r.Context(), contract.Caller{ID: id}))
	}

	It("are bound to the identity that created them", func() {
		store := newSessionStore(time.Hour, -1)
		alice := store.ResolveSessionIdManager(req("alice"))
		bob := store.ResolveSessionIdManager(req("bob"))
		sid := alice.Generate()
		Expect(sid).To(MatchRegexp(`^s1-[1-9][0-9]*-[0-9a-f]{16}-[0-9a-f]{32}$`), "session id %q", sid)
		Expect(alice.Generate()).NotTo(Equal(sid), "two sessions got one ID")
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
		// Housekeeping (no request) may touch any session this replica knows.
		_, err = store.ResolveSessionIdManager(nil).Validate(sid)
		Expect(err).NotTo(HaveOccurred())
	})

	It("verify on another replica with the same key, and on no replica with another key", func() {
		a, b, other := newSessionStore(time.Hour, -1), newSessionStore(time.Hour, -1), newSessionStore(time.Hour, -1)
		key := []byte("0123456789abcdef0123456789abcdef")
		a.key = func() []byte { return key }
		b.key = func() []byte { return key }
		other.key = func() []byte { return []byte("another key of the right length!") }
		sid := a.ResolveSessionIdManager(req("alice")).Generate()
		terminated, err := b.ResolveSessionIdManager(req("alice")).Validate(sid)
		Expect(err).NotTo(HaveOccurred(), "replica B refused a session replica A issued")
		Expect(terminated).To(BeFalse())
		_, err = b.ResolveSessionIdManager(req("bob")).Validate(sid)
		Expect(err).To(HaveOccurred(), "replica B let another identity use alice's session")
		_, err = other.ResolveSessionIdManager(req("alice")).Validate(sid)
		Expect(err).To(HaveOccurred(), "a replica with another key accepted the session")
		// mcp-go's idle sweeper on B only forgets B's record.
		_, _ = b.ResolveSessionIdManager(nil).Terminate(sid)
		terminated, err = b.ResolveSessionIdManager(req("alice")).Validate(sid)
		Expect(err).NotTo(HaveOccurred(), "the idle sweeper ended a session another replica may serve")
		Expect(terminated).To(BeFalse())
	})

	It("expire after MaxSessionAge and refuse issue times in the future", func() {
		key := []byte("0123456789abcdef0123456789abcdef")
		now := time.Unix(1_800_000_000, 0)
		sid := newSessionID(key, "alice", now)
		Expect(verifySessionID(key, sid, "alice", now.Add(MaxSessionAge))).To(Succeed())
		Expect(verifySessionID(key, sid, "alice", now.Add(MaxSessionAge+time.Second))).To(MatchError(errSessionExpired))
		Expect(verifySessionID(key, newSessionID(key, "alice", now.Add(time.Hour)), "alice", now)).To(MatchError(errSessionExpired))
		Expect(verifySessionID(key, sid, "", now)).To(HaveOccurred(), "an empty identity verified")
	})

	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	good := newSessionID(key, "alice", now)
	parts := strings.Split(good, "-")
	flip := func(s string) string {
		b := []byte(s)
		if b[len(b)-1] == '0' {
			b[len(b)-1] = '1'
		} else {
			b[len(b)-1] = '0'
		}
		return string(b)
	}
	DescribeTable("refuse forged and mangled IDs",
		func(id string, want error) {
			err := verifySessionID(key, id, "alice", now)
			Expect(err).To(HaveOccurred(), "%q verified", id)
			if want != nil {
				Expect(err).To(MatchError(want), "%q", id)
			}
		},
		Entry("empty", "", errSessionMalformed),
		Entry("the old random format", strings.Repeat("ab", 16), errSessionMalformed),
		Entry("another MAC", strings.Join([]string{parts[0], parts[1], parts[2], flip(parts[3])}, "-"), errSessionMAC),
		Entry("another nonce", strings.Join([]string{parts[0], parts[1], flip(parts[2]), parts[3]}, "-"), errSessionMAC),
		Entry("a later issue time (to stretch the age)", strings.Join([]string{parts[0], "1800000001", parts[2], parts[3]}, "-"), errSessionMAC),
		Entry("a leading zero on the issue time", strings.Join([]string{parts[0], "0" + parts[1], parts[2], parts[3]}, "-"), errSessionMalformed),
		Entry("a signed issue time", strings.Join([]string{parts[0], "+" + parts[1], parts[2], parts[3]}, "-"), errSessionMalformed),
		Entry("a negative issue time", strings.Join([]string{parts[0], "-1", parts[2], parts[3]}, "-"), errSessionMalformed),
		Entry("an issue time past int64", strings.Join([]string{parts[0], "99999999999999999999", parts[2], parts[3]}, "-"), errSessionMalformed),
		Entry("upper-case hex", strings.Join([]string{parts[0], parts[1], "ABCDEF0123456789", parts[3]}, "-"), errSessionMalformed),
		Entry("another version", "s2"+good[2:], errSessionMalformed),
		Entry("a truncated MAC", good[:len(good)-1], errSessionMalformed),
		Entry("an extra field", good+"-00", errSessionMalformed),
		Entry("trailing white space", good+" ", errSessionMalformed),
		Entry("very long", good+strings.Repeat("0", 1<<16), errSessionMalformed),
		Entry("NUL bytes", strings.Replace(good, "-", "\x00", 1), errSessionMalformed),
		Entry("non-ASCII", strings.Replace(good, "a", "\u00e4", 1), nil),
	)

	It("is another identity's ID only for that identity", func() {
		Expect(verifySessionID(key, good, "alice", now)).To(Succeed())
		Expect(verifySessionID(key, good, "bob", now)).To(MatchError(errSessionMAC))
		// Identities that only differ by where a field ends.
		Expect(verifySessionID(key, newSessionID(key, "alice\x00", now), "alice", now)).To(HaveOccurred())
	})
})

var _ = Describe("two HTTP server replicas", Label("unit"), func() {
	It("serve each other's sessions, for their identity only", func() {
		a := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{MaxSessionsPerIdentity: -1})
		b := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{MaxSessionsPerIdentity: -1})
		sid := initSession(a, "192.0.2.1:1", aliceToken)
		call := func(h http.Handler, token, session, body string) *httptest.ResponseRecorder {
			return serve(h, mcpRequest("192.0.2.1:1", token, session, strings.NewReader(body)))
		}
		initialized := `{"jsonrpc":"2.0","method":"notifications/initialized"}`
		Expect(call(b, aliceToken, sid, initialized).Code).To(Equal(http.StatusAccepted))
		w := call(b, aliceToken, sid, toolCallJSON("sleep"))
		Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
		Expect(w.Body.String()).To(ContainSubstring("slept"), "replica B did not run a tool in replica A's session")
		w = call(b, aliceToken, sid, `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`)
		Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
		Expect(w.Body.String()).To(ContainSubstring(`"sleep"`))

		// Bob, on either replica, with alice's session: unknown.
		for _, h := range []http.Handler{a, b} {
			w = call(h, bobToken, sid, toolCallJSON("sleep"))
			Expect(w.Code).To(Equal(http.StatusNotFound), w.Body.String())
			Expect(w.Body.String()).NotTo(ContainSubstring("slept"))
			del := mcpRequest("192.0.2.1:1", bobToken, sid, nil)
			del.Method = http.MethodDelete
			Expect(serve(h, del).Code).To(Equal(http.StatusNotFound), "bob's DELETE of alice's session")
		}
		// A forged ID (right shape, wrong MAC) and the old random format.
		forged := sid[:len(sid)-4] + "0000"
		if forged == sid {
			forged = sid[:len(sid)-4] + "1111"
		}
		for _, bad := range []string{forged, strings.Repeat("ab", 16), "s1-1-0000000000000000-00000000000000000000000000000000", strings.Repeat("x", 4000)} {
			w = call(b, aliceToken, bad, toolCallJSON("sleep"))
			Expect(w.Code).To(Equal(http.StatusNotFound), "session %.40q: %s", bad, w.Body.String())
		}
		// Alice ends the session on B: B refuses it afterwards.
		del := mcpRequest("192.0.2.1:1", aliceToken, sid, nil)
		del.Method = http.MethodDelete
		Expect(serve(b, del).Code).To(Equal(http.StatusOK))
		Expect(call(b, aliceToken, sid, toolCallJSON("sleep")).Code).To(Equal(http.StatusNotFound))
	})
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

var _ = Describe("the HTTP middleware", Label("unit"), func() {
	It("checks the host, origin, token and body size, and serves /healthz", func() {
		s, err := mcpserver.New(mcpserver.Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		f := filepath.Join(GinkgoT().TempDir(), "tokens")
		_ = os.WriteFile(f, []byte("aaaaaaaaaaaaaaaaaaaa alice\n"), 0o600)
		auth, err := auth.NewStaticTokens(f, nil)
		Expect(err).NotTo(HaveOccurred())
		h, err := NewHTTPServer(s, HTTPOptions{
			ResourceURL:  "http://127.0.0.1:8080/mcp",
			AllowedHosts: []string{"127.0.0.1:8080"},
			Auth:         auth,
			MaxBodyBytes: 1024,
			Logger:       slog.New(slog.DiscardHandler),
		})
		Expect(err).NotTo(HaveOccurred())
		// Shutdown stops the session sweeper that NewHTTPServer starts.
		DeferCleanup(func() { _ = h.Shutdown(context.Background()) })
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
		s, err := mcpserver.New(mcpserver.Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		f := filepath.Join(GinkgoT().TempDir(), "tokens")
		_ = os.WriteFile(f, []byte("aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n"), 0o600)
		auth, err := auth.NewStaticTokens(f, nil)
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

// ---- refusing before reading (issue 11, section 3) ----

// recordingBody is a request body that records whether anything read it.
type recordingBody struct {
	r     io.Reader
	reads atomic.Int64
}

func (b *recordingBody) Read(p []byte) (int, error) {
	b.reads.Add(1)
	return b.r.Read(p)
}

func (b *recordingBody) Close() error { return nil }

// countingReviewer is a TokenReview API that accepts only the token
// "good-token" and counts its calls; it is safe for concurrent use.
type countingReviewer struct{ calls atomic.Int64 }

func (c *countingReviewer) Create(_ context.Context, r *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	c.calls.Add(1)
	out := r.DeepCopy()
	if r.Spec.Token == "good-token" {
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: r.Spec.Audiences,
			User: authnv1.UserInfo{Username: "system:serviceaccount:team-a:agent"}}
	} else {
		out.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
	}
	return out, nil
}

// testMCP is an MCP server with two tools: "block" waits until release is
// closed (and reports on started first); "sleep" sleeps for d and reports
// whether the call's context was cancelled meanwhile.
func testMCP(started chan<- struct{}, release <-chan struct{}, d time.Duration) *server.MCPServer {
	s := server.NewMCPServer("test", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("block"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		started <- struct{}{}
		select {
		case <-release:
			return mcp.NewToolResultText("released"), nil
		case <-ctx.Done():
			return mcp.NewToolResultError("cancelled"), nil
		}
	})
	s.AddTool(mcp.NewTool("sleep"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		select {
		case <-time.After(d):
			return mcp.NewToolResultText("slept"), nil
		case <-ctx.Done():
			return mcp.NewToolResultError("cancelled: " + ctx.Err().Error()), nil
		}
	})
	return s
}

const (
	aliceToken = "aaaaaaaaaaaaaaaaaaaa"
	bobToken   = "bbbbbbbbbbbbbbbbbbbb"
	testHost   = "127.0.0.1:8080"
	initJSON   = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
)

func staticAuth() auth.Authenticator {
	GinkgoHelper()
	f := filepath.Join(GinkgoT().TempDir(), "tokens")
	Expect(os.WriteFile(f, []byte(aliceToken+" alice\n"+bobToken+" bob\n"), 0o600)).To(Succeed())
	auth, err := auth.NewStaticTokens(f, nil)
	Expect(err).NotTo(HaveOccurred())
	return auth
}

func newTestHTTP(s *server.MCPServer, opts HTTPOptions) *HTTPServer {
	GinkgoHelper()
	opts.ResourceURL = "http://" + testHost + "/mcp"
	opts.AllowedHosts = []string{"127.0.0.1"}
	if opts.Auth == nil {
		opts.Auth = staticAuth()
	}
	opts.Logger = slog.New(slog.DiscardHandler)
	h, err := NewHTTPServer(s, opts)
	Expect(err).NotTo(HaveOccurred())
	// Shutdown stops the session sweeper that NewHTTPServer starts.
	DeferCleanup(func() { _ = h.Shutdown(context.Background()) })
	return h
}

// mcpRequest builds a POST to /mcp from remote with token (if any), session
// (if any) and body.
func mcpRequest(remote, token, session string, body io.Reader) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/mcp", body)
	r.Host = testHost
	r.RemoteAddr = remote
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if session != "" {
		r.Header.Set("Mcp-Session-Id", session)
		r.Header.Set("MCP-Protocol-Version", "2025-06-18")
	}
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// initSession opens an MCP session for token from remote.
func initSession(h http.Handler, remote, token string) string {
	GinkgoHelper()
	w := serve(h, mcpRequest(remote, token, "", strings.NewReader(initJSON)))
	Expect(w.Code).To(Equal(http.StatusOK), "initialize: %s", w.Body.String())
	sid := w.Header().Get("Mcp-Session-Id")
	Expect(sid).NotTo(BeEmpty())
	return sid
}

func toolCallJSON(name string) string {
	return `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + name + `","arguments":{}}}`
}

var _ = Describe("the HTTP transport refuses before it reads", Label("unit"), func() {
	It("reads no request body before the caller is authenticated", func() {
		h := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{AuthFailuresPerMinute: 2})
		for _, c := range []struct {
			name, token, origin, target string
			want                        int
		}{
			{"no token", "", "", "/mcp", http.StatusUnauthorized},
			{"a wrong token", "cccccccccccccccccccc", "", "/mcp", http.StatusUnauthorized},
			{"a token in the query string", "", "", "/mcp?access_token=" + aliceToken, http.StatusBadRequest},
			{"a foreign Origin", aliceToken, "https://evil.example", "/mcp", http.StatusForbidden},
			// The two failures above used up the peer's bucket.
			{"a peer out of failed authentications", "dddddddddddddddddddd", "", "/mcp", http.StatusTooManyRequests},
		} {
			body := &recordingBody{r: strings.NewReader(initJSON)}
			r := mcpRequest("192.0.2.1:1000", c.token, "", body)
			r.URL, _ = url.Parse(c.target)
			r.RequestURI = c.target
			if c.origin != "" {
				r.Header.Set("Origin", c.origin)
			}
			w := serve(h, r)
			Expect(w.Code).To(Equal(c.want), "%s: %s", c.name, w.Body.String())
			Expect(body.reads.Load()).To(BeZero(), "%s: the body was read before the caller was authenticated", c.name)
		}
		// The same request, authenticated, is read and served.
		body := &recordingBody{r: strings.NewReader(initJSON)}
		w := serve(h, mcpRequest("192.0.2.2:1000", aliceToken, "", body))
		Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
		Expect(body.reads.Load()).NotTo(BeZero())
	})

	It("caps each peer's concurrent requests with 429 and Retry-After", func() {
		started, release := make(chan struct{}, 10), make(chan struct{})
		defer close(release)
		h := newTestHTTP(testMCP(started, release, 0), HTTPOptions{MaxRequestsPerPeer: 2})
		const peer = "192.0.2.1:1000"
		sid := initSession(h, peer, aliceToken)
		done := make(chan int, 2)
		for range 2 {
			go func() {
				done <- serve(h, mcpRequest(peer, aliceToken, sid, strings.NewReader(toolCallJSON("block")))).Code
			}()
		}
		for range 2 {
			Eventually(started).WithTimeout(5 * time.Second).Should(Receive())
		}
		// Two requests are in flight: a third from the same address is
		// refused at once, authenticated or not, without a body read.
		for _, tok := range []string{aliceToken, ""} {
			body := &recordingBody{r: strings.NewReader(toolCallJSON("block"))}
			var w *httptest.ResponseRecorder
			answered := make(chan struct{})
			go func() {
				defer close(answered)
				w = serve(h, mcpRequest("192.0.2.1:2000", tok, sid, body))
			}()
			Eventually(answered).WithTimeout(5*time.Second).Should(BeClosed(), "a third concurrent request (token %q) was let through", tok)
			Expect(w.Code).To(Equal(http.StatusTooManyRequests), "third concurrent request (token %q): %s", tok, w.Body.String())
			Expect(w.Header().Get("Retry-After")).NotTo(BeEmpty())
			Expect(w.Body.String()).To(ContainSubstring("concurrent requests"))
			Expect(body.reads.Load()).To(BeZero())
		}
		// Another address is not affected.
		Expect(serve(h, mcpRequest("192.0.2.9:1000", bobToken, "", strings.NewReader(initJSON))).Code).To(Equal(http.StatusOK))
		release <- struct{}{}
		release <- struct{}{}
		for range 2 {
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(Equal(http.StatusOK)))
		}
		// With the two done, the address may send again.
		Expect(serve(h, mcpRequest(peer, aliceToken, sid, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"ping"}`))).Code).To(Equal(http.StatusOK))
	})

	It("rate-limits failed authentications per peer before any TokenReview", func() {
		rev := &countingReviewer{}
		h := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{
			Auth:                  auth.NewTokenReviewAuthWith(rev, nil),
			AuthFailuresPerMinute: 5,
		})
		const attacker = "192.0.2.1:1000"
		codes := map[int]int{}
		for i := range 40 {
			w := serve(h, mcpRequest(attacker, fmt.Sprintf("guess-%03d", i), "", strings.NewReader(initJSON)))
			codes[w.Code]++
			if w.Code == http.StatusTooManyRequests {
				Expect(w.Header().Get("Retry-After")).NotTo(BeEmpty())
			}
		}
		Expect(codes).To(Equal(map[int]int{http.StatusUnauthorized: 5, http.StatusTooManyRequests: 35}))
		Expect(rev.calls.Load()).To(BeEquivalentTo(5), "guesses beyond the limit reached the TokenReview API")

		// Concurrent guesses from a fresh address cannot all slip in
		// before the first ones fail.
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				serve(h, mcpRequest("192.0.2.2:1000", fmt.Sprintf("parallel-%03d", i), "", strings.NewReader(initJSON)))
			})
		}
		wg.Wait()
		Expect(rev.calls.Load()).To(BeEquivalentTo(10), "concurrent guesses beyond the limit reached the TokenReview API")

		// Another address has its own bucket; a good token reviewed from
		// there is then recognized (cached) and works even from the
		// exhausted address, with no further review.
		Expect(serve(h, mcpRequest("192.0.2.3:1000", "good-token", "", strings.NewReader(initJSON))).Code).To(Equal(http.StatusOK))
		calls := rev.calls.Load()
		Expect(serve(h, mcpRequest(attacker, "good-token", "", strings.NewReader(initJSON))).Code).To(Equal(http.StatusOK))
		Expect(serve(h, mcpRequest(attacker, "guess-again", "", strings.NewReader(initJSON))).Code).To(Equal(http.StatusTooManyRequests))
		Expect(rev.calls.Load()).To(Equal(calls))
		// IPv6 peers are counted by /64.
		Expect(peerKey("[2001:db8:1:2:3:4:5:6]:443")).To(Equal(peerKey("[2001:db8:1:2:ffff::1]:80")))
		Expect(peerKey("[::ffff:192.0.2.1]:1")).To(Equal("192.0.2.1"))
	})

	It("caps the sessions of one identity", func() {
		h := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{MaxSessionsPerIdentity: 2})
		a1 := initSession(h, "192.0.2.1:1", aliceToken)
		initSession(h, "192.0.2.2:1", aliceToken)
		w := serve(h, mcpRequest("192.0.2.3:1", aliceToken, "", strings.NewReader(initJSON)))
		Expect(w.Code).To(Equal(http.StatusTooManyRequests), w.Body.String())
		Expect(w.Header().Get("Mcp-Session-Id")).To(BeEmpty())
		Expect(w.Body.String()).To(And(ContainSubstring("too many MCP sessions"), ContainSubstring("--max-sessions-per-identity")))
		// An initialize that names an existing session opens a new one
		// too, so it counts the same.
		Expect(serve(h, mcpRequest("192.0.2.3:1", aliceToken, a1, strings.NewReader(initJSON))).Code).To(Equal(http.StatusTooManyRequests))
		// Other requests of the open sessions, and other identities, are
		// not affected.
		Expect(serve(h, mcpRequest("192.0.2.1:1", aliceToken, a1, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"ping"}`))).Code).To(Equal(http.StatusOK))
		initSession(h, "192.0.2.1:1", bobToken)
		// Ending a session makes room.
		del := httptest.NewRequest(http.MethodDelete, "/mcp", nil)
		del.Host, del.RemoteAddr = testHost, "192.0.2.1:1"
		del.Header.Set("Authorization", "Bearer "+aliceToken)
		del.Header.Set("Mcp-Session-Id", a1)
		del.Header.Set("MCP-Protocol-Version", "2025-06-18")
		Expect(serve(h, del).Code).To(Equal(http.StatusOK))
		initSession(h, "192.0.2.1:1", aliceToken)
	})

	It("sets header, read and idle timeouts, and no write timeout that would cut streams", func() {
		h := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{})
		srv := h.Server(nil)
		Expect(srv.ReadHeaderTimeout).To(Equal(DefaultReadHeaderTimeout))
		Expect(srv.ReadTimeout).To(Equal(DefaultReadTimeout))
		Expect(srv.IdleTimeout).To(Equal(DefaultIdleTimeout))
		Expect(srv.WriteTimeout).To(BeZero())
		Expect(DefaultReadHeaderTimeout).To(BeNumerically(">", 0))
		Expect(DefaultReadTimeout).To(BeNumerically(">", 0))
		Expect(DefaultIdleTimeout).To(BeNumerically(">", 0))
	})

	It("drops a client too slow to send its request, but not a long tool call or stream", func() {
		const readTimeout = 500 * time.Millisecond
		h := newTestHTTP(testMCP(nil, nil, 3*readTimeout), HTTPOptions{ReadHeaderTimeout: readTimeout / 2, ReadTimeout: readTimeout})
		srv := h.Server(nil)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		go func() { _ = srv.Serve(ln) }()
		DeferCleanup(srv.Close)
		base := "http://" + ln.Addr().String() + "/mcp"

		// closedByServer reports whether the server closed the connection
		// before this side's own deadline, 20 read timeouts away: an event,
		// not a wall-clock bound that a slow machine could miss.
		closedByServer := func(send string) bool {
			GinkgoHelper()
			c, err := net.Dial("tcp", ln.Addr().String())
			Expect(err).NotTo(HaveOccurred())
			defer c.Close()
			_, err = io.WriteString(c, send)
			Expect(err).NotTo(HaveOccurred())
			_ = c.SetReadDeadline(time.Now().Add(20 * readTimeout))
			_, err = io.Copy(io.Discard, c)
			return !errors.Is(err, os.ErrDeadlineExceeded)
		}
		By("a request whose headers never end")
		Expect(closedByServer("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")).To(BeTrue(), "the server kept the connection open")
		By("an authenticated request whose body never ends")
		Expect(closedByServer("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+aliceToken+
			"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")).To(BeTrue(), "the server kept the connection open")

		post := func(session, body string) *http.Response {
			GinkgoHelper()
			req, _ := http.NewRequest(http.MethodPost, base, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			if session != "" {
				req.Header.Set("Mcp-Session-Id", session)
				req.Header.Set("MCP-Protocol-Version", "2025-06-18")
			}
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			return resp
		}
		resp := post("", initJSON)
		resp.Body.Close()
		sid := resp.Header.Get("Mcp-Session-Id")
		Expect(sid).NotTo(BeEmpty())

		By("a GET stream open for longer than the read timeout")
		req, _ := http.NewRequest(http.MethodGet, base, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("MCP-Protocol-Version", "2025-06-18")
		stream, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer stream.Body.Close()
		Expect(stream.StatusCode).To(Equal(http.StatusOK))
		ended := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, stream.Body)
			close(ended)
		}()

		By("a tool call that lasts longer than the read timeout")
		resp = post(sid, toolCallJSON("sleep"))
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(string(out)).To(ContainSubstring("slept"), "the tool call's context was cancelled by the read deadline")
		Consistently(ended).WithTimeout(readTimeout).ShouldNot(BeClosed(), "the GET stream was cut by the read deadline")
	})
})
