package mcpmain

// The command line: flag types, the options they fill, and the flag set.

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/docker/go-units"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/kubebackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
)

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
	o.maxBody = sizeFlag(transport.DefaultMaxBodyBytes)
	fs.Var(&o.maxBody, "max-body-bytes", "largest HTTP request body: a write_file call may be this long")
	o.maxMessage = sizeFlag(transport.DefaultMaxMessageBytes)
	fs.Var(&o.maxMessage, "max-message-bytes", "largest HTTP request body of any message but a write_file call (at most --max-body-bytes); read from the message as it arrives, and refused with 413 before it is decoded")
	fs.IntVar(&o.maxToolCalls, "max-tool-calls-per-identity", transport.DefaultMaxToolCallsPerIdentity, "tool calls one identity may have in flight over HTTP (429 beyond, before the call is decoded); 0 disables")
	fs.Float64Var(&o.rateLimit, "rate-limit", 100, "HTTP requests per second per identity, with bursts of twice that (429 beyond); 0 disables")
	fs.IntVar(&o.maxPerPeer, "max-requests-per-peer", transport.DefaultMaxRequestsPerPeer, "HTTP requests one remote address (IPv4, or IPv6 /64) may have in flight at once, GET streams included (429 beyond); 0 disables. Behind a reverse proxy every client shares the proxy's address")
	fs.IntVar(&o.authFailures, "auth-failures-per-minute", transport.DefaultAuthFailuresPerMinute, "failed HTTP authentications one remote address may cause per minute (a bucket of that size); beyond it the address gets 429 before its token is checked (no TokenReview); 0 disables")
	fs.IntVar(&o.maxSessions, "max-sessions-per-identity", transport.DefaultMaxSessionsPerIdentity, "open MCP sessions one identity may have over HTTP (an initialize beyond it gets 429); 0 disables")
	fs.DurationVar(&o.readHeaderTO, "http-read-header-timeout", transport.DefaultReadHeaderTimeout, "how long a client may take to send an HTTP request's headers")
	fs.DurationVar(&o.readTO, "http-read-timeout", transport.DefaultReadTimeout, "how long a client may take to send a whole HTTP request, body included (responses, such as SSE streams, are not limited)")
	fs.DurationVar(&o.idleTO, "http-idle-timeout", transport.DefaultIdleTimeout, "how long an idle keep-alive HTTP connection is kept open")

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
