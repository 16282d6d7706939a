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
	if o.Auth != "kubernetes" {
		if o.AcceptAPIServerAudience || len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0 {
			return nil, usagef("--accept-apiserver-audience, --allow-user and --allow-group need --auth kubernetes")
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
	default:
		return nil, usagef("--auth %q: want token, kubernetes or none", o.Auth)
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
			AuthorizationServers:    o.AuthorizationServers,
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
	if o.Backend != "docker" && (len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0) {
		return nil, usagef("--allow-user and --allow-group are for --backend docker; on the kubernetes backend RBAC in the Sandboxes' namespace decides every call")
	}
	var (
		gate auth.CallerAuthorizer
		rc   *rest.Config
		err  error
	)
	if o.Backend == "docker" {
		switch {
		case len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0:
			if o.Namespace != "" {
				return nil, usagef("--namespace has no effect with --allow-user/--allow-group on the docker backend: give one or the other")
			}
			gate = auth.AllowList{Users: o.AllowUsers, Groups: o.AllowGroups}
		case o.Namespace == "":
			return nil, usagef("--backend docker with --auth kubernetes must authorize callers: give --namespace NS (callers who may create sandboxes.%s there are admitted) or --allow-user/--allow-group", sandboxv1alpha1.GroupVersion.Group)
		default:
			if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
				return nil, usagef("--namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
			}
		}
	}
	if kube != nil {
		rc = kube.config
	} else {
		if rc, err = auth.KubeRESTConfig(o.Kubeconfig); err != nil {
			return nil, usageError{err}
		}
		// A review per identity every few seconds, and more at bursts.
		if rc.QPS == 0 {
			rc.QPS, rc.Burst = 50, 100
		}
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
	if o.Backend != "docker" {
		return reviews, nil
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
	return auth.WithAuthorization(reviews, gate), nil
}

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
