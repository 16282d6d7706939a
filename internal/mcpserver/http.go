package mcpserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"
	"golang.org/x/time/rate"
)

// DefaultMaxBodyBytes caps an HTTP request body. write_file's contents
// travel inside one, so it is a little above MaxFileContents.
const DefaultMaxBodyBytes = MaxFileContents + 1<<20

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
	Auth Authenticator
	// AuthorizationServers are advertised in the protected resource
	// metadata.
	AuthorizationServers []string
	// MaxBodyBytes caps request bodies (413 beyond it).
	MaxBodyBytes int64
	// SessionIdleTTL forgets sessions unused for this long.
	SessionIdleTTL time.Duration
	// RequestsPerSecond limits each identity's requests (429 beyond it,
	// with Retry-After); Burst is the bucket size. Zero disables the limit.
	RequestsPerSecond float64
	Burst             int
	// Ready reports readiness for /readyz.
	Ready  func(context.Context) error
	Logger *slog.Logger
}

// HTTPServer is the MCP endpoint with its security middleware, the health
// endpoints and the OAuth protected resource metadata.
type HTTPServer struct {
	opts     HTTPOptions
	mcp      *server.StreamableHTTPServer
	sessions *sessionStore
	handler  http.Handler
	metaPath string

	limitersMu sync.Mutex
	limiters   map[string]*identityLimiter
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
	if opts.SessionIdleTTL <= 0 {
		opts.SessionIdleTTL = time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Burst <= 0 {
		opts.Burst = max(1, int(2*opts.RequestsPerSecond))
	}
	h := &HTTPServer{opts: opts, sessions: newSessionStore(opts.SessionIdleTTL), limiters: map[string]*identityLimiter{}}
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
		BearerMethodsSupported: []string{"header"},
		ResourceName:           ServerName,
	}
	h.metaPath = server.ProtectedResourceMetadataPath(opts.ResourceURL)
	metaHandler := server.NewProtectedResourceMetadataHandler(meta)

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
	mux.Handle(EndpointPath, h.rejectQueryTokens(h.limitBody(h.authenticate(h.rateLimit(h.bindSession(h.mcp))))))
	h.handler = h.checkHostAndOrigin(mux)
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *HTTPServer) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.handler.ServeHTTP(w, r) }

// Shutdown ends the MCP sessions.
func (h *HTTPServer) Shutdown(ctx context.Context) error { return h.mcp.Shutdown(ctx) }

func (h *HTTPServer) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
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
// or exactly one of the allowed origins.
func OriginAllowed(allowed []string, origin string) bool {
	if origin == "" {
		return true
	}
	origin = strings.ToLower(strings.TrimRight(origin, "/"))
	return slices.ContainsFunc(allowed, func(a string) bool { return strings.ToLower(strings.TrimRight(a, "/")) == origin })
}

func (h *HTTPServer) checkHostAndOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Probes come from the orchestrator by IP; they reveal nothing.
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if !HostAllowed(h.opts.AllowedHosts, r.Host) {
			h.opts.Logger.Warn("refused request for a Host not in --allowed-hosts (DNS rebinding?)", "host", truncate(r.Host, 100), "remote", r.RemoteAddr)
			http.Error(w, "Forbidden: Host not allowed", http.StatusForbidden)
			return
		}
		if origin := r.Header.Get("Origin"); !OriginAllowed(h.opts.AllowedOrigins, origin) {
			h.opts.Logger.Warn("refused request from an Origin not in --allowed-origins", "origin", truncate(origin, 100), "remote", r.RemoteAddr)
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

// limitBody reads the whole body up front (the MCP handler would anyway)
// so that an oversized one gets a plain 413 instead of a JSON-RPC parse
// error.
func (h *HTTPServer) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > h.opts.MaxBodyBytes {
			http.Error(w, fmt.Sprintf("Request Entity Too Large: the limit is %d bytes", h.opts.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return
		}
		if r.Body != nil && r.Method == http.MethodPost {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, fmt.Sprintf("Request Entity Too Large: the limit is %d bytes", h.opts.MaxBodyBytes), http.StatusRequestEntityTooLarge)
				return
			}
			if err != nil {
				http.Error(w, "Bad Request: reading the body failed", http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
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
		_, anonymous := h.opts.Auth.(AnonymousAuthenticator)
		if !anonymous && (!strings.EqualFold(scheme, "Bearer") || token == "") {
			h.unauthorized(w, "a bearer token is required (Authorization: Bearer <token>)", false)
			return
		}
		caller, err := h.opts.Auth.Authenticate(r.Context(), token)
		if errors.Is(err, ErrUnauthenticated) {
			h.opts.Logger.Info("authentication failed", "remote", r.RemoteAddr, "reason", err)
			h.unauthorized(w, "invalid or expired token", true)
			return
		}
		if errors.Is(err, ErrForbidden) {
			h.opts.Logger.Info("authorization refused", "caller", IdentityHash(caller.ID), "remote", r.RemoteAddr)
			http.Error(w, "Forbidden: "+strings.TrimPrefix(err.Error(), ErrForbidden.Error()+": "), http.StatusForbidden)
			return
		}
		if err != nil {
			h.opts.Logger.Error("authentication unavailable", "error", err)
			http.Error(w, "Service Unavailable: cannot verify the token right now", http.StatusServiceUnavailable)
			return
		}
		caller.Session = r.Header.Get(sessionHeader)
		next.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), caller)))
	})
}

// rateLimit gives each identity a token bucket, so that one agent in a loop
// cannot starve the others or the Docker Engine behind them.
func (h *HTTPServer) rateLimit(next http.Handler) http.Handler {
	if h.opts.RequestsPerSecond <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, _ := CallerFrom(r.Context())
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

// bindSession refuses a session ID that belongs to another identity with
// the same 404 an unknown session gets, so that session IDs reveal
// nothing across identities.
func (h *HTTPServer) bindSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(sessionHeader); id != "" {
			caller, _ := CallerFrom(r.Context())
			if owner, ok := h.sessions.owner(id); ok && owner != caller.ID {
				h.opts.Logger.Warn("refused a session ID presented by another identity", "caller", IdentityHash(caller.ID), "remote", r.RemoteAddr)
				http.Error(w, "Not Found: unknown session", http.StatusNotFound)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sessionStore issues session IDs bound to the identity that initialized
// them. It implements mcp-go's SessionIdManagerResolver: each request gets
// a manager that validates session IDs against that request's identity.
type sessionStore struct {
	ttl time.Duration

	mu       sync.Mutex
	sessions map[string]*sessionInfo
}

type sessionInfo struct {
	identity   string
	terminated bool
	lastSeen   time.Time
}

func newSessionStore(ttl time.Duration) *sessionStore {
	return &sessionStore{ttl: ttl, sessions: map[string]*sessionInfo{}}
}

func (s *sessionStore) owner(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info, ok := s.sessions[id]
	if !ok {
		return "", false
	}
	return info.identity, true
}

// ResolveSessionIdManager implements server.SessionIdManagerResolver. r is
// nil for the transport's own housekeeping, which may touch any session.
func (s *sessionStore) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	m := &boundSessions{store: s}
	if r != nil {
		c, _ := CallerFrom(r.Context())
		m.identity, m.checked = c.ID, true
	}
	return m
}

type boundSessions struct {
	store    *sessionStore
	identity string
	checked  bool
}

// Generate issues 128 random bits, hex encoded (visible ASCII only, as the
// transport requires).
func (m *boundSessions) Generate() string {
	id := randomHex(16)
	now := time.Now()
	s := m.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, info := range s.sessions {
		if now.Sub(info.lastSeen) > s.ttl {
			delete(s.sessions, k)
		}
	}
	s.sessions[id] = &sessionInfo{identity: m.identity, lastSeen: now}
	return id
}

func (m *boundSessions) Validate(id string) (bool, error) {
	s := m.store
	s.mu.Lock()
	defer s.mu.Unlock()
	info, ok := s.sessions[id]
	if !ok || (m.checked && info.identity != m.identity) {
		return false, errors.New("unknown session")
	}
	if info.terminated {
		return true, nil
	}
	info.lastSeen = time.Now()
	return false, nil
}

func (m *boundSessions) Terminate(id string) (bool, error) {
	s := m.store
	s.mu.Lock()
	defer s.mu.Unlock()
	info, ok := s.sessions[id]
	if !ok {
		return false, nil
	}
	if m.checked && info.identity != m.identity {
		return true, nil
	}
	info.terminated = true
	info.lastSeen = time.Now()
	return false, nil
}
