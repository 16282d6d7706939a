// Package transport serves an MCP server (internal/mcpserver's tools) over
// streamable HTTP, with authentication, Host and Origin checks and per-peer
// and per-identity limits, and over stdio; both bound every message before
// anything decodes it (precheck).
package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/cache"
)

// DefaultMaxBodyBytes caps an HTTP request body. write_file's contents
// travel inside one, so it is a little above mcpserver.MaxFileContents.
const DefaultMaxBodyBytes = mcpserver.MaxFileContents + 1<<20

// Defaults of the transport's per-peer and per-identity limits and of its
// http.Server timeouts (see HTTPOptions).
const (
	DefaultMaxRequestsPerPeer     = 64
	DefaultAuthFailuresPerMinute  = 30
	DefaultMaxSessionsPerIdentity = 64
	// DefaultMaxToolCallsPerIdentity bounds one identity's share of the
	// server's memory: each call in flight may hold a write_file body.
	DefaultMaxToolCallsPerIdentity = 8
	DefaultReadHeaderTimeout       = 10 * time.Second
	DefaultReadTimeout             = time.Minute
	DefaultIdleTimeout             = 2 * time.Minute
)

// EndpointPath is where the MCP endpoint is served.
const EndpointPath = "/mcp"

// sessionHeader is the streamable HTTP transport's session header.
const sessionHeader = "Mcp-Session-Id"

// HTTPOptions configure the streamable HTTP transport.
type HTTPOptions struct {
	// ResourceURL is the MCP endpoint's public URL (the OAuth resource
	// identifier), for example http://127.0.0.1:8080/mcp.
	ResourceURL string
	// AllowedHosts are the Host header values accepted (host:port, or a
	// bare host that matches any port). Anything else is refused with 403:
	// that is what defeats DNS rebinding.
	AllowedHosts []string
	// AllowedOrigins are the Origin values accepted (scheme://host[:port]).
	// A request without Origin (any non-browser client) is accepted; one
	// with any other Origin is refused with 403.
	AllowedOrigins []string
	// Auth authenticates bearer tokens; required.
	Auth auth.Authenticator
	// AuthorizationServers are advertised in the protected resource
	// metadata.
	AuthorizationServers []string
	// ScopesSupported are advertised in the protected resource metadata
	// and named in every 401's challenge (scope=), so that a client asks
	// its authorization server for them at once. There is no step-up: no
	// scope widens what a caller may do (RBAC decides that, through
	// SubjectAccessReviews), so a refused call is a 403 naming the missing
	// permission, never insufficient_scope.
	ScopesSupported []string
	// MaxBodyBytes caps request bodies (413 beyond it): a call of one of
	// LargeBodyTools (write_file) may be this long.
	MaxBodyBytes int64
	// MaxMessageBytes caps every other message (zero:
	// DefaultMaxMessageBytes, and never more than MaxBodyBytes). Which cap
	// applies is read from the message on the way in (see precheck).
	MaxMessageBytes int64
	// MaxToolCallsPerIdentity caps the tool calls one identity may have in
	// flight (429 with Retry-After beyond it, before the call is decoded).
	// Zero means DefaultMaxToolCallsPerIdentity; negative disables the cap.
	MaxToolCallsPerIdentity int
	// SessionIdleTTL forgets sessions unused for this long.
	SessionIdleTTL time.Duration
	// RequestsPerSecond limits each identity's requests (429 beyond it,
	// with Retry-After); Burst is the bucket size. Zero disables the limit.
	RequestsPerSecond float64
	Burst             int
	// MaxRequestsPerPeer caps the requests one remote address (an IPv4
	// address, or an IPv6 /64) may have in flight at once, long-lived
	// streams included (429 with Retry-After beyond it). Zero means
	// DefaultMaxRequestsPerPeer; negative disables the cap.
	MaxRequestsPerPeer int
	// AuthFailuresPerMinute is how many failed authentications (no token,
	// a bad one, or a refused caller) one remote address may cause per
	// minute, in a bucket of that size. Once it is empty the address gets
	// 429 before its token is looked at, so that guessing tokens costs no
	// TokenReview; only a token the authenticator already knows to be
	// good (see TokenRecognizer) still goes through. Zero means
	// DefaultAuthFailuresPerMinute; negative disables the limit.
	AuthFailuresPerMinute int
	// MaxSessionsPerIdentity caps the open MCP sessions of one identity;
	// an initialize beyond it is refused with 429. Zero means
	// DefaultMaxSessionsPerIdentity; negative disables the cap.
	MaxSessionsPerIdentity int
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout configure the
	// http.Server that Server returns (zero: the Default* values).
	// ReadTimeout bounds reading a request's headers and body only:
	// net/http lifts the read deadline once the body has been read, so long
	// tool calls and GET streams are not cut (a unit test holds it to
	// that). There is deliberately no write timeout: responses may be SSE
	// streams that last as long as a command runs.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
	// Ready reports readiness for /readyz.
	Ready  func(context.Context) error
	Logger *slog.Logger
}

// HTTPServer is the MCP endpoint with its security middleware, the health
// endpoints and the OAuth protected resource metadata.
type HTTPServer struct {
	opts     HTTPOptions
	mcp      *server.StreamableHTTPServer
	tasks    *tasks.Server // nil: the server offers no Tasks extension
	sessions *sessionStore
	handler  http.Handler
	metaPath string

	limitersMu sync.Mutex
	limiters   map[string]*identityLimiter

	peers        *peerLimits
	toolCalls    *peerLimits // in-flight tool calls per identity
	largeCalls   *peerLimits // of those, the ones over MaxMessageBytes
	bodyReads    *peerLimits // bodies being read per identity; nil: no cap
	authFailures *authFailureLimiter

	// draining is set by Drain: /readyz fails and every response closes
	// its connection.
	draining atomic.Bool
}

type identityLimiter struct {
	limiter  *rate.Limiter
	lastSeen time.Time
}

// NewHTTPServer wires s behind authentication, Host and Origin checks, a
// body cap and identity-bound sessions.
func NewHTTPServer(s *server.MCPServer, opts HTTPOptions) (*HTTPServer, error) {
	if opts.Auth == nil {
		return nil, errors.New("HTTP transport needs an authenticator")
	}
	u, err := url.Parse(opts.ResourceURL)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return nil, fmt.Errorf("resource URL %q must be an absolute URL", opts.ResourceURL)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	opts.MaxMessageBytes = min(opts.MaxMessageBytes, opts.MaxBodyBytes)
	if opts.SessionIdleTTL <= 0 {
		opts.SessionIdleTTL = time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Burst <= 0 {
		opts.Burst = max(1, int(2*opts.RequestsPerSecond))
	}
	opts.MaxRequestsPerPeer = defaultInt(opts.MaxRequestsPerPeer, DefaultMaxRequestsPerPeer)
	opts.AuthFailuresPerMinute = defaultInt(opts.AuthFailuresPerMinute, DefaultAuthFailuresPerMinute)
	opts.MaxSessionsPerIdentity = defaultInt(opts.MaxSessionsPerIdentity, DefaultMaxSessionsPerIdentity)
	opts.MaxToolCallsPerIdentity = defaultInt(opts.MaxToolCallsPerIdentity, DefaultMaxToolCallsPerIdentity)
	opts.ReadHeaderTimeout = defaultDuration(opts.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	opts.ReadTimeout = defaultDuration(opts.ReadTimeout, DefaultReadTimeout)
	opts.IdleTimeout = defaultDuration(opts.IdleTimeout, DefaultIdleTimeout)
	h := &HTTPServer{opts: opts, sessions: newSessionStore(opts.SessionIdleTTL, opts.MaxSessionsPerIdentity), limiters: map[string]*identityLimiter{},
		peers: newPeerLimits(opts.MaxRequestsPerPeer), toolCalls: newPeerLimits(opts.MaxToolCallsPerIdentity),
		largeCalls: newPeerLimits(MaxLargeCallsPerIdentity), authFailures: newAuthFailureLimiter(opts.AuthFailuresPerMinute)}
	h.tasks = tasks.For(s)
	h.mcp = server.NewStreamableHTTPServer(s,
		server.WithEndpointPath(EndpointPath),
		server.WithSessionIdManagerResolver(h.sessions),
		server.WithSessionIdleTTL(opts.SessionIdleTTL),
		// Our own Host allowlist replaces mcp-go's loopback-only check, so
		// that --allowed-hosts is honoured in both directions.
		server.WithDisableLocalhostProtection(true),
		server.WithStreamableHTTPLogger(opts.Logger),
		server.WithHeartbeatInterval(30*time.Second),
	)
	meta := server.ProtectedResourceMetadataConfig{
		Resource:               opts.ResourceURL,
		AuthorizationServers:   opts.AuthorizationServers,
		ScopesSupported:        opts.ScopesSupported,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           mcpserver.ServerName,
	}
	h.metaPath = server.ProtectedResourceMetadataPath(opts.ResourceURL)
	metaHandler := server.NewProtectedResourceMetadataHandler(meta)

	if opts.MaxToolCallsPerIdentity >= 0 {
		h.bodyReads = newPeerLimits(opts.MaxToolCallsPerIdentity)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", h.readyz)
	mux.Handle(server.WellKnownProtectedResourcePath, metaHandler)
	if h.metaPath != server.WellKnownProtectedResourcePath {
		mux.Handle(h.metaPath, metaHandler)
	}
	// Everything up to authenticate looks at headers only: the body of a
	// request is read (by limitBody) only once its caller is known, so an
	// unauthenticated peer costs a connection and its headers, never a
	// buffered body.
	mux.Handle(EndpointPath, h.limitPeer(h.rejectQueryTokens(h.authenticate(h.rateLimit(h.limitBody(h.modernRequests(h.bindSession(h.capSessions(h.capToolCalls(h.mcp))))))))))
	h.handler = h.checkHostAndOrigin(mux)
	return h, nil
}

func defaultInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func defaultDuration(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// Server returns an http.Server for h with the transport's timeouts:
// ReadHeaderTimeout and ReadTimeout bound how long a peer may take to send
// a request, IdleTimeout how long a kept-alive connection may wait for the
// next one. WriteTimeout stays zero: a response may be an SSE stream (a GET
// stream, or a tool call's progress) that lasts for as long as a command
// runs, and a write timeout would cut it.
func (h *HTTPServer) Server(errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: h.opts.ReadHeaderTimeout,
		ReadTimeout:       h.opts.ReadTimeout,
		IdleTimeout:       h.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          errorLog,
	}
}

// ServeHTTP implements http.Handler.
func (h *HTTPServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.draining.Load() {
		// net/http closes the connection after this response, so that the
		// client's next request opens a new one, which the Service sends
		// to another replica. Closing idle connections instead (as
		// http.Server.Shutdown does) races with a request the client is
		// sending on one at that moment, and a POST is not retried.
		w.Header().Set("Connection", "close")
	}
	h.handler.ServeHTTP(w, r)
}

// Drain begins a graceful stop: /readyz answers 503 from now on, so that
// the Service takes this replica out of its endpoints, and every response
// closes its connection. Requests are still served, in flight and new
// ones alike, until http.Server.Shutdown stops accepting them.
func (h *HTTPServer) Drain() { h.draining.Store(true) }

// Shutdown ends the MCP sessions: it closes their GET streams, which
// http.Server.Shutdown would otherwise wait for forever. Tool calls in
// flight are not affected; each finishes on its own POST.
func (h *HTTPServer) Shutdown(ctx context.Context) error { return h.mcp.Shutdown(ctx) }

func (h *HTTPServer) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	if h.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: shutting down\n")
		return
	}
	if h.opts.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := h.opts.Ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
	}
	_, _ = io.WriteString(w, "ok\n")
}

// HostAllowed reports whether a Host header value is in the allowlist. A
// bare entry (no port) matches the host on any port.
func HostAllowed(allowed []string, host string) bool {
	host = strings.ToLower(host)
	if host == "" {
		return false
	}
	bare := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		bare = "[" + h + "]"
		if !strings.Contains(h, ":") {
			bare = h
		}
	}
	for _, a := range allowed {
		a = strings.ToLower(a)
		if a == host || a == bare {
			return true
		}
	}
	return false
}

// OriginAllowed reports whether a request's Origin is acceptable: absent,
// exactly one of the allowed origins, or the request's own origin on a
// loopback host (host is the request's Host, already checked against the
// allowed hosts). Browser-based MCP clients served from the server's own
// loopback address always send that Origin; a DNS-rebinding page cannot,
// because its Origin carries its own host name, which is also its Host and
// fails the Host check first.
func OriginAllowed(allowed []string, origin, host string) bool {
	if origin == "" {
		return true
	}
	origin = strings.ToLower(strings.TrimRight(origin, "/"))
	if sameLoopbackOrigin(origin, strings.ToLower(host)) {
		return true
	}
	return slices.ContainsFunc(allowed, func(a string) bool { return strings.ToLower(strings.TrimRight(a, "/")) == origin })
}

// sameLoopbackOrigin reports whether origin is http(s)://host with host a
// loopback name or address and an explicit port (the listening one, since
// the Host check passed).
func sameLoopbackOrigin(origin, host string) bool {
	rest, ok := strings.CutPrefix(origin, "http://")
	if !ok {
		if rest, ok = strings.CutPrefix(origin, "https://"); !ok {
			return false
		}
	}
	if rest != host {
		return false
	}
	name, port, err := net.SplitHostPort(host)
	if err != nil || port == "" {
		return false
	}
	if name == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(name)
	return err == nil && ip.IsLoopback()
}

func (h *HTTPServer) checkHostAndOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Probes come from the orchestrator by IP; they reveal nothing.
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if !HostAllowed(h.opts.AllowedHosts, r.Host) {
			h.opts.Logger.Warn("refused request for a Host not in --allowed-hosts (DNS rebinding?)", "host", mcpserver.Truncate(r.Host, 100), "remote", r.RemoteAddr)
			http.Error(w, "Forbidden: Host not allowed", http.StatusForbidden)
			return
		}
		if origin := r.Header.Get("Origin"); !OriginAllowed(h.opts.AllowedOrigins, origin, r.Host) {
			h.opts.Logger.Warn("refused request from an Origin not in --allowed-origins", "origin", mcpserver.Truncate(origin, 100), "remote", r.RemoteAddr)
			http.Error(w, "Forbidden: Origin not allowed", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// queryTokenParams are query parameters that would carry a credential.
var queryTokenParams = []string{"access_token", "token", "bearer", "auth", "authorization", "api_key", "apikey"}

func (h *HTTPServer) rejectQueryTokens(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		for name := range q {
			if slices.Contains(queryTokenParams, strings.ToLower(name)) {
				http.Error(w, "Bad Request: credentials in the query string are not accepted; send Authorization: Bearer <token>", http.StatusBadRequest)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// limitBody reads the body of an authenticated POST through precheck
// (the MCP handler would read it anyway): a message over its cap gets 413,
// one too deep, too wide or not one JSON object gets 400, each before any
// decoder builds it (see precheck). It runs after authenticate: nothing
// before it reads the body.
func (h *HTTPServer) limitBody(next http.Handler) http.Handler {
	limits := messageLimits{MaxBodyBytes: h.opts.MaxBodyBytes, MaxMessageBytes: h.opts.MaxMessageBytes}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > h.opts.MaxBodyBytes {
			writeJSONRPCError(w, tooLarge("this message", h.opts.MaxBodyBytes), nil)
			return
		}
		// A 2026 client names the tool in a header: a call of a small
		// tool that announces a large body is refused unread.
		if name := r.Header.Get("Mcp-Name"); name != "" && r.ContentLength > limits.capFor(messageInfo{Method: "tools/call", Tool: name}) {
			writeJSONRPCError(w, tooLarge("a call of "+mcpserver.Truncate(name, 40), limits.MaxMessageBytes), nil)
			return
		}
		if r.Body != nil && r.Method == http.MethodPost {
			// The bodies one identity has being read at once are capped
			// like its tool calls: a body is in memory from here on,
			// before anything knows what it is.
			caller, _ := contract.CallerFrom(r.Context())
			if h.bodyReads != nil && !h.bodyReads.acquire(caller.ID) {
				h.refuseIdentity(w, r, nil, fmt.Sprintf("this identity already has %d requests being read", h.opts.MaxToolCallsPerIdentity))
				return
			}
			body, info, perr := precheck(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes), limits)
			if h.bodyReads != nil {
				h.bodyReads.release(caller.ID)
			}
			if perr != nil {
				h.opts.Logger.Info("refused a message before decoding it", "caller", contract.IdentityHash(caller.ID), "remote", r.RemoteAddr, "reason", perr.message)
				writeJSONRPCError(w, perr, info.ID)
				return
			}
			r.Body = &bufferedBody{Reader: bytes.NewReader(body), data: body, info: info}
		}
		next.ServeHTTP(w, r)
	})
}

// writeJSONRPCError answers a request the transport refuses itself with its
// HTTP status and a JSON-RPC error object, which MCP clients show.
func writeJSONRPCError(w http.ResponseWriter, e *precheckError, id json.RawMessage) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	out, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": e.code, "message": e.message}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(out)
}

// bufferedBody is a body limitBody has read into memory; the handlers
// after it look at data and info instead of reading or decoding it again.
type bufferedBody struct {
	*bytes.Reader
	data []byte
	info messageInfo
}

func (*bufferedBody) Close() error { return nil }

// MaxLargeCallsPerIdentity caps the calls over MaxMessageBytes (large
// write_file calls) one identity may have in flight, within its
// MaxToolCallsPerIdentity.
const MaxLargeCallsPerIdentity = 2

// refuseIdentity answers a request beyond one of the identity's
// concurrency caps: 429, Retry-After and a JSON-RPC error saying which.
func (h *HTTPServer) refuseIdentity(w http.ResponseWriter, r *http.Request, id json.RawMessage, what string) {
	caller, _ := contract.CallerFrom(r.Context())
	h.opts.Logger.Info("refused a request beyond the identity's concurrency cap", "caller", contract.IdentityHash(caller.ID), "remote", r.RemoteAddr, "reason", what)
	w.Header().Set("Retry-After", "1")
	writeJSONRPCError(w, &precheckError{status: http.StatusTooManyRequests, code: -32000,
		message: "Too Many Requests: " + what + ", the most the server allows (--max-tool-calls-per-identity); wait for one to finish and retry"}, id)
}

// capToolCalls caps the tool calls one identity has in flight: each may
// hold a large body and a sandbox's attention for as long as its commands
// run. A call beyond the cap is refused with 429 before mcp-go decodes it.
func (h *HTTPServer) capToolCalls(next http.Handler) http.Handler {
	if h.opts.MaxToolCallsPerIdentity < 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buffered, ok := r.Body.(*bufferedBody)
		if r.Method != http.MethodPost || !ok || !buffered.info.isToolCall() {
			next.ServeHTTP(w, r)
			return
		}
		caller, _ := contract.CallerFrom(r.Context())
		if !h.toolCalls.acquire(caller.ID) {
			h.refuseIdentity(w, r, buffered.info.ID, fmt.Sprintf("this identity already has %d tool calls in flight", h.opts.MaxToolCallsPerIdentity))
			return
		}
		defer h.toolCalls.release(caller.ID)
		// A call over MaxMessageBytes (a large write_file) costs several
		// copies of its body while mcp-go and the tool decode it (about
		// 100 MiB for 15 MiB of contents): an identity may have only a
		// few of those at once.
		if int64(len(buffered.data)) > h.opts.MaxMessageBytes {
			if !h.largeCalls.acquire(caller.ID) {
				h.refuseIdentity(w, r, buffered.info.ID, fmt.Sprintf("this identity already has %d calls larger than %d bytes in flight", MaxLargeCallsPerIdentity, h.opts.MaxMessageBytes))
				return
			}
			defer h.largeCalls.release(caller.ID)
		}
		next.ServeHTTP(w, r)
	})
}

func (h *HTTPServer) metadataURL() string {
	u, _ := url.Parse(h.opts.ResourceURL)
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: h.metaPath}).String()
}

func (h *HTTPServer) unauthorized(w http.ResponseWriter, reason string, tokenPresented bool) {
	challenge := fmt.Sprintf(`Bearer resource_metadata=%q`, h.metadataURL())
	if len(h.opts.ScopesSupported) > 0 {
		challenge += fmt.Sprintf(`, scope=%q`, strings.Join(h.opts.ScopesSupported, " "))
	}
	if tokenPresented {
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	http.Error(w, "Unauthorized: "+reason, http.StatusUnauthorized)
}

func (h *HTTPServer) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authz := r.Header.Get("Authorization")
		scheme, token, _ := strings.Cut(authz, " ")
		token = strings.TrimSpace(token)
		_, anonymous := h.opts.Auth.(auth.AnonymousAuthenticator)
		hasToken := strings.EqualFold(scheme, "Bearer") && token != ""
		// A peer that has used up its failed authentications is refused
		// before its token is looked at (and so before any TokenReview),
		// unless the token is one the authenticator already knows to be
		// good: a caller behind the same address as a token-guesser keeps
		// working. The slot is taken before authenticating, so that
		// concurrent guesses cannot all slip through at once; a success
		// gives it back.
		var attempt *authAttempt
		if !anonymous && !(hasToken && auth.Recognizes(h.opts.Auth, token)) {
			var retry time.Duration
			if attempt, retry = h.authFailures.begin(peerKey(r.RemoteAddr)); attempt == nil {
				h.opts.Logger.Debug("too many failed authentications from this address", "remote", r.RemoteAddr)
				w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(retry.Seconds())))))
				http.Error(w, "Too Many Requests: too many failed authentications from this address; retry later", http.StatusTooManyRequests)
				return
			}
		}
		if !anonymous && !hasToken {
			attempt.done(true)
			h.unauthorized(w, "a bearer token is required (Authorization: Bearer <token>)", false)
			return
		}
		caller, err := h.opts.Auth.Authenticate(r.Context(), token)
		// Only the caller's failures count: not a success, and not an
		// authenticator that could not answer.
		attempt.done(errors.Is(err, auth.ErrUnauthenticated) || errors.Is(err, auth.ErrForbidden))
		if errors.Is(err, auth.ErrUnauthenticated) {
			h.opts.Logger.Info("authentication failed", "remote", r.RemoteAddr, "reason", err)
			h.unauthorized(w, "invalid or expired token", true)
			return
		}
		if errors.Is(err, auth.ErrForbidden) {
			h.opts.Logger.Info("authorization refused", "caller", contract.IdentityHash(caller.ID), "remote", r.RemoteAddr)
			http.Error(w, "Forbidden: "+strings.TrimPrefix(err.Error(), auth.ErrForbidden.Error()+": "), http.StatusForbidden)
			return
		}
		if err != nil {
			h.opts.Logger.Error("authentication unavailable", "error", err)
			http.Error(w, "Service Unavailable: cannot verify the token right now", http.StatusServiceUnavailable)
			return
		}
		caller.Session = r.Header.Get(sessionHeader)
		next.ServeHTTP(w, r.WithContext(contract.WithCaller(r.Context(), caller)))
	})
}

// rateLimit gives each identity a token bucket, so that one agent in a loop
// cannot starve the others or the Docker Engine behind them.
func (h *HTTPServer) rateLimit(next http.Handler) http.Handler {
	if h.opts.RequestsPerSecond <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, _ := contract.CallerFrom(r.Context())
		if !h.allow(caller.ID, time.Now()) {
			h.opts.Logger.Info("rate limited", "caller", caller.ID, "remote", r.RemoteAddr)
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("Too Many Requests: more than %g requests per second from this identity", h.opts.RequestsPerSecond), http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// identityLimiterIdle is how long an identity's bucket is kept unused.
const identityLimiterIdle = 10 * time.Minute

func (h *HTTPServer) allow(identity string, now time.Time) bool {
	h.limitersMu.Lock()
	defer h.limitersMu.Unlock()
	l, ok := h.limiters[identity]
	if !ok {
		if len(h.limiters) >= 10000 {
			for id, old := range h.limiters {
				if now.Sub(old.lastSeen) > identityLimiterIdle {
					delete(h.limiters, id)
				}
			}
		}
		l = &identityLimiter{limiter: rate.NewLimiter(rate.Limit(h.opts.RequestsPerSecond), h.opts.Burst)}
		h.limiters[identity] = l
	}
	l.lastSeen = now
	return l.limiter.AllowN(now, 1)
}

// bindSession refuses a session ID that does not verify for the caller
// (another identity's, a forged or mangled one, an expired one) with the
// 404 an unknown session gets, so that session IDs reveal nothing across
// identities, on every method (mcp-go itself would answer another
// identity's DELETE with 405). Not checked: an initialize (which gets a new
// session whatever it carries) and a 2026-07-28 request (which has no
// session; the header is ignored).
func (h *HTTPServer) bindSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(sessionHeader)
		if id == "" || mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion)) {
			next.ServeHTTP(w, r)
			return
		}
		if b, ok := r.Body.(*bufferedBody); ok && r.Method == http.MethodPost && b.info.Method == "initialize" {
			next.ServeHTTP(w, r)
			return
		}
		caller, _ := contract.CallerFrom(r.Context())
		if !h.sessions.validFor(id, caller.ID) {
			h.opts.Logger.Info("refused a session ID that is not the caller's (another identity's, forged, or expired)", "caller", contract.IdentityHash(caller.ID), "remote", r.RemoteAddr)
			http.Error(w, "Not Found: unknown session", http.StatusNotFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// capSessions refuses an initialize (which opens a session) from an
// identity that already has MaxSessionsPerIdentity open ones. It runs after
// limitBody, so the body it peeks at is already in memory.
func (h *HTTPServer) capSessions(next http.Handler) http.Handler {
	if h.opts.MaxSessionsPerIdentity < 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buffered, ok := r.Body.(*bufferedBody)
		if r.Method != http.MethodPost || !ok {
			next.ServeHTTP(w, r)
			return
		}
		msg := buffered.info
		if msg.Method != "initialize" {
			next.ServeHTTP(w, r)
			return
		}
		caller, _ := contract.CallerFrom(r.Context())
		release, open, ok := h.sessions.reserve(caller.ID, time.Now())
		if !ok {
			h.opts.Logger.Info("refused a session beyond the identity's cap", "caller", contract.IdentityHash(caller.ID), "open", open, "remote", r.RemoteAddr)
			id := msg.ID
			if len(id) == 0 {
				id = json.RawMessage("null")
			}
			text := fmt.Sprintf("too many MCP sessions: this identity has %d open, and the server allows %d per identity (--max-sessions-per-identity). End a session you no longer use (HTTP DELETE with its Mcp-Session-Id; MCP clients do this when they close), or wait for an idle one to expire (after %s).",
				open, h.opts.MaxSessionsPerIdentity, h.opts.SessionIdleTTL)
			out, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": -32000, "message": text}})
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(out)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// peerKey is the unit the per-peer limits count: the remote IPv4 address,
// or the remote IPv6 address's /64 (one host usually has a whole /64).
func peerKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// peerLimits counts each peer's requests in flight. A peer's entry goes
// when its last request ends, so the map holds only peers with open
// requests.
type peerLimits struct {
	max int

	mu       sync.Mutex
	inFlight map[string]int
}

func newPeerLimits(maxPerPeer int) *peerLimits {
	return &peerLimits{max: maxPerPeer, inFlight: map[string]int{}}
}

func (p *peerLimits) acquire(peer string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[peer] >= p.max {
		return false
	}
	p.inFlight[peer]++
	return true
}

func (p *peerLimits) release(peer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[peer]--; p.inFlight[peer] <= 0 {
		delete(p.inFlight, peer)
	}
}

// limitPeer caps the requests one peer has in flight, before anything else
// about the request is looked at.
func (h *HTTPServer) limitPeer(next http.Handler) http.Handler {
	if h.opts.MaxRequestsPerPeer < 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer := peerKey(r.RemoteAddr)
		if !h.peers.acquire(peer) {
			h.opts.Logger.Debug("too many concurrent requests from this address", "remote", r.RemoteAddr, "limit", h.opts.MaxRequestsPerPeer)
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("Too Many Requests: more than %d concurrent requests from this address", h.opts.MaxRequestsPerPeer), http.StatusTooManyRequests)
			return
		}
		defer h.peers.release(peer)
		next.ServeHTTP(w, r)
	})
}

// authFailureLimiter gives each peer a token bucket of failed
// authentications (x/time/rate), kept in a bounded LRU whose entries
// expire once their bucket would be full again, so neither many peers nor
// a long run can grow it without bound.
type authFailureLimiter struct {
	perMinute int

	mu      sync.Mutex
	buckets *cache.LRUExpireCache // peer -> *authBucket
}

type authBucket struct {
	lim *rate.Limiter
	// pending counts authentications in flight (guarded by the limiter's
	// mu): each needs a token to be free, so that concurrent guesses
	// cannot all reach the authenticator before the first one fails.
	pending int
}

// authFailurePeers bounds the peers whose failures are remembered. An
// evicted peer starts again with a full bucket.
const authFailurePeers = 1 << 16

func newAuthFailureLimiter(perMinute int) *authFailureLimiter {
	if perMinute < 0 {
		return nil
	}
	return &authFailureLimiter{perMinute: perMinute, buckets: cache.NewLRUExpireCache(authFailurePeers)}
}

// authAttempt is one authentication in flight; done records its outcome.
type authAttempt struct {
	l    *authFailureLimiter
	peer string
	b    *authBucket
}

// begin starts an authentication for peer, or returns nil and how long
// until the peer may try again. A nil limiter allows everything.
func (l *authFailureLimiter) begin(peer string) (*authAttempt, time.Duration) {
	if l == nil {
		return &authAttempt{}, 0
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var b *authBucket
	if v, ok := l.buckets.Get(peer); ok {
		b = v.(*authBucket)
	} else {
		b = &authBucket{lim: rate.NewLimiter(rate.Every(time.Minute/time.Duration(l.perMinute)), l.perMinute)}
	}
	l.buckets.Add(peer, b, time.Minute)
	if free := b.lim.TokensAt(now) - float64(b.pending); free < 1 {
		return nil, time.Duration((1 - free) * float64(time.Minute) / float64(l.perMinute))
	}
	b.pending++
	return &authAttempt{l: l, peer: peer, b: b}, 0
}

func (a *authAttempt) done(failed bool) {
	if a == nil || a.l == nil {
		return
	}
	a.l.mu.Lock()
	defer a.l.mu.Unlock()
	a.b.pending--
	if failed {
		a.b.lim.AllowN(time.Now(), 1)
		a.l.buckets.Add(a.peer, a.b, time.Minute)
	}
	a.l = nil
}

// sessionStore issues session IDs bound to the identity that initialized
// them. It implements mcp-go's SessionIdManagerResolver: each request gets
// a manager that validates session IDs against that request's identity.
//
// A session ID verifies itself (see sessionid.go): any replica holding the
// same owner key accepts one that another replica issued, for the identity
// it was issued to and nobody else. What this store keeps is per replica and
// optional: the sessions it issued or served lately (for
// MaxSessionsPerIdentity, which therefore counts per replica) and the ones a
// client ended here with DELETE (refused here afterwards; another replica
// still accepts them until they are MaxSessionAge old, and a client that
// ended its session does not use it again).
type sessionStore struct {
	ttl time.Duration
	// max caps the open sessions of one identity on this replica;
	// negative: no cap.
	max int
	// key returns the key of the session IDs' MACs (read at every use, so
	// that it follows the owner key mcpmain loads).
	key func() []byte
	now func() time.Time

	mu       sync.Mutex
	sessions map[string]*sessionInfo
	// pending counts each identity's initializes in flight (see reserve).
	pending map[string]int
}

type sessionInfo struct {
	identity   string
	terminated bool
	lastSeen   time.Time
}

// sessionKeyPurpose names the session ID key among contract.DerivedKey's.
const sessionKeyPurpose = "mcp-session-id"

func newSessionStore(ttl time.Duration, maxPerIdentity int) *sessionStore {
	return &sessionStore{ttl: ttl, max: maxPerIdentity, sessions: map[string]*sessionInfo{}, pending: map[string]int{},
		key: func() []byte { return contract.DerivedKey(sessionKeyPurpose) }, now: time.Now}
}

// reserve claims room for one more session of identity, counting its open
// sessions (not ended, not idle past the TTL) and its initializes in
// flight. It returns a release func to call once the initialize has been
// answered (by then Generate has recorded the session, if any), or ok false
// with the number of open sessions when the identity is at its cap.
func (s *sessionStore) reserve(identity string, now time.Time) (release func(), open int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, info := range s.sessions {
		if info.identity == identity && !info.terminated && now.Sub(info.lastSeen) <= s.ttl {
			open++
		}
	}
	if s.max >= 0 && open+s.pending[identity] >= s.max {
		return nil, open, false
	}
	s.pending[identity]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.pending[identity]--; s.pending[identity] <= 0 {
			delete(s.pending, identity)
		}
	}, open, true
}

// validFor reports whether id is a session ID issued to identity (by any
// replica sharing the key) and not older than MaxSessionAge.
func (s *sessionStore) validFor(id, identity string) bool {
	return verifySessionID(s.key(), id, identity, s.now()) == nil
}

// prune forgets records idle past the TTL (and ended ones past the
// longest age a session ID has); s.mu held.
func (s *sessionStore) prune(now time.Time) {
	for k, info := range s.sessions {
		keep := s.ttl
		if info.terminated {
			keep = max(s.ttl, MaxSessionAge)
		}
		if now.Sub(info.lastSeen) > keep {
			delete(s.sessions, k)
		}
	}
}

// maxSessionRecords bounds the per-replica records: beyond it the oldest
// go (only the per-replica session cap and the per-replica memory of a
// DELETE depend on them; validity does not).
const maxSessionRecords = 100000

// record notes that id (already verified for identity) was used now.
// s.mu held.
func (s *sessionStore) record(id, identity string, now time.Time) *sessionInfo {
	info, ok := s.sessions[id]
	if !ok {
		if len(s.sessions) >= maxSessionRecords {
			s.prune(now)
		}
		if len(s.sessions) >= maxSessionRecords {
			var oldest string
			for k, v := range s.sessions {
				if oldest == "" || v.lastSeen.Before(s.sessions[oldest].lastSeen) {
					oldest = k
				}
			}
			delete(s.sessions, oldest)
		}
		info = &sessionInfo{identity: identity}
		s.sessions[id] = info
	}
	info.lastSeen = now
	return info
}

// ResolveSessionIdManager implements server.SessionIdManagerResolver. r is
// nil for the transport's own housekeeping (mcp-go's idle sweeper).
func (s *sessionStore) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	m := &boundSessions{store: s}
	if r != nil {
		c, _ := contract.CallerFrom(r.Context())
		m.identity, m.checked = c.ID, true
	}
	return m
}

type boundSessions struct {
	store    *sessionStore
	identity string
	checked  bool
}

// Generate issues a session ID for the request's identity (see
// newSessionID).
func (m *boundSessions) Generate() string {
	s := m.store
	now := s.now()
	id := newSessionID(s.key(), m.identity, now)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(now)
	s.record(id, m.identity, now)
	return id
}

// errUnknownSession is what any session ID that does not verify for the
// caller gets: forged, mangled, too old, or another identity's (mcp-go
// answers 404, which tells the client to initialize again).
var errUnknownSession = errors.New("unknown session")

func (m *boundSessions) Validate(id string) (bool, error) {
	s := m.store
	now := s.now()
	if !m.checked {
		// Housekeeping only knows this replica's records.
		s.mu.Lock()
		defer s.mu.Unlock()
		info, ok := s.sessions[id]
		if !ok {
			return false, errUnknownSession
		}
		return info.terminated, nil
	}
	if !s.validFor(id, m.identity) {
		return false, errUnknownSession
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if info, ok := s.sessions[id]; ok && info.terminated {
		return true, nil
	}
	s.record(id, m.identity, now)
	return false, nil
}

// Terminate ends a session on a client's DELETE (on this replica: see
// sessionStore). mcp-go's idle sweeper (unchecked) only makes this replica
// forget its record: the session stays valid, on this replica too, since
// another replica may be serving it meanwhile.
func (m *boundSessions) Terminate(id string) (bool, error) {
	s := m.store
	now := s.now()
	if !m.checked {
		s.mu.Lock()
		defer s.mu.Unlock()
		if info, ok := s.sessions[id]; ok && !info.terminated {
			delete(s.sessions, id)
		}
		return false, nil
	}
	if !s.validFor(id, m.identity) {
		// Not the caller's session (or no session at all): not allowed,
		// which reveals nothing either way.
		return true, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.record(id, m.identity, now)
	info.terminated = true
	return false, nil
}
