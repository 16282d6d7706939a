// Command code-sandbox-mcp is a Model Context Protocol server that gives AI
// agents disposable, hardened code sandboxes. It is a drop-in replacement
// for the code-sandbox-mcp tools (sandbox_initialize, copy_project,
// write_file, sandbox_exec, copy_file, sandbox_stop and the
// containers://{id}/logs resource) with more of them, and a security model:
// see docs/mcp.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"

	"github.com/docker/go-units"
	"github.com/mark3labs/mcp-go/server"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/accessreview"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/kubebackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
)

// exitUsage is the exit code for bad flags or an unusable configuration.
const exitUsage = 2

// listFlag is a repeatable flag; each use may also carry a comma list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// defaultListFlag is a repeatable flag with a default list that the first
// use replaces rather than extends.
type defaultListFlag struct {
	vals []string
	set  bool
}

func (l *defaultListFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.vals, ",")
}

func (l *defaultListFlag) Set(v string) error {
	if !l.set {
		l.vals, l.set = nil, true
	}
	return (*listFlag)(&l.vals).Set(v)
}

// warmPoolFlag is --warm-pool: a member count on the docker backend, a
// SandboxWarmPool name on the kubernetes backend. Which one it must be is
// known only once every flag is parsed, so it keeps the text.
type warmPoolFlag struct {
	raw string
	set bool
}

func (w *warmPoolFlag) String() string {
	if w == nil {
		return ""
	}
	return w.raw
}

func (w *warmPoolFlag) Set(v string) error {
	w.raw, w.set = strings.TrimSpace(v), true
	return nil
}

// count is the docker backend's pool size.
func (w warmPoolFlag) count() (int, error) {
	if !w.set {
		return dockerbackend.DefaultWarmPool, nil
	}
	n, err := strconv.Atoi(w.raw)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number (the docker backend's --warm-pool is a count of paused sandboxes)", w.raw)
	}
	return n, nil
}

// sizeFlag is a byte count written as "1MiB", "512k" or a plain number.
type sizeFlag int64

func (s *sizeFlag) String() string { return units.BytesSize(float64(*s)) }

func (s *sizeFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		*s = sizeFlag(n)
		return nil
	}
	n, err := units.RAMInBytes(strings.TrimSuffix(strings.TrimSuffix(v, "B"), "i"))
	if err != nil {
		return fmt.Errorf("%q is not a size such as 1MiB or 512k", v)
	}
	*s = sizeFlag(n)
	return nil
}

type options struct {
	backend      string
	namespace    string
	nsFromSA     bool
	kubeconfig   string
	nodeName     string
	readyTimeout time.Duration
	dockerHost   string

	httpAddr       string
	allowRemote    bool
	auth           string
	tokenFile      string
	tokenAudiences defaultListFlag
	acceptAPIAud   bool
	allowUsers     listFlag
	allowGroups    listFlag
	authServers    listFlag
	publicURL      string
	allowedHosts   listFlag
	allowedOrigins listFlag
	tlsCert        string
	tlsKey         string
	maxBody        sizeFlag
	rateLimit      float64
	maxPerPeer     int
	authFailures   int
	maxSessions    int
	maxMessage     sizeFlag
	maxToolCalls   int
	ownerKeyFile   string
	readHeaderTO   time.Duration
	readTO         time.Duration
	idleTO         time.Duration

	defaultImage  string
	allowedImages listFlag
	pullPolicy    string
	// allowedRegistries and allowPublicRegs: the Docker backend's image
	// registry policy (internal/imagepolicy).
	allowedRegistries listFlag
	allowPublicRegs   bool
	runtime           string
	allowEgress       bool
	egressAllow       listFlag
	hostDirs          listFlag

	commandTimeout time.Duration
	maxTimeout     time.Duration
	outputLimit    sizeFlag
	execBudget     sizeFlag
	maxSandboxes   int
	idleTimeout    time.Duration
	idlePause      time.Duration
	maxLifetime    time.Duration
	maxCPU         float64
	maxMemory      sizeFlag
	maxRead        sizeFlag
	maxFile        sizeFlag
	maxUpload      sizeFlag
	maxEntries     int
	historyDir     string
	// warmPool: the docker backend's warm pool size, or the kubernetes
	// backend's SandboxWarmPool.
	warmPool warmPoolFlag

	logLevel    string
	logFormat   string
	showVersion bool
}

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("code-sandbox-mcp", flag.ContinueOnError)
	fs.StringVar(&o.backend, "backend", "docker", "where sandboxes run: docker (the local Docker Engine) or kubernetes")
	fs.BoolVar(&o.nsFromSA, "namespace-from-serviceaccount", false, "kubernetes backend: put the Sandboxes of a caller that authenticates as a ServiceAccount in that ServiceAccount's namespace (others use --namespace), so one server serves many teams under their own RBAC and SandboxQuotas")
	fs.StringVar(&o.namespace, "namespace", "", "kubernetes backend: namespace for Sandbox resources (default: the kubeconfig context's, in a cluster the pod's, else \"default\"); docker backend with --auth kubernetes and no --allow-user/--allow-group: only callers who may create sandboxes (sandbox.code-sandbox.dev) in this namespace are admitted (required then)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the kubernetes backend and --auth kubernetes (default: in-cluster; the kubernetes backend also tries $KUBECONFIG and ~/.kube/config)")
	fs.StringVar(&o.nodeName, "node-name", "", "kubernetes backend: pin Sandboxes to this node (spec.nodeName; default: any manager with capacity)")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", kubebackend.DefaultReadyTimeout, "kubernetes backend: how long sandbox_initialize waits for a Sandbox to become Ready")
	fs.StringVar(&o.dockerHost, "docker-host", "", "Docker endpoint (default: DOCKER_HOST or the local socket)")

	fs.StringVar(&o.httpAddr, "http", "", "serve streamable HTTP on this address (for example 127.0.0.1:8080) instead of stdio")
	fs.BoolVar(&o.allowRemote, "allow-remote", false, "allow --http to bind a non-loopback address (requires --auth token or kubernetes)")
	fs.StringVar(&o.auth, "auth", "token", "HTTP authentication: token (--token-file), kubernetes (TokenReview) or none (loopback only)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file of \"TOKEN IDENTITY\" lines for --auth token; re-read when it changes")
	o.tokenAudiences = defaultListFlag{vals: []string{auth.DefaultTokenAudience}}
	fs.Var(&o.tokenAudiences, "token-audience", "--auth kubernetes: the server's own audiences; a token must be valid for one of them (repeatable; callers get one with `kubectl create token SA --audience "+auth.DefaultTokenAudience+"`)")
	fs.BoolVar(&o.acceptAPIAud, "accept-apiserver-audience", false, "--auth kubernetes: also accept tokens for the API server's own audiences (tried after --token-audience fails). WEAKER: such a token can be replayed against the API server, and any token a caller hands to another service for the API server becomes a credential for this one")
	fs.Var(&o.allowUsers, "allow-user", "--backend docker with --auth kubernetes: admit this Kubernetes user, for example system:serviceaccount:NS:NAME (repeatable; with --allow-group replaces the RBAC check on --namespace)")
	fs.Var(&o.allowGroups, "allow-group", "--backend docker with --auth kubernetes: admit members of this Kubernetes group, for example system:serviceaccounts:NS (repeatable; with --allow-user replaces the RBAC check on --namespace)")
	fs.Var(&o.authServers, "authorization-server", "OAuth authorization server issuer to advertise in the protected resource metadata (repeatable)")
	fs.StringVar(&o.publicURL, "public-url", "", "the MCP endpoint's public URL (default http://ADDR/mcp)")
	fs.Var(&o.allowedHosts, "allowed-hosts", "Host header values accepted (default: localhost, 127.0.0.1 and [::1] with the listening port, and the public URL's host)")
	fs.Var(&o.allowedOrigins, "allowed-origins", "browser Origins accepted besides the request's own loopback origin (http://localhost:PORT and the like); requests without Origin are always accepted")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this certificate")
	fs.StringVar(&o.tlsKey, "tls-key", "", "key for --tls-cert")
	o.maxBody = sizeFlag(mcpserver.DefaultMaxBodyBytes)
	fs.Var(&o.maxBody, "max-body-bytes", "largest HTTP request body: a write_file call may be this long")
	o.maxMessage = sizeFlag(mcpserver.DefaultMaxMessageBytes)
	fs.Var(&o.maxMessage, "max-message-bytes", "largest HTTP request body of any message but a write_file call (at most --max-body-bytes); read from the message as it arrives, and refused with 413 before it is decoded")
	fs.IntVar(&o.maxToolCalls, "max-tool-calls-per-identity", mcpserver.DefaultMaxToolCallsPerIdentity, "tool calls one identity may have in flight over HTTP (429 beyond, before the call is decoded); 0 disables")
	fs.Float64Var(&o.rateLimit, "rate-limit", 100, "HTTP requests per second per identity, with bursts of twice that (429 beyond); 0 disables")
	fs.IntVar(&o.maxPerPeer, "max-requests-per-peer", mcpserver.DefaultMaxRequestsPerPeer, "HTTP requests one remote address (IPv4, or IPv6 /64) may have in flight at once, GET streams included (429 beyond); 0 disables. Behind a reverse proxy every client shares the proxy's address")
	fs.IntVar(&o.authFailures, "auth-failures-per-minute", mcpserver.DefaultAuthFailuresPerMinute, "failed HTTP authentications one remote address may cause per minute (a bucket of that size); beyond it the address gets 429 before its token is checked (no TokenReview); 0 disables")
	fs.IntVar(&o.maxSessions, "max-sessions-per-identity", mcpserver.DefaultMaxSessionsPerIdentity, "open MCP sessions one identity may have over HTTP (an initialize beyond it gets 429); 0 disables")
	fs.DurationVar(&o.readHeaderTO, "http-read-header-timeout", mcpserver.DefaultReadHeaderTimeout, "how long a client may take to send an HTTP request's headers")
	fs.DurationVar(&o.readTO, "http-read-timeout", mcpserver.DefaultReadTimeout, "how long a client may take to send a whole HTTP request, body included (responses, such as SSE streams, are not limited)")
	fs.DurationVar(&o.idleTO, "http-idle-timeout", mcpserver.DefaultIdleTimeout, "how long an idle keep-alive HTTP connection is kept open")

	fs.StringVar(&o.defaultImage, "default-image", contract.DefaultImage, "image sandbox_initialize uses when none is given")
	fs.Var(&o.allowedImages, "allowed-image", "image pattern (path.Match) sandboxes may use, for example python:* (repeatable; default: any)")
	fs.StringVar(&o.pullPolicy, "pull-policy", string(dockerruntime.PullIfNotPresent), "image pull policy: IfNotPresent, Never or Always")
	fs.Var(&o.allowedRegistries, "allowed-registries", "docker backend: image registry sandboxes may use besides public ones: host (any port), host:port or CIDR (repeatable; default: none, so loopback, private, link-local and single-label registry hosts and localhost are refused)")
	fs.BoolVar(&o.allowPublicRegs, "allow-public-registries", true, "docker backend: allow any public registry host (and images without one, which are Docker Hub's); false makes --allowed-registries a strict allow-list")
	fs.StringVar(&o.runtime, "runtime", dockerruntime.RuntimeRunc, "OCI runtime: runc or runsc (gVisor)")
	fs.BoolVar(&o.allowEgress, "allow-egress", false, "let sandbox_initialize ask for network \"egress\"")
	fs.Var(&o.egressAllow, "egress-allow-cidr", "with --allow-egress and the docker backend: IPv4 CIDR egress sandboxes may reach although private or link-local (repeatable; default: none). The docker backend installs the egress iptables rules (needs root) unless a node manager owns them")
	fs.Var(&o.hostDirs, "allow-host-dir", "host directory copy_project, copy_file and copy_file_from_sandbox may use (repeatable; default: none). Over HTTP each identity gets its own subdirectory of it")
	fs.StringVar(&o.ownerKeyFile, "owner-key-file", "", "file holding the secret key (at least 16 bytes, e.g. openssl rand -hex 32) of the identity hashes that label sandboxes (sandbox.code-sandbox.dev/mcp-owner) and name per-identity host directories; share it between instances and keep it across restarts. Missing: a random key for this process")

	fs.DurationVar(&o.commandTimeout, "command-timeout", mcpserver.DefaultCommandTimeout, "default timeout of one command")
	fs.DurationVar(&o.maxTimeout, "max-command-timeout", mcpserver.DefaultMaxTimeout, "largest timeout_seconds a call may ask for")
	o.outputLimit = sizeFlag(mcpserver.DefaultOutputLimit)
	fs.Var(&o.outputLimit, "output-limit", "cap on each of stdout and stderr per command")
	o.execBudget = sizeFlag(mcpserver.DefaultExecOutputBudget)
	fs.Var(&o.execBudget, "exec-output-budget", "cap on the output one sandbox_exec call keeps and returns, across all its commands and both streams (each command keeps the end of its output within its share)")
	fs.IntVar(&o.maxSandboxes, "max-sandboxes", dockerbackend.DefaultMaxSandboxes, "sandboxes one identity may have at once")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", dockerbackend.DefaultIdleTimeout, "remove a sandbox unused for this long")
	fs.DurationVar(&o.idlePause, "idle-pause", 0, "pause a sandbox unused for this long (no CPU, memory kept) until its next exec or file transfer resumes it; 0 turns it off; shorter than --idle-timeout")
	fs.DurationVar(&o.maxLifetime, "max-lifetime", mcpserver.DefaultMaxLifetime, "longest a sandbox may live (and the default lifetime)")
	fs.Float64Var(&o.maxCPU, "max-cpu", mcpserver.DefaultMaxCPU, "most CPUs a sandbox may ask for")
	o.maxMemory = sizeFlag(mcpserver.DefaultMaxMemoryBytes)
	fs.Var(&o.maxMemory, "max-memory", "most memory a sandbox may ask for")
	o.maxRead = sizeFlag(mcpserver.DefaultMaxReadBytes)
	fs.Var(&o.maxRead, "max-read-bytes", "largest file read_file returns")
	o.maxFile = sizeFlag(mcpserver.DefaultMaxFileBytes)
	fs.Var(&o.maxFile, "max-file-bytes", "largest file copy_file and copy_file_from_sandbox move")
	o.maxUpload = sizeFlag(mcpserver.DefaultMaxUploadBytes)
	fs.Var(&o.maxUpload, "max-upload-bytes", "largest total copy_project sends")
	fs.IntVar(&o.maxEntries, "max-upload-entries", mcpserver.DefaultMaxUploadEntries, "most files and directories copy_project sends")
	fs.StringVar(&o.historyDir, "history-dir", "", "keep exec history in files here (default: in memory)")
	fs.Var(&o.warmPool, "warm-pool", fmt.Sprintf("docker backend: keep this many paused sandboxes of the default settings (--default-image, default CPU and memory, no network) ready, so that such a sandbox_initialize returns at once; 0 turns it off (default %d, at most %d). kubernetes backend: the name of a SandboxWarmPool in the Sandboxes' namespace that a sandbox_initialize with the default settings claims from (default: none)", dockerbackend.DefaultWarmPool, dockerbackend.MaxWarmPool))

	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	return fs
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	// Whatever happens below, stdout is the protocol's alone.
	log.SetOutput(os.Stderr)
	if len(args) > 0 && (args[0] == "config" || args[0] == "print-config") {
		return printConfig(args[1:], os.Stdout)
	}
	var o options
	fs := newFlagSet(&o)
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %q (subcommands: config)\n", fs.Args())
		return exitUsage
	}
	if o.showVersion {
		fmt.Fprintln(os.Stdout, "code-sandbox-mcp", version.Version)
		return 0
	}
	logger, err := newLogger(o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitUsage
	}
	slog.SetDefault(logger)
	if err := serve(o, logger); err != nil {
		logger.Error("code-sandbox-mcp failed", "error", err)
		var ue usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return 1
	}
	return 0
}

// usageError is a configuration the server refuses to start with.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	hopts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, hopts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, hopts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func serve(o options, logger *slog.Logger) error {
	return serveWith(o, logger, func() (context.Context, context.CancelFunc) {
		return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	}, nil)
}

// serveWith is serve with the run's context made by newCtx (once the
// backend exists) and, over HTTP, listening called with the endpoint's URL
// once the server accepts connections. Tests drive the real wiring
// through it.
func serveWith(o options, logger *slog.Logger, newCtx func() (context.Context, context.CancelFunc), listening func(url string)) error {
	if o.httpAddr == "" && (o.acceptAPIAud || len(o.allowUsers) > 0 || len(o.allowGroups) > 0) {
		return usagef("--accept-apiserver-audience, --allow-user and --allow-group are for --http with --auth kubernetes")
	}
	cfg, err := toolConfig(o)
	if err != nil {
		return err
	}
	if o.httpAddr != "" {
		// Several identities share an HTTP endpoint: each gets its own
		// subdirectory of every --allow-host-dir.
		cfg.HostRoots.SeparateIdentities()
	}
	if err := loadOwnerKey(o, logger); err != nil {
		return err
	}
	var stdout *os.File
	if o.httpAddr == "" {
		// Claimed before anything else runs, so no later output can reach
		// the protocol stream by accident.
		if stdout, err = claimStdout(); err != nil {
			return err
		}
	}
	if o.idlePause < 0 || (o.idlePause > 0 && o.idlePause >= o.idleTimeout) {
		return usagef("--idle-pause %s: want 0 (off) or a duration shorter than --idle-timeout (%s)", o.idlePause, o.idleTimeout)
	}
	var kube *kubeSetup
	switch o.backend {
	case "docker":
		if o.nsFromSA {
			return usagef("--namespace-from-serviceaccount needs --backend kubernetes")
		}
		n, err := o.warmPool.count()
		if err != nil {
			return usagef("--warm-pool: %v", err)
		}
		if n < 0 || n > dockerbackend.MaxWarmPool {
			return usagef("--warm-pool %d: want 0 (off) to %d paused sandboxes", n, dockerbackend.MaxWarmPool)
		}
	case "kubernetes":
		if errs := validation.IsDNS1123Subdomain(o.warmPool.raw); o.warmPool.raw != "" && len(errs) > 0 {
			return usagef("--warm-pool %q: the kubernetes backend's --warm-pool names a SandboxWarmPool: %s", o.warmPool.raw, strings.Join(errs, "; "))
		}
		if kube, err = loadKube(o); err != nil {
			return err
		}
	default:
		return usagef("--backend %q: want docker or kubernetes", o.backend)
	}
	var hs *httpSetup
	if o.httpAddr != "" {
		// Listen and check authentication settings before touching the
		// backend, so that a misconfiguration fails fast and leaves nothing
		// behind.
		if hs, err = setupHTTP(o, kube, logger); err != nil {
			return err
		}
		defer hs.listener.Close()
	}

	var backend sandboxBackend
	if kube != nil {
		backend, err = newKubeBackend(o, kube, logger)
	} else {
		backend, err = newDockerBackend(o, logger)
	}
	if err != nil {
		return err
	}
	ctx, stop := newCtx()
	defer stop()
	backend.Start(ctx)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := backend.Close(cctx); err != nil {
			logger.Error("removing this server's sandboxes at exit", "error", err)
		}
	}()
	attrs := []any{"version", version.Version, "backend", o.backend, "instance", backend.InstanceID(),
		"default_image", cfg.DefaultImage, "egress", cfg.AllowEgress, "host_dirs", cfg.HostRoots.Roots()}
	if kube != nil {
		attrs = append(attrs, "namespace", kube.namespace)
	}
	logger.Info("code-sandbox-mcp starting", attrs...)

	mcpSrv, err := mcpserver.New(cfg, backend, logger)
	if err != nil {
		return usageError{err}
	}
	if hs == nil {
		err := mcpserver.ServeStdio(ctx, mcpSrv, os.Stdin, stdout, logger)
		stop()
		logger.Info("stdio session ended; removing sandboxes")
		return err
	}
	return hs.run(ctx, stop, mcpSrv, backend, logger, listening)
}

// loadOwnerKey keys the identity hashes that label sandboxes and name the
// identities' host directories with --owner-key-file, or with a key of
// this process's own when the file is missing.
func loadOwnerKey(o options, logger *slog.Logger) error {
	generated := true
	if o.ownerKeyFile != "" {
		var err error
		if generated, err = contract.LoadIdentityKey(o.ownerKeyFile); err != nil {
			return usageError{err}
		}
	}
	if generated && (o.backend == "kubernetes" || (o.httpAddr != "" && len(o.hostDirs) > 0)) {
		logger.Warn("no owner key (--owner-key-file): using a random key of this process, so after a restart it no longer recognizes the Sandboxes and per-identity host directories of earlier runs, and other instances never do",
			"owner_key_file", o.ownerKeyFile)
	}
	return nil
}

func toolConfig(o options) (mcpserver.Config, error) {
	roots, err := mcpserver.NewHostRoots(o.hostDirs)
	if err != nil {
		return mcpserver.Config{}, usageError{err}
	}
	cfg := mcpserver.Config{
		Version:          version.Version,
		DefaultImage:     o.defaultImage,
		AllowedImages:    o.allowedImages,
		AllowEgress:      o.allowEgress,
		MaxNanoCPUs:      int64(o.maxCPU * 1e9),
		MaxMemoryBytes:   int64(o.maxMemory),
		MaxLifetime:      o.maxLifetime,
		CommandTimeout:   o.commandTimeout,
		MaxTimeout:       o.maxTimeout,
		OutputLimit:      int64(o.outputLimit),
		ExecOutputBudget: int64(o.execBudget),
		HostRoots:        roots,
		MaxReadBytes:     int64(o.maxRead),
		MaxFileBytes:     int64(o.maxFile),
		MaxUploadBytes:   int64(o.maxUpload),
		MaxUploadEntries: o.maxEntries,
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}

// sandboxBackend is a backend with the lifecycle serve drives.
type sandboxBackend interface {
	contract.Backend
	Start(context.Context)
	InstanceID() string
}

// kubeSetup is the kubernetes backend's cluster access.
type kubeSetup struct {
	config    *rest.Config
	namespace string
}

// loadKube resolves --kubeconfig and --namespace with kubectl's rules:
// --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the in-cluster
// ServiceAccount; the namespace defaults to the context's (in a cluster,
// the pod's), else "default".
func loadKube(o options) (*kubeSetup, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, usagef("--backend kubernetes: no usable kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a cluster: %v", err)
	}
	ns := o.namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, usagef("--backend kubernetes: reading the kubeconfig's namespace: %v (pass --namespace)", err)
		}
	}
	if ns == "" {
		ns = "default"
	}
	// Every tool call costs a few API calls (access reviews, a Get); the
	// client's default of 5 per second would make a busy server queue.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	return &kubeSetup{config: cfg, namespace: ns}, nil
}

func newKubeBackend(o options, kube *kubeSetup, logger *slog.Logger) (*kubebackend.Backend, error) {
	pull := sandboxv1alpha1.ImagePullPolicy(o.pullPolicy)
	switch pull {
	case sandboxv1alpha1.PullIfNotPresent, sandboxv1alpha1.PullNever, sandboxv1alpha1.PullAlways:
	default:
		return nil, usagef("--pull-policy %q: want IfNotPresent, Never or Always", o.pullPolicy)
	}
	var rt sandboxv1alpha1.RuntimeClass
	switch o.runtime {
	case dockerruntime.RuntimeRunc:
		rt = sandboxv1alpha1.RuntimeRunc
	case dockerruntime.RuntimeRunsc:
		rt = sandboxv1alpha1.RuntimeGVisor
	default:
		return nil, usagef("--runtime %q: want runc or runsc", o.runtime)
	}
	if o.readyTimeout < time.Second {
		return nil, usagef("--ready-timeout %s: want at least 1s", o.readyTimeout)
	}
	b, err := kubebackend.New(kubebackend.Options{
		Config:                      kube.config,
		Namespace:                   kube.namespace,
		NodeName:                    o.nodeName,
		NamespaceFromServiceAccount: o.nsFromSA,
		PullPolicy:                  pull,
		Runtime:                     rt,
		MaxSandboxes:                o.maxSandboxes,
		IdleTimeout:                 o.idleTimeout,
		IdlePause:                   o.idlePause,
		ReadyTimeout:                o.readyTimeout,
		WarmPool:                    o.warmPool.raw,
		DefaultImage:                o.defaultImage,
		Logger:                      logger,
	})
	if err != nil {
		return nil, usageError{err}
	}
	return b, nil
}

func newDockerBackend(o options, logger *slog.Logger) (*dockerbackend.Backend, error) {
	switch dockerruntime.PullPolicy(o.pullPolicy) {
	case dockerruntime.PullIfNotPresent, dockerruntime.PullNever, dockerruntime.PullAlways:
	default:
		return nil, usagef("--pull-policy %q: want IfNotPresent, Never or Always", o.pullPolicy)
	}
	if o.runtime != dockerruntime.RuntimeRunc && o.runtime != dockerruntime.RuntimeRunsc {
		return nil, usagef("--runtime %q: want runc or runsc", o.runtime)
	}
	imagePolicy, err := imagepolicy.New(o.allowedRegistries, o.allowPublicRegs)
	if err != nil {
		return nil, usagef("--allowed-registries: %v", err)
	}
	// Egress sandboxes only behind the egress firewall (internal/egress).
	var fw *egress.Firewall
	var egressReady func(context.Context) error
	if o.allowEgress {
		allow, err := egress.ParseCIDRs(o.egressAllow)
		if err != nil {
			return nil, usagef("--egress-allow-cidr: %v", err)
		}
		if fw, err = egress.NewFirewall(egress.Options{AllowCIDRs: allow}); err != nil {
			return nil, err
		}
		egressReady = fw.Healthy
	}
	client, err := dockerruntime.New(dockerruntime.Options{Host: o.dockerHost, ManagedBy: dockerruntime.ManagedByMCP, ImagePolicy: imagePolicy, EgressReady: egressReady})
	if err != nil {
		return nil, err
	}
	inst, err := dockerbackend.CurrentInstance()
	if err != nil {
		return nil, err
	}
	return dockerbackend.New(dockerbackend.Options{
		Client:       client,
		Instance:     inst,
		PullPolicy:   dockerruntime.PullPolicy(o.pullPolicy),
		Runtime:      o.runtime,
		MaxSandboxes: o.maxSandboxes,
		IdleTimeout:  o.idleTimeout,
		IdlePause:    o.idlePause,
		HistoryDir:   o.historyDir,
		Logger:       logger,
		WarmPool:     warmPoolCount(o.warmPool),
		DefaultImage: o.defaultImage,

		EgressFirewall: fw,
	})
}

// warmPoolCount is the docker backend's pool size, already validated.
func warmPoolCount(w warmPoolFlag) int {
	n, _ := w.count()
	return n
}

type httpSetup struct {
	listener net.Listener
	url      string
	opts     mcpserver.HTTPOptions
	tlsCert  string
	tlsKey   string
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
func setupHTTP(o options, kube *kubeSetup, logger *slog.Logger) (*httpSetup, error) {
	host, _, err := net.SplitHostPort(o.httpAddr)
	if err != nil {
		return nil, usagef("--http %q: want HOST:PORT, for example 127.0.0.1:8080: %v", o.httpAddr, err)
	}
	loopback := isLoopbackHost(host)
	if !loopback && !o.allowRemote {
		return nil, usagef("--http %q is not a loopback address; bind 127.0.0.1, or pass --allow-remote (with --auth token or kubernetes, preferably behind TLS)", o.httpAddr)
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, usagef("--tls-cert and --tls-key go together")
	}
	if o.maxPerPeer < 0 || o.authFailures < 0 || o.maxSessions < 0 || o.maxToolCalls < 0 {
		return nil, usagef("--max-requests-per-peer, --auth-failures-per-minute, --max-sessions-per-identity and --max-tool-calls-per-identity take a count (0 disables), not a negative number")
	}
	if o.readHeaderTO <= 0 || o.readTO <= 0 || o.idleTO <= 0 {
		return nil, usagef("--http-read-header-timeout, --http-read-timeout and --http-idle-timeout must be positive")
	}
	if o.auth != "kubernetes" {
		if o.acceptAPIAud || len(o.allowUsers) > 0 || len(o.allowGroups) > 0 {
			return nil, usagef("--accept-apiserver-audience, --allow-user and --allow-group need --auth kubernetes")
		}
	}
	var authn auth.Authenticator
	switch o.auth {
	case "none":
		if !loopback {
			return nil, usagef("--auth none is only allowed on a loopback address")
		}
		logger.Warn("!!! --auth none: ANY local process or user that can reach " + o.httpAddr + " can run code in sandboxes as the shared identity \"anonymous\". Use --auth token for anything but a single-user machine. !!!")
		authn = auth.AnonymousAuthenticator{}
	case "token":
		if o.tokenFile == "" {
			return nil, usagef("--auth token needs --token-file FILE (lines \"TOKEN IDENTITY\"; tokens of at least %d characters)", auth.MinTokenLength)
		}
		if authn, err = auth.NewStaticTokens(o.tokenFile, logger); err != nil {
			return nil, usageError{err}
		}
	case "kubernetes":
		if authn, err = kubeAuth(o, kube, logger); err != nil {
			return nil, err
		}
	default:
		return nil, usagef("--auth %q: want token, kubernetes or none", o.auth)
	}
	if !loopback && o.tlsCert == "" {
		logger.Warn("serving plain HTTP on a non-loopback address: bearer tokens cross the network in clear text; use --tls-cert/--tls-key or a TLS-terminating proxy")
	}

	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", o.httpAddr, err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	scheme := "http"
	if o.tlsCert != "" {
		scheme = "https"
	}
	urlHost := host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		urlHost = "127.0.0.1"
	}
	resource := o.publicURL
	if resource == "" {
		resource = scheme + "://" + net.JoinHostPort(urlHost, port) + mcpserver.EndpointPath
	}
	pu, err := url.Parse(resource)
	if err != nil || pu.Host == "" {
		ln.Close()
		return nil, usagef("--public-url %q is not an absolute URL", resource)
	}
	hosts := o.allowedHosts
	if len(hosts) == 0 {
		hosts = []string{net.JoinHostPort("localhost", port), net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port), pu.Host}
		if host != "" && !isLoopbackHost(host) {
			hosts = append(hosts, net.JoinHostPort(host, port))
		}
	}
	return &httpSetup{
		listener: ln,
		url:      resource,
		opts: mcpserver.HTTPOptions{
			ResourceURL:             resource,
			AllowedHosts:            hosts,
			AllowedOrigins:          o.allowedOrigins,
			Auth:                    authn,
			AuthorizationServers:    o.authServers,
			MaxBodyBytes:            int64(o.maxBody),
			RequestsPerSecond:       o.rateLimit,
			MaxRequestsPerPeer:      zeroDisables(o.maxPerPeer),
			AuthFailuresPerMinute:   zeroDisables(o.authFailures),
			MaxSessionsPerIdentity:  zeroDisables(o.maxSessions),
			MaxMessageBytes:         int64(o.maxMessage),
			MaxToolCallsPerIdentity: zeroDisables(o.maxToolCalls),
			ReadHeaderTimeout:       o.readHeaderTO,
			ReadTimeout:             o.readTO,
			IdleTimeout:             o.idleTO,
			Logger:                  logger,
		},
		tlsCert: o.tlsCert,
		tlsKey:  o.tlsKey,
	}, nil
}

// zeroDisables maps a limit flag, where 0 disables the limit, to
// mcpserver.HTTPOptions, where 0 means the default and a negative value
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
func kubeAuth(o options, kube *kubeSetup, logger *slog.Logger) (auth.Authenticator, error) {
	if len(o.tokenAudiences.vals) == 0 {
		return nil, usagef("--token-audience: give at least one audience (default %s)", auth.DefaultTokenAudience)
	}
	if o.backend != "docker" && (len(o.allowUsers) > 0 || len(o.allowGroups) > 0) {
		return nil, usagef("--allow-user and --allow-group are for --backend docker; on the kubernetes backend RBAC in the Sandboxes' namespace decides every call")
	}
	var (
		gate auth.CallerAuthorizer
		rc   *rest.Config
		err  error
	)
	if o.backend == "docker" {
		switch {
		case len(o.allowUsers) > 0 || len(o.allowGroups) > 0:
			if o.namespace != "" {
				return nil, usagef("--namespace has no effect with --allow-user/--allow-group on the docker backend: give one or the other")
			}
			gate = auth.AllowList{Users: o.allowUsers, Groups: o.allowGroups}
		case o.namespace == "":
			return nil, usagef("--backend docker with --auth kubernetes must authorize callers: give --namespace NS (callers who may create sandboxes.%s there are admitted) or --allow-user/--allow-group", sandboxv1alpha1.GroupVersion.Group)
		default:
			if errs := validation.IsDNS1123Label(o.namespace); len(errs) > 0 {
				return nil, usagef("--namespace %q: %s", o.namespace, strings.Join(errs, "; "))
			}
		}
	}
	if kube != nil {
		rc = kube.config
	} else {
		if rc, err = auth.KubeRESTConfig(o.kubeconfig); err != nil {
			return nil, usageError{err}
		}
		// A review per identity every few seconds, and more at bursts.
		if rc.QPS == 0 {
			rc.QPS, rc.Burst = 50, 100
		}
	}
	if o.acceptAPIAud {
		logger.Warn("--accept-apiserver-audience: tokens for the API server's own audiences are accepted too; such a token can be replayed against the API server, and any token a caller hands to another service for the API server is a credential here. Prefer tokens for --token-audience (kubectl create token SA --audience " + o.tokenAudiences.vals[0] + ")")
	}
	reviews, err := auth.NewTokenReviewAuth(rc, auth.TokenReviewOptions{
		Audiences:               o.tokenAudiences.vals,
		AcceptAPIServerAudience: o.acceptAPIAud,
		Logger:                  logger,
	})
	if err != nil {
		return nil, err
	}
	if o.backend != "docker" {
		return reviews, nil
	}
	if gate == nil {
		az, err := accessreview.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		gate = accessreview.Gate{Authorizer: az, Namespace: o.namespace, Permission: sandboxCreate}
		logger.Info("docker backend: admitting Kubernetes callers who may create sandboxes in the namespace (SubjectAccessReview)", "namespace", o.namespace)
	} else {
		logger.Info("docker backend: admitting the Kubernetes callers of --allow-user and --allow-group", "users", len(o.allowUsers), "groups", len(o.allowGroups))
	}
	return auth.WithAuthorization(reviews, gate), nil
}

// run serves until ctx ends, then shuts the HTTP server down.
func (hs *httpSetup) run(ctx context.Context, stop context.CancelFunc, s *server.MCPServer, backend contract.Backend, logger *slog.Logger, listening func(url string)) error {
	hs.opts.Ready = backend.Ready
	handler, err := mcpserver.NewHTTPServer(s, hs.opts)
	if err != nil {
		return usageError{err}
	}
	srv := handler.Server(slog.NewLogLogger(logger.Handler(), slog.LevelWarn))
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
		stop()
	case <-ctx.Done():
		logger.Info("shutting down")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = handler.Shutdown(sctx)
	_ = srv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// printConfig prints client configuration snippets: the stdio form with
// this binary's absolute path (and any server flags given after
// "config"), and the HTTP form.
func printConfig(args []string, w io.Writer) int {
	var o options
	fs := newFlagSet(&o)
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot determine the binary's path:", err)
		return 1
	}
	serverArgs := []string{}
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "http" {
			serverArgs = append(serverArgs, "--"+f.Name+"="+f.Value.String())
		}
	})
	endpoint := o.publicURL
	if endpoint == "" {
		addr := o.httpAddr
		if addr == "" {
			addr = "127.0.0.1:8080"
		}
		endpoint = "http://" + addr + mcpserver.EndpointPath
	}
	out := map[string]any{
		"stdio": map[string]any{
			"mcpServers": map[string]any{
				"code-sandbox": map[string]any{"command": exe, "args": serverArgs},
			},
		},
		"http": map[string]any{
			"mcpServers": map[string]any{
				"code-sandbox": map[string]any{
					"type":    "http",
					"url":     endpoint,
					"headers": map[string]string{"Authorization": "Bearer <token from --token-file>"},
				},
			},
		},
	}
	// Explanations go to stderr so that stdout is one JSON document.
	fmt.Fprintln(os.Stderr, `"stdio": for Claude Desktop (claude_desktop_config.json) and other clients that start the server themselves.`)
	fmt.Fprintf(os.Stderr, "\"http\": for clients that speak streamable HTTP; start the server with --http %s --auth token --token-file FILE.\n", strings.TrimSuffix(strings.TrimPrefix(endpoint, "http://"), mcpserver.EndpointPath))
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return 1
	}
	return 0
}
