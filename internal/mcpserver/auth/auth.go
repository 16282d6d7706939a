// Package auth is the MCP server's authentication and the check of who may
// use it at all: static tokens, Kubernetes TokenReview, OpenID Connect JWT
// access tokens (oidc.go), and the allow-list
// (internal/mcpserver/accessreview is the RBAC one). It turns a bearer token
// into a contract.Caller and knows nothing of the protocol or the transport:
// the HTTP transport (internal/mcpserver/httptransport) calls it.
package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// ErrUnauthenticated: the bearer token is missing, unknown, expired or for
// another audience. The HTTP layer answers 401.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrForbidden: the caller is authenticated but may not use this server
// (--allow-user/--allow-group, or RBAC on the docker backend). The HTTP
// layer answers 403 with the error's message, which names what is missing.
var ErrForbidden = errors.New("forbidden")

// Authenticator turns a bearer token into a caller. Implementations must
// be safe for concurrent use and must not log or forward the token.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (contract.Caller, error)
}

// TokenRecognizer is implemented by authenticators that can tell, without
// any remote call, that a token is one they have recently accepted (for
// TokenReviewAuth: a positive cache entry). The HTTP transport lets such a
// token through even when its peer has used up its failed
// authentications, so that a caller behind the same address (a NAT, a
// proxy) as a token-guesser keeps working. Guessing gains nothing from it:
// only a token that is already valid is recognized.
type TokenRecognizer interface {
	Recognizes(token string) bool
}

// Recognizes reports whether a recognizes token as one it accepted
// recently (see TokenRecognizer).
func Recognizes(a Authenticator, token string) bool {
	r, ok := a.(TokenRecognizer)
	return ok && r.Recognizes(token)
}

// AnonymousAuthenticator accepts every request as one shared identity. It
// exists for --auth none, which the binary allows only on loopback.
type AnonymousAuthenticator struct{}

// AnonymousIdentity is the identity of every request under --auth none.
const AnonymousIdentity = "anonymous"

// Authenticate implements Authenticator.
func (AnonymousAuthenticator) Authenticate(context.Context, string) (contract.Caller, error) {
	return contract.Caller{ID: AnonymousIdentity}, nil
}

// MinTokenLength refuses guessable static tokens.
const MinTokenLength = 16

// tokenReloadInterval bounds how often the token file is checked for
// changes.
const tokenReloadInterval = time.Second

// StaticTokens authenticates against a file of "TOKEN IDENTITY" lines
// ('#' starts a comment). The file is re-read when it changes, so tokens
// can be rotated without a restart; a file that fails to parse keeps the
// previous tokens in force. Tokens are kept only as SHA-256 digests and
// compared in constant time.
type StaticTokens struct {
	path string
	log  *slog.Logger

	mu        sync.Mutex
	entries   []tokenEntry
	modTime   time.Time
	size      int64
	checkedAt time.Time
}

type tokenEntry struct {
	digest   [sha256.Size]byte
	identity string
}

// NewStaticTokens loads the token file; it fails if the file is unusable.
func NewStaticTokens(path string, logger *slog.Logger) (*StaticTokens, error) {
	t := &StaticTokens{path: path, log: logger}
	if err := t.reload(true); err != nil {
		return nil, err
	}
	return t, nil
}

// parseTokens parses a token file's contents.
func parseTokens(data []byte) ([]tokenEntry, error) {
	var out []tokenEntry
	seen := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want \"TOKEN IDENTITY\", got %d fields", n, len(fields))
		}
		if len(fields[0]) < MinTokenLength {
			return nil, fmt.Errorf("line %d: token shorter than %d characters", n, MinTokenLength)
		}
		d := sha256.Sum256([]byte(fields[0]))
		if seen[d] {
			return nil, fmt.Errorf("line %d: duplicate token", n)
		}
		seen[d] = true
		out = append(out, tokenEntry{digest: d, identity: fields[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no tokens")
	}
	return out, nil
}

func (t *StaticTokens) reload(initial bool) error {
	info, err := os.Stat(t.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if !initial && info.ModTime().Equal(t.modTime) && info.Size() == t.size {
		return nil
	}
	if info.Mode().Perm()&0o077 != 0 && t.log != nil {
		t.log.Warn("the token file is readable by other users; chmod 600 it", "path", t.path)
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	entries, err := parseTokens(data)
	if err != nil {
		return fmt.Errorf("token file %s: %w", t.path, err)
	}
	t.entries, t.modTime, t.size = entries, info.ModTime(), info.Size()
	if !initial && t.log != nil {
		t.log.Info("token file reloaded", "tokens", len(entries))
	}
	return nil
}

// Authenticate implements Authenticator.
func (t *StaticTokens) Authenticate(_ context.Context, token string) (contract.Caller, error) {
	t.mu.Lock()
	if time.Since(t.checkedAt) >= tokenReloadInterval {
		t.checkedAt = time.Now()
		if err := t.reload(false); err != nil && t.log != nil {
			t.log.Error("token file reload failed; keeping the previous tokens", "error", err)
		}
	}
	entries := t.entries
	t.mu.Unlock()
	d := sha256.Sum256([]byte(token))
	identity := ""
	// Every entry is compared, so the time taken says nothing about which
	// token (if any) matched.
	for _, e := range entries {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			identity = e.identity
		}
	}
	if identity == "" {
		return contract.Caller{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	return contract.Caller{ID: identity}, nil
}

// CallerAuthorizer decides whether an authenticated caller may use the
// server at all. It returns nil, an error matching ErrForbidden (403) or
// one matching ErrUnavailable (503).
type CallerAuthorizer interface {
	Authorize(ctx context.Context, caller contract.Caller) error
}

// WithAuthorization returns an Authenticator that authenticates with authn,
// then admits only the callers authz allows. A refused caller is returned
// together with the ErrForbidden error, so that the HTTP layer can log who
// it was (as a hash).
func WithAuthorization(authn Authenticator, authz CallerAuthorizer) Authenticator {
	return authorizingAuthenticator{authn: authn, authz: authz}
}

type authorizingAuthenticator struct {
	authn Authenticator
	authz CallerAuthorizer
}

// Recognizes implements TokenRecognizer: the token is recognized when the
// wrapped authenticator recognizes it; the authorization still runs.
func (a authorizingAuthenticator) Recognizes(token string) bool { return Recognizes(a.authn, token) }

func (a authorizingAuthenticator) Authenticate(ctx context.Context, token string) (contract.Caller, error) {
	c, err := a.authn.Authenticate(ctx, token)
	if err != nil {
		return contract.Caller{}, err
	}
	if err := a.authz.Authorize(ctx, c); err != nil {
		return c, err
	}
	return c, nil
}

// AllowList admits the Kubernetes callers whose username is in Users or
// who are in one of Groups (--allow-user, --allow-group). Names are
// compared exactly, as RBAC compares them.
type AllowList struct {
	Users  []string
	Groups []string
}

// Authorize implements CallerAuthorizer.
func (l AllowList) Authorize(_ context.Context, c contract.Caller) error {
	if c.IsKubernetesUser() && (slices.Contains(l.Users, c.Username) || slices.ContainsFunc(c.Groups, func(g string) bool { return slices.Contains(l.Groups, g) })) {
		return nil
	}
	name := c.Username
	if name == "" {
		name = c.ID
	}
	return fmt.Errorf("%w: user %q is not allowed to use this server: it is not named by --allow-user and is in no group named by --allow-group", ErrForbidden, name)
}
