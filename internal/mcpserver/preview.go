package mcpserver

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Preview URLs: expose_port signs a token naming one sandbox, one port,
// an expiry and a nonce, with a key derived from the owner key (so every
// replica sharing the owner key can check it, and the owner key itself
// signs nothing else). The token authorises only that port: the handler
// proxies to nothing but what the token names, and only while the backend
// still holds the exposure under the same nonce (unexpose_port, a newer
// expose_port of the port and the sandbox's end revoke it).
const (
	// PreviewPrefix is the path under which previews are served.
	PreviewPrefix = "/preview/"
	// DefaultPreviewExpiry and MaxPreviewExpiry bound expires_in_seconds.
	DefaultPreviewExpiry = time.Hour
	MaxPreviewExpiry     = 24 * time.Hour
	previewKeyPurpose    = "preview-url v1"
	previewTokenVersion  = "v1"
)

// previewClaims is a token's signed content.
type previewClaims struct {
	Owner   string `json:"o"`
	ID      string `json:"s"`
	Port    int    `json:"p"`
	Expires int64  `json:"e"`
	Nonce   string `json:"n"`
}

func previewMAC(payload string) []byte {
	mac := hmac.New(sha256.New, contract.DerivedKey(previewKeyPurpose))
	mac.Write([]byte(previewTokenVersion + "." + payload))
	return mac.Sum(nil)
}

// signPreview returns the token for c.
func signPreview(c previewClaims) string {
	b, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(b)
	return previewTokenVersion + "." + payload + "." + base64.RawURLEncoding.EncodeToString(previewMAC(payload))
}

// errPreviewToken is any token that does not verify: malformed, tampered
// or signed with another key. Its text says no more than that.
var errPreviewToken = errors.New("invalid preview token")

// verifyPreview checks token's signature and expiry at now.
func verifyPreview(token string, now time.Time) (previewClaims, error) {
	var c previewClaims
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != previewTokenVersion || len(token) > 1024 {
		return c, errPreviewToken
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, previewMAC(parts[1])) {
		return c, errPreviewToken
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(b, &c) != nil || c.ID == "" || c.Port < 1 || c.Port > 65535 {
		return c, errPreviewToken
	}
	if !now.Before(time.Unix(c.Expires, 0)) {
		return c, fmt.Errorf("%w: the preview URL expired at %s", contract.ErrNotExposed, time.Unix(c.Expires, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// previewTarget is the verified exposure a request may reach, passed to
// the proxy's dialer in the request's context.
type previewTargetKey struct{}

// PreviewHandler serves preview URLs (PreviewPrefix + token + path):
// HTTP and WebSocket (any Upgrade), proxied to the exposed port through
// backend.DialExposed. Everything else is 404. Serve it on its own
// listener (its own origin), not the MCP endpoint's.
func PreviewHandler(backend contract.PortBackend, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			x, ok := ctx.Value(previewTargetKey{}).(contract.Exposure)
			if !ok || addr != previewHost(x)+":80" {
				// Never reached: every outgoing request is one of ours.
				return nil, errors.New("preview: no verified target for this connection")
			}
			pc, err := backend.DialExposed(ctx, x)
			if err != nil {
				return nil, err
			}
			return portNetConn{pc}, nil
		},
		// A new connection costs one helper exec (Docker backend, tens
		// of ms), so a few are kept per sandbox and port (the host names
		// them) for a short while. Every request is checked against the
		// exposure first (CheckExposed), pooled connection or not, so a
		// revocation refuses the next request at once; an open WebSocket
		// lives on until either end closes it. A pooled connection keeps
		// its sandbox marked in use until IdleConnTimeout.
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			x := r.In.Context().Value(previewTargetKey{}).(contract.Exposure)
			r.Out.URL.Scheme = "http"
			r.Out.URL.Host = previewHost(x)
			r.Out.Host = "127.0.0.1:" + strconv.Itoa(x.Port)
			// Nothing of the caller's credentials for this server reaches
			// the sandbox.
			for _, h := range []string{"Authorization", "Proxy-Authorization", "Mcp-Session-Id", "Mcp-Protocol-Version"} {
				r.Out.Header.Del(h)
			}
		},
		Transport: transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writePreviewError(w, err)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, PreviewPrefix)
		if !ok {
			http.Error(w, "not found: previews are under "+PreviewPrefix+"<token>/", http.StatusNotFound)
			return
		}
		token, path, _ := strings.Cut(rest, "/")
		c, err := verifyPreview(token, time.Now())
		if err != nil {
			writePreviewError(w, err)
			return
		}
		x := contract.Exposure{Owner: c.Owner, ID: c.ID, Port: c.Port, Nonce: c.Nonce}
		if err := backend.CheckExposed(r.Context(), x); err != nil {
			writePreviewError(w, err)
			return
		}
		r2 := r.Clone(context.WithValue(r.Context(), previewTargetKey{}, x))
		r2.URL.Path = "/" + path
		r2.URL.RawPath = ""
		if raw, ok := strings.CutPrefix(r.URL.EscapedPath(), PreviewPrefix+token); ok {
			r2.URL.RawPath = raw
			if r2.URL.RawPath == "" {
				r2.URL.RawPath = "/"
			}
		}
		logger.Debug("preview", "sandbox", c.ID, "port", c.Port, "path", r2.URL.Path)
		proxy.ServeHTTP(w, r2)
	})
}

// previewHost names a sandbox's port for the connection pool: connections
// are reused only for the same owner, sandbox and port (a hash, so that no
// two targets share a name).
func previewHost(x contract.Exposure) string {
	sum := sha256.Sum256([]byte(x.Owner + "\x00" + x.ID))
	return "s" + hex.EncodeToString(sum[:16]) + "-" + strconv.Itoa(x.Port) + ".preview.invalid"
}

// writePreviewError answers a refused or failed preview with a plain text
// body that says which.
func writePreviewError(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway
	msg := err.Error()
	switch {
	case errors.Is(err, errPreviewToken):
		code = http.StatusForbidden
		msg = "forbidden: the preview URL's token is invalid (malformed or tampered)"
	case errors.Is(err, contract.ErrNotExposed):
		code = http.StatusForbidden
		msg = "forbidden: " + msg
	case errors.Is(err, contract.ErrNotFound), errors.Is(err, contract.ErrNotRunning):
		code = http.StatusNotFound
		msg = "not found: the preview's sandbox no longer exists or is not running"
	case errors.Is(err, contract.ErrPortClosed):
		msg = "bad gateway: " + msg
	case errors.Is(err, context.Canceled):
		return
	default:
		msg = "bad gateway: reaching the sandbox's port failed: " + msg
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// portNetConn is a PortConn as the net.Conn http.Transport dials. The
// stream has no deadlines; the transport's timeouts end it by Close.
type portNetConn struct{ contract.PortConn }

func (portNetConn) LocalAddr() net.Addr              { return previewAddr{} }
func (portNetConn) RemoteAddr() net.Addr             { return previewAddr{} }
func (portNetConn) SetDeadline(time.Time) error      { return nil }
func (portNetConn) SetReadDeadline(time.Time) error  { return nil }
func (portNetConn) SetWriteDeadline(time.Time) error { return nil }

type previewAddr struct{}

func (previewAddr) Network() string { return "sandbox-port" }
func (previewAddr) String() string  { return "sandbox-port" }
