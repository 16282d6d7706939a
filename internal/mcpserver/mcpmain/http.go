package mcpmain

// The HTTP transport: listening, its checks and limits, and authentication.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/server"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/accessreview"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
)

type httpSetup struct {
	listener net.Listener
	url      string
	opts     transport.HTTPOptions
	tlsCert  string
	tlsKey   string
	// drainDelay and shutdownGrace: see Config.DrainDelay.
	drainDelay    time.Duration
	shutdownGrace time.Duration
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// setupHTTP checks the HTTP settings and listens. kube, when set, is the
// kubernetes backend's cluster access, which --auth kubernetes then shares.
func setupHTTP(o Config, kube *kubeSetup, logger *slog.Logger) (*httpSetup, error) {
	host, _, err := net.SplitHostPort(o.HTTPAddr)
	if err != nil {
		return nil, usagef("--http %q: want HOST:PORT, for example 127.0.0.1:8080: %v", o.HTTPAddr, err)
	}
	loopback := isLoopbackHost(host)
	if !loopback && !o.AllowRemote {
		return nil, usagef("--http %q is not a loopback address; bind 127.0.0.1, or pass --allow-remote (with --auth token or kubernetes, preferably behind TLS)", o.HTTPAddr)
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, usagef("--tls-cert and --tls-key go together")
	}
	if o.MaxRequestsPerPeer < 0 || o.AuthFailuresPerMinute < 0 || o.MaxSessionsPerIdentity < 0 || o.MaxToolCallsPerIdentity < 0 {
		return nil, usagef("--max-requests-per-peer, --auth-failures-per-minute, --max-sessions-per-identity and --max-tool-calls-per-identity take a count (0 disables), not a negative number")
	}
	if o.HTTPReadHeaderTimeout <= 0 || o.HTTPReadTimeout <= 0 || o.HTTPIdleTimeout <= 0 {
		return nil, usagef("--http-read-header-timeout, --http-read-timeout and --http-idle-timeout must be positive")
	}
	if o.DrainDelay < 0 || o.ShutdownGrace < 0 {
		return nil, usagef("--drain-delay and --shutdown-grace take a duration (0: none, and the default grace), not a negative one")
	}
	if o.ShutdownGrace > 0 && o.ShutdownGrace < o.MaxCommandTimeout {
		logger.Warn("--shutdown-grace is shorter than --max-command-timeout: a stopping server may cut a command it allowed",
			"shutdown_grace", o.ShutdownGrace, "max_command_timeout", o.MaxCommandTimeout)
	}
	if o.Auth != "kubernetes" && o.AcceptAPIServerAudience {
		return nil, usagef("--accept-apiserver-audience needs --auth kubernetes")
	}
	if o.Auth != "kubernetes" && o.Auth != "oidc" && (len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0) {
		return nil, usagef("--allow-user and --allow-group need --auth kubernetes or oidc")
	}
	if o.Auth != "oidc" && !reflect.DeepEqual(o.OIDC, DefaultConfig().OIDC) {
		return nil, usagef("the --oidc-* flags need --auth oidc")
	}
	for _, sc := range o.ScopesSupported {
		// RFC 6749 section 3.3: a scope token is printable ASCII without
		// space, '"' or '\', which also keeps the challenge well formed.
		if strings.ContainsFunc(sc, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' || r == '\\' }) {
			return nil, usagef("--scope %q: a scope is printable ASCII without spaces, '\"' or '\\'", sc)
		}
	}
	var authn auth.Authenticator
	switch o.Auth {
	case "none":
		if !loopback {
			return nil, usagef("--auth none is only allowed on a loopback address")
		}
		logger.Warn("!!! --auth none: ANY local process or user that can reach " + o.HTTPAddr + " can run code in sandboxes as the shared identity \"anonymous\". Use --auth token for anything but a single-user machine. !!!")
		authn = auth.AnonymousAuthenticator{}
	case "token":
		if o.TokenFile == "" {
			return nil, usagef("--auth token needs --token-file FILE (lines \"TOKEN IDENTITY\"; tokens of at least %d characters)", auth.MinTokenLength)
		}
		if authn, err = auth.NewStaticTokens(o.TokenFile, logger); err != nil {
			return nil, usageError{err}
		}
	case "kubernetes":
		if authn, err = kubeAuth(o, kube, logger); err != nil {
			return nil, err
		}
	case "oidc":
		// Made once the resource URL, its audience, is known.
		if o.OIDC.IssuerURL == "" {
			return nil, usagef("--auth oidc needs --oidc-issuer-url (the issuer whose JWT access tokens this server accepts)")
		}
	default:
		return nil, usagef("--auth %q: want token, kubernetes, oidc or none", o.Auth)
	}
	if !loopback && o.TLSCert == "" {
		logger.Warn("serving plain HTTP on a non-loopback address: bearer tokens cross the network in clear text; use --tls-cert/--tls-key or a TLS-terminating proxy")
	}

	ln, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", o.HTTPAddr, err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	scheme := "http"
	if o.TLSCert != "" {
		scheme = "https"
	}
	urlHost := host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		urlHost = "127.0.0.1"
	}
	resource := o.PublicURL
	if resource == "" {
		resource = scheme + "://" + net.JoinHostPort(urlHost, port) + transport.EndpointPath
	}
	pu, err := url.Parse(resource)
	if err != nil || pu.Host == "" {
		ln.Close()
		return nil, usagef("--public-url %q is not an absolute URL", resource)
	}
	authServers := o.AuthorizationServers
	if o.Auth == "oidc" {
		if authn, err = oidcAuth(o, kube, resource, logger); err != nil {
			ln.Close()
			return nil, err
		}
		if len(authServers) == 0 {
			authServers = []string{o.OIDC.IssuerURL}
		}
	}
	hosts := o.AllowedHosts
	if len(hosts) == 0 {
		hosts = []string{net.JoinHostPort("localhost", port), net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port), pu.Host}
		if host != "" && !isLoopbackHost(host) {
			hosts = append(hosts, net.JoinHostPort(host, port))
		}
	}
	return &httpSetup{
		listener: ln,
		url:      resource,
		opts: transport.HTTPOptions{
			ResourceURL:             resource,
			AllowedHosts:            hosts,
			AllowedOrigins:          o.AllowedOrigins,
			Auth:                    authn,
			AuthorizationServers:    authServers,
			ScopesSupported:         o.ScopesSupported,
			MaxBodyBytes:            o.MaxBodyBytes,
			RequestsPerSecond:       o.RateLimit,
			MaxRequestsPerPeer:      zeroDisables(o.MaxRequestsPerPeer),
			AuthFailuresPerMinute:   zeroDisables(o.AuthFailuresPerMinute),
			MaxSessionsPerIdentity:  zeroDisables(o.MaxSessionsPerIdentity),
			MaxMessageBytes:         o.MaxMessageBytes,
			MaxToolCallsPerIdentity: zeroDisables(o.MaxToolCallsPerIdentity),
			ReadHeaderTimeout:       o.HTTPReadHeaderTimeout,
			ReadTimeout:             o.HTTPReadTimeout,
			IdleTimeout:             o.HTTPIdleTimeout,
			Logger:                  logger,
		},
		tlsCert:       o.TLSCert,
		tlsKey:        o.TLSKey,
		drainDelay:    o.DrainDelay,
		shutdownGrace: o.shutdownGrace(),
	}, nil
}

// zeroDisables maps a limit flag, where 0 disables the limit, to
// transport.HTTPOptions, where 0 means the default and a negative value
// disables it.
func zeroDisables(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// sandboxCreate is what a caller needs in --namespace to use the docker
// backend under --auth kubernetes without an allow-list: the right to
// create Sandboxes there, which is what the kubernetes backend would ask of
// sandbox_initialize.
var sandboxCreate = accessreview.Permission{Verb: "create"}

// kubeAuth is --auth kubernetes: TokenReview for the server's own audience
// (and, with --accept-apiserver-audience, the API server's), and on the
// docker backend an authorization of every caller. kube, when set, is the
// kubernetes backend's cluster access, which it then shares.
func kubeAuth(o Config, kube *kubeSetup, logger *slog.Logger) (auth.Authenticator, error) {
	if len(o.TokenAudiences) == 0 {
		return nil, usagef("--token-audience: give at least one audience (default %s)", auth.DefaultTokenAudience)
	}
	if err := checkAllowList(o); err != nil {
		return nil, err
	}
	rc, err := kubeConfigFor(kube, o)
	if err != nil {
		return nil, err
	}
	if o.AcceptAPIServerAudience {
		logger.Warn("--accept-apiserver-audience: tokens for the API server's own audiences are accepted too; such a token can be replayed against the API server, and any token a caller hands to another service for the API server is a credential here. Prefer tokens for --token-audience (kubectl create token SA --audience " + o.TokenAudiences[0] + ")")
	}
	reviews, err := auth.NewTokenReviewAuth(rc, auth.TokenReviewOptions{
		Audiences:               o.TokenAudiences,
		AcceptAPIServerAudience: o.AcceptAPIServerAudience,
		Logger:                  logger,
	})
	if err != nil {
		return nil, err
	}
	return withDockerGate(o, reviews, rc, logger)
}

// checkAllowList checks --allow-user, --allow-group and --namespace
// before anything is loaded: an allow-list is for the docker backend, and
// there it replaces --namespace.
func checkAllowList(o Config) error {
	allowList := len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0
	switch {
	case o.Backend != "docker" && allowList:
		return usagef("--allow-user and --allow-group are for --backend docker; on the kubernetes backend RBAC in the Sandboxes' namespace decides every call")
	case o.Backend != "docker":
		return nil
	case allowList && o.Namespace != "":
		return usagef("--namespace has no effect with --allow-user/--allow-group on the docker backend: give one or the other")
	}
	if errs := validation.IsDNS1123Label(o.Namespace); o.Namespace != "" && len(errs) > 0 {
		return usagef("--namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	return nil
}

// kubeConfigFor is the cluster access of --auth kubernetes and oidc: the
// kubernetes backend's when there is one (kube), else --kubeconfig's.
func kubeConfigFor(kube *kubeSetup, o Config) (*rest.Config, error) {
	if kube != nil {
		return kube.config, nil
	}
	rc, err := auth.KubeRESTConfig(o.Kubeconfig)
	if err != nil {
		return nil, usageError{err}
	}
	// A review per identity every few seconds, and more at bursts.
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 50, 100
	}
	return rc, nil
}

// withDockerGate returns authn as it is on the kubernetes backend (whose
// SubjectAccessReviews decide every call), and on the docker backend wraps
// it in the authorization of every caller: --allow-user/--allow-group, or
// RBAC on --namespace.
func withDockerGate(o Config, authn auth.Authenticator, rc *rest.Config, logger *slog.Logger) (auth.Authenticator, error) {
	if o.Backend != "docker" {
		return authn, nil
	}
	var gate auth.CallerAuthorizer
	switch {
	case len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0:
		gate = auth.AllowList{Users: o.AllowUsers, Groups: o.AllowGroups}
	case o.Namespace == "":
		return nil, usagef("--backend docker with --auth %s must authorize callers: give --namespace NS (callers who may create sandboxes.%s there are admitted) or --allow-user/--allow-group", o.Auth, sandboxv1alpha1.GroupVersion.Group)
	}
	if gate == nil {
		az, err := accessreview.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		gate = accessreview.Gate{Authorizer: az, Namespace: o.Namespace, Permission: sandboxCreate}
		logger.Info("docker backend: admitting Kubernetes callers who may create sandboxes in the namespace (SubjectAccessReview)", "namespace", o.Namespace)
	} else {
		logger.Info("docker backend: admitting the Kubernetes callers of --allow-user and --allow-group", "users", len(o.AllowUsers), "groups", len(o.AllowGroups))
	}
	return auth.WithAuthorization(authn, gate), nil
}

// oidcAuth is --auth oidc: JWT access tokens from --oidc-issuer-url for
// audience resource (this server's resource URL, RFC 8707), mapped to
// prefixed Kubernetes users that SubjectAccessReviews authorize as under
// --auth kubernetes.
func oidcAuth(o Config, kube *kubeSetup, resource string, logger *slog.Logger) (auth.Authenticator, error) {
	if (o.OIDC.NamespaceClaim != "" || len(o.OIDC.Namespaces) > 0) && o.Backend != "kubernetes" {
		return nil, usagef("--oidc-namespace-claim and --oidc-namespace need --backend kubernetes")
	}
	if err := checkAllowList(o); err != nil {
		return nil, err
	}
	if o.NamespaceFromServiceAccount {
		return nil, usagef("--namespace-from-serviceaccount does not apply to --auth oidc (its users are never ServiceAccounts); map namespaces with --oidc-namespace-claim and --oidc-namespace")
	}
	a, err := auth.NewOIDCAuth(auth.OIDCOptions{
		IssuerURL:      o.OIDC.IssuerURL,
		CAFile:         o.OIDC.CAFile,
		Audience:       resource,
		UsernameClaim:  o.OIDC.UsernameClaim,
		UsernamePrefix: o.OIDC.UsernamePrefix,
		GroupsClaim:    o.OIDC.GroupsClaim,
		GroupsPrefix:   o.OIDC.GroupsPrefix,
		NamespaceClaim: o.OIDC.NamespaceClaim,
		Namespaces:     o.OIDC.Namespaces,
		Now:            oidcClock,
		Logger:         logger,
	})
	if err != nil {
		return nil, usageError{err}
	}
	logger.Info("--auth oidc: accepting JWT access tokens", "issuer", o.OIDC.IssuerURL, "audience", resource, "username_prefix", o.OIDC.UsernamePrefix)
	if o.Backend != "docker" {
		return a, nil
	}
	rc, err := kubeConfigFor(kube, o)
	if err != nil {
		return nil, err
	}
	return withDockerGate(o, a, rc, logger)
}

// oidcClock is the clock --auth oidc checks token expiry against; nil is
// time.Now. Only tests set it: the issuers they run (the API server's
// TokenRequest) mint tokens for at least ten minutes.
var oidcClock func() time.Time

// run serves until ctx ends, then drains: /readyz fails at once while
// everything is still served for --drain-delay (the Service's endpoints
// drop this replica meanwhile), then the listener closes and calls in
// flight get up to --shutdown-grace to finish before their connections are
// cut.
func (hs *httpSetup) run(ctx context.Context, stop context.CancelFunc, s *server.MCPServer, backend contract.Backend, logger *slog.Logger, listening func(url string)) error {
	hs.opts.Ready = backend.Ready
	handler, err := transport.NewHTTPServer(s, hs.opts)
	if err != nil {
		return usageError{err}
	}
	srv := handler.Server(slog.NewLogLogger(logger.Handler(), slog.LevelWarn))
	// Shutdown runs this once the listener is closed: the sessions' GET
	// streams never end on their own, and Shutdown would wait for them.
	// Ending them earlier would turn away requests that still arrive on
	// those sessions during the drain delay.
	srv.RegisterOnShutdown(func() {
		sctx, cancel := context.WithTimeout(context.Background(), hs.shutdownGrace)
		defer cancel()
		_ = handler.Shutdown(sctx)
	})
	served := make(chan error, 1)
	go func() {
		if hs.tlsCert != "" {
			served <- srv.ServeTLS(hs.listener, hs.tlsCert, hs.tlsKey)
			return
		}
		served <- srv.Serve(hs.listener)
	}()
	logger.Info("serving MCP over streamable HTTP", "url", hs.url, "addr", hs.listener.Addr().String(), "allowed_hosts", hs.opts.AllowedHosts)
	if listening != nil {
		listening(hs.url)
	}
	select {
	case err = <-served:
		// Serving failed: nothing is left to drain.
		stop()
		_ = handler.Shutdown(context.Background())
		return err
	case <-ctx.Done():
	}
	handler.Drain()
	logger.Info("shutting down: not ready, still serving until the endpoints drop this replica", "drain_delay", hs.drainDelay)
	if hs.drainDelay > 0 {
		select {
		case <-time.After(hs.drainDelay):
		case err = <-served:
			return err
		}
	}
	start := time.Now()
	logger.Info("no longer accepting connections; waiting for the calls in flight", "shutdown_grace", hs.shutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), hs.shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("calls still in flight at the end of --shutdown-grace: closing their connections", "shutdown_grace", hs.shutdownGrace, "error", err)
		_ = srv.Close()
	} else {
		logger.Info("calls in flight finished", "after", time.Since(start).Round(time.Millisecond))
	}
	if err = <-served; errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
