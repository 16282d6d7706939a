package auth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc"
	jose "gopkg.in/go-jose/go-jose.v2"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Defaults of OIDCOptions.
const (
	// DefaultOIDCUsernameClaim names the caller, as kube-apiserver's
	// --oidc-username-claim does.
	DefaultOIDCUsernameClaim = "sub"
	// DefaultOIDCPrefix starts every username and group an issuer's token
	// maps to, so that no claim can name a Kubernetes user or group that
	// exists for other reasons (system:serviceaccount:…, system:masters).
	DefaultOIDCPrefix = "oidc:"
)

// OIDC limits: a token longer than maxOIDCTokenBytes is refused before it
// is parsed; discovery is retried at most every oidcDiscoveryRetry while
// the issuer is unreachable; accepted tokens are remembered (for
// Recognizes and to spare the signature check) for at most oidcCacheTTL
// and never past their expiry, at most oidcCacheEntries of them.
const (
	maxOIDCTokenBytes  = 16 << 10
	oidcDiscoveryRetry = 5 * time.Second
	oidcHTTPTimeout    = 10 * time.Second
	oidcCacheTTL       = 10 * time.Second
	oidcCacheEntries   = 4096
)

// OIDCOptions configure OIDCAuth.
type OIDCOptions struct {
	// IssuerURL is the issuer: discovery is read from
	// IssuerURL/.well-known/openid-configuration, its "issuer" must equal
	// IssuerURL exactly, and so must every token's iss. It must be https.
	IssuerURL string
	// CAFile, when set, holds the PEM CAs that the issuer's certificate
	// must chain to (default: the system roots).
	CAFile string
	// Audience is this server's resource URL: a token's aud must name it
	// exactly (RFC 8707). A token for any other resource is refused.
	Audience string
	// UsernameClaim names the caller (default DefaultOIDCUsernameClaim);
	// UsernamePrefix is put before its value (default
	// DefaultOIDCPrefix). The prefix may not be empty nor start with
	// "system:".
	UsernameClaim  string
	UsernamePrefix string
	// GroupsClaim, when set, names a claim (a string or a list of strings)
	// whose values, each after GroupsPrefix (default DefaultOIDCPrefix),
	// are the caller's groups.
	GroupsClaim  string
	GroupsPrefix string
	// NamespaceClaim and Namespaces map a caller to the namespace its
	// Sandboxes live in: the claim's value (a string, or each string of a
	// list) is looked up in Namespaces. Only values the configuration maps
	// count; a token whose values map to no namespace gets none (the
	// server's --namespace), one whose values map to several is refused.
	NamespaceClaim string
	Namespaces     map[string]string
	// Now is the clock tokens are checked against (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// OIDCAuth authenticates JWT access tokens from one OpenID Connect issuer
// with github.com/coreos/go-oidc (the library kube-apiserver's own JWT
// authenticator uses): the signature against the issuer's published keys,
// iss, aud and exp. The caller is a Kubernetes user named by a claim under
// a prefix, so that a SubjectAccessReview decides what it may do, exactly
// as for --auth kubernetes.
//
// Discovery happens on the first token, not at start-up, so that the
// server starts while its issuer is down (the issuer may even run in the
// same cluster); until discovery succeeds, every token gets
// contract.ErrUnavailable (503), not a 401 that would make a client throw
// its good token away.
type OIDCAuth struct {
	opts   OIDCOptions
	client *http.Client
	now    func() time.Time

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
	lastTry  time.Time
	lastErr  error

	cacheMu sync.Mutex
	cache   map[[sha256.Size]byte]oidcCacheEntry
}

type oidcCacheEntry struct {
	caller contract.Caller
	until  time.Time
}

// NewOIDCAuth checks opts and reads the CA file; it does not contact the
// issuer.
func NewOIDCAuth(opts OIDCOptions) (*OIDCAuth, error) {
	u, err := url.Parse(opts.IssuerURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("OIDC issuer URL %q: want an https URL without query or fragment (it must equal the issuer's \"iss\" exactly)", opts.IssuerURL)
	}
	if a, err := url.Parse(opts.Audience); err != nil || !a.IsAbs() || a.Host == "" {
		return nil, fmt.Errorf("OIDC audience %q: want this server's absolute resource URL", opts.Audience)
	}
	if opts.UsernameClaim == "" {
		opts.UsernameClaim = DefaultOIDCUsernameClaim
	}
	for _, p := range []*string{&opts.UsernamePrefix, &opts.GroupsPrefix} {
		if *p == "" {
			*p = DefaultOIDCPrefix
		}
		if strings.HasPrefix(*p, "system:") {
			return nil, fmt.Errorf("OIDC username/groups prefix %q: it may not start with \"system:\", the names Kubernetes reserves for its own users and groups", *p)
		}
	}
	if (opts.NamespaceClaim == "") != (len(opts.Namespaces) == 0) {
		return nil, errors.New("an OIDC namespace claim and a mapping of its values to namespaces go together")
	}
	for v, ns := range opts.Namespaces {
		if v == "" {
			return nil, fmt.Errorf("OIDC namespace mapping to %q: empty claim value", ns)
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("OIDC namespace mapping %s=%s: %s", v, ns, strings.Join(errs, "; "))
		}
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("OIDC CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("OIDC CA file %s: no PEM certificate in it", opts.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConfig
	// The issuer's answers (discovery, keys) are followed nowhere else:
	// a redirect could point the key fetch at another host.
	client := &http.Client{Transport: tr, Timeout: oidcHTTPTimeout, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	a := &OIDCAuth{opts: opts, client: client, now: opts.Now, cache: map[[sha256.Size]byte]oidcCacheEntry{}}
	if a.now == nil {
		a.now = time.Now
	}
	return a, nil
}

// tokenVerifier returns the verifier, discovering the issuer first if
// need be (at most once per oidcDiscoveryRetry).
func (a *OIDCAuth) tokenVerifier() (*oidc.IDTokenVerifier, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.verifier != nil {
		return a.verifier, nil
	}
	if !a.lastTry.IsZero() && time.Since(a.lastTry) < oidcDiscoveryRetry {
		return nil, a.lastErr
	}
	a.lastTry = time.Now()
	// The provider keeps this context for its later key fetches, so it
	// must outlive the request.
	ctx := oidc.ClientContext(context.Background(), a.client)
	p, err := oidc.NewProvider(ctx, a.opts.IssuerURL)
	if err != nil {
		a.lastErr = fmt.Errorf("%w: OIDC discovery at %s: %w", contract.ErrUnavailable, a.opts.IssuerURL, err)
		if a.opts.Logger != nil {
			a.opts.Logger.Error("OIDC issuer discovery failed; tokens get 503 until it succeeds", "issuer", a.opts.IssuerURL, "error", err)
		}
		return nil, a.lastErr
	}
	var algs struct {
		Algs []string `json:"id_token_signing_alg_values_supported"`
	}
	_ = p.Claims(&algs)
	a.verifier = p.Verifier(&oidc.Config{
		ClientID: a.opts.Audience,
		// The issuer's advertised algorithms (RS256 when it names none);
		// go-oidc refuses "none" and HMAC whatever is listed.
		SupportedSigningAlgs: algs.Algs,
		Now:                  a.now,
	})
	if a.opts.Logger != nil {
		a.opts.Logger.Info("OIDC issuer discovered", "issuer", a.opts.IssuerURL)
	}
	return a.verifier, nil
}

// Recognizes implements TokenRecognizer: the token was accepted within
// oidcCacheTTL and has not expired since.
func (a *OIDCAuth) Recognizes(token string) bool {
	_, ok := a.cached(token)
	return ok
}

func (a *OIDCAuth) cached(token string) (contract.Caller, bool) {
	d := sha256.Sum256([]byte(token))
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	e, ok := a.cache[d]
	if !ok || !a.now().Before(e.until) {
		return contract.Caller{}, false
	}
	return e.caller, true
}

func (a *OIDCAuth) remember(token string, c contract.Caller, expiry time.Time) {
	d := sha256.Sum256([]byte(token))
	now := a.now()
	until := now.Add(oidcCacheTTL)
	if expiry.Before(until) {
		until = expiry
	}
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	if len(a.cache) >= oidcCacheEntries {
		for k, e := range a.cache {
			if !now.Before(e.until) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= oidcCacheEntries {
			return // full of live entries: verify instead of caching
		}
	}
	a.cache[d] = oidcCacheEntry{caller: c, until: until}
}

// Authenticate implements Authenticator.
func (a *OIDCAuth) Authenticate(ctx context.Context, token string) (contract.Caller, error) {
	if c, ok := a.cached(token); ok {
		return c, nil
	}
	// Refused before any key is looked at: a token too long, not a
	// compact JWS, or from another issuer. A token from another issuer
	// would otherwise make go-oidc fetch the keys again, looking for its
	// key ID.
	if len(token) > maxOIDCTokenBytes || strings.Count(token, ".") != 2 {
		return contract.Caller{}, fmt.Errorf("%w: not a JWT", ErrUnauthenticated)
	}
	jws, err := jose.ParseSigned(token)
	if err != nil {
		return contract.Caller{}, fmt.Errorf("%w: not a JWT: %v", ErrUnauthenticated, err)
	}
	var unverified struct {
		Issuer string `json:"iss"`
	}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &unverified); err != nil || unverified.Issuer != a.opts.IssuerURL {
		return contract.Caller{}, fmt.Errorf("%w: the token is not from issuer %s", ErrUnauthenticated, a.opts.IssuerURL)
	}
	v, err := a.tokenVerifier()
	if err != nil {
		return contract.Caller{}, err
	}
	t, err := v.Verify(ctx, token)
	if err != nil {
		// go-oidc does not tell a key fetch that failed from a bad
		// token except by its message.
		if strings.Contains(err.Error(), "fetching keys") {
			return contract.Caller{}, fmt.Errorf("%w: OIDC keys: %w", contract.ErrUnavailable, err)
		}
		return contract.Caller{}, fmt.Errorf("%w: %w (this server wants a token from %s for audience %s)", ErrUnauthenticated, err, a.opts.IssuerURL, a.opts.Audience)
	}
	var claims map[string]json.RawMessage
	if err := t.Claims(&claims); err != nil {
		return contract.Caller{}, fmt.Errorf("%w: claims: %w", ErrUnauthenticated, err)
	}
	c, err := a.caller(claims)
	if err != nil {
		return contract.Caller{}, err
	}
	a.remember(token, c, t.Expiry)
	return c, nil
}

// caller maps a verified token's claims to the caller.
func (a *OIDCAuth) caller(claims map[string]json.RawMessage) (contract.Caller, error) {
	var name string
	if err := json.Unmarshal(claims[a.opts.UsernameClaim], &name); err != nil || name == "" {
		return contract.Caller{}, fmt.Errorf("%w: the token has no string claim %q to name its user", ErrUnauthenticated, a.opts.UsernameClaim)
	}
	username := a.opts.UsernamePrefix + name
	c := contract.Caller{ID: "kube:" + username, Username: username}
	if a.opts.GroupsClaim != "" {
		groups, err := stringsClaim(claims, a.opts.GroupsClaim)
		if err != nil {
			return contract.Caller{}, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		for _, g := range groups {
			c.Groups = append(c.Groups, a.opts.GroupsPrefix+g)
		}
	}
	if a.opts.NamespaceClaim != "" {
		values, err := stringsClaim(claims, a.opts.NamespaceClaim)
		if err != nil {
			return contract.Caller{}, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		var namespaces []string
		for _, v := range values {
			if ns, ok := a.opts.Namespaces[v]; ok && !slices.Contains(namespaces, ns) {
				namespaces = append(namespaces, ns)
			}
		}
		switch len(namespaces) {
		case 0:
		case 1:
			c.Namespace = namespaces[0]
		default:
			slices.Sort(namespaces)
			return c, fmt.Errorf("%w: the token's claim %q maps to several namespaces (%s); this server cannot choose one: the issuer must give this user values that map to one namespace", ErrForbidden, a.opts.NamespaceClaim, strings.Join(namespaces, ", "))
		}
	}
	return c, nil
}

// stringsClaim reads a claim that is absent, a string or a list of
// strings.
func stringsClaim(claims map[string]json.RawMessage, name string) ([]string, error) {
	raw, ok := claims[name]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("claim %q is neither a string nor a list of strings", name)
	}
	return many, nil
}
