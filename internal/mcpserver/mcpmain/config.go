package mcpmain

// Config: what the command line decides, and its defaults.

import (
	"fmt"
	"strconv"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/kubebackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
)

// Config is the server's configuration: cmd/code-sandbox-mcp defines a flag
// for each field (named in the comments and in the errors Run reports) and
// fills it; Serve and Run take it. Start from DefaultConfig: a zero field is
// not always its default.
type Config struct {
	// Backend is where sandboxes run: "docker" or "kubernetes" (--backend).
	Backend string
	// Namespace, NamespaceFromServiceAccount, Kubeconfig, NodeName and
	// ReadyTimeout configure the kubernetes backend and --auth kubernetes.
	Namespace                   string
	NamespaceFromServiceAccount bool
	Kubeconfig                  string
	NodeName                    string
	ReadyTimeout                time.Duration
	// DockerHost is the Docker endpoint (default: the one the Docker CLI
	// would use, dockerruntime.FindEndpoint).
	DockerHost string

	// HTTPAddr serves streamable HTTP on this address instead of stdio.
	HTTPAddr string
	// PreviewAddr serves expose_port's preview URLs on this address
	// (their own origin); PreviewURL is their external base URL (default
	// http://PreviewAddr).
	PreviewAddr             string
	PreviewURL              string
	AllowRemote             bool
	Auth                    string // token, kubernetes, oidc or none
	TokenFile               string
	TokenAudiences          []string
	AcceptAPIServerAudience bool
	AllowUsers              []string
	AllowGroups             []string
	AuthorizationServers    []string
	// ScopesSupported are advertised in the protected resource metadata
	// and in every 401's challenge (--scope).
	ScopesSupported []string
	// PublicURL is the resource URL: the MCP endpoint's public URL, and
	// under --auth oidc the audience every token must name (--public-url).
	PublicURL string
	// OIDC configures --auth oidc (the --oidc-* flags); see
	// auth.OIDCOptions.
	OIDC                    OIDCConfig
	AllowedHosts            []string
	AllowedOrigins          []string
	TLSCert                 string
	TLSKey                  string
	MaxBodyBytes            int64
	RateLimit               float64
	MaxRequestsPerPeer      int
	AuthFailuresPerMinute   int
	MaxSessionsPerIdentity  int
	MaxMessageBytes         int64
	MaxToolCallsPerIdentity int
	OwnerKeyFile            string
	HTTPReadHeaderTimeout   time.Duration
	HTTPReadTimeout         time.Duration
	HTTPIdleTimeout         time.Duration
	// DrainDelay is how long a stopping HTTP server stays not ready but
	// still serving, before it stops accepting connections, so that the
	// Service's endpoints drop it first. ShutdownGrace then bounds how
	// long calls in flight may take to finish (zero: MaxCommandTimeout
	// plus DefaultShutdownMargin).
	DrainDelay    time.Duration
	ShutdownGrace time.Duration

	DefaultImage  string
	AllowedImages []string
	PullPolicy    string
	// AllowedRegistries and AllowPublicRegistries: the Docker backend's
	// image registry policy (internal/imagepolicy).
	AllowedRegistries     []string
	AllowPublicRegistries bool
	Runtime               string
	AllowEgress           bool
	EgressAllowCIDRs      []string
	HostDirs              []string

	CommandTimeout    time.Duration
	MaxCommandTimeout time.Duration
	OutputLimit       int64
	ExecOutputBudget  int64
	MaxSandboxes      int
	IdleTimeout       time.Duration
	IdlePause         time.Duration
	MaxLifetime       time.Duration
	MaxCPU            float64
	MaxMemoryBytes    int64
	MaxReadBytes      int64
	MaxFileBytes      int64
	MaxUploadBytes    int64
	MaxUploadEntries  int
	HistoryDir        string
	// SnapshotDir configures the Docker backend's snapshots
	// (dockerbackend.Options); MaxSnapshots bounds one identity's
	// snapshots on both backends.
	SnapshotDir  string
	MaxSnapshots int
	// SnapshotRegistry (HOST[:PORT]/PATH), when set, keeps the Docker
	// backend's snapshot tars in that OCI registry (snapshotstore.Registry)
	// instead of SnapshotDir.
	SnapshotRegistry string
	// WarmPool is the docker backend's warm pool size (a whole number;
	// empty: dockerbackend.DefaultWarmPool), or the name of the kubernetes
	// backend's SandboxWarmPool (empty: none). Which one it must be is
	// known only with Backend, so it stays text.
	WarmPool string

	LogLevel  string // debug, info, warn or error
	LogFormat string // text or json
}

// OIDCConfig is --auth oidc's part of Config.
type OIDCConfig struct {
	IssuerURL      string // --oidc-issuer-url
	CAFile         string // --oidc-ca-file
	UsernameClaim  string // --oidc-username-claim
	UsernamePrefix string // --oidc-username-prefix
	GroupsClaim    string // --oidc-groups-claim
	GroupsPrefix   string // --oidc-groups-prefix
	NamespaceClaim string // --oidc-namespace-claim
	// Namespaces maps values of NamespaceClaim to namespaces
	// (--oidc-namespace VALUE=NAMESPACE, repeatable).
	Namespaces map[string]string
}

// DefaultConfig is the configuration of a command line without flags.
func DefaultConfig() Config {
	return Config{
		Backend:                 "docker",
		ReadyTimeout:            kubebackend.DefaultReadyTimeout,
		Auth:                    "token",
		TokenAudiences:          []string{auth.DefaultTokenAudience},
		OIDC:                    OIDCConfig{UsernameClaim: auth.DefaultOIDCUsernameClaim, UsernamePrefix: auth.DefaultOIDCPrefix, GroupsPrefix: auth.DefaultOIDCPrefix},
		MaxBodyBytes:            transport.DefaultMaxBodyBytes,
		MaxMessageBytes:         transport.DefaultMaxMessageBytes,
		MaxToolCallsPerIdentity: transport.DefaultMaxToolCallsPerIdentity,
		RateLimit:               DefaultRateLimit,
		MaxRequestsPerPeer:      transport.DefaultMaxRequestsPerPeer,
		AuthFailuresPerMinute:   transport.DefaultAuthFailuresPerMinute,
		MaxSessionsPerIdentity:  transport.DefaultMaxSessionsPerIdentity,
		HTTPReadHeaderTimeout:   transport.DefaultReadHeaderTimeout,
		HTTPReadTimeout:         transport.DefaultReadTimeout,
		HTTPIdleTimeout:         transport.DefaultIdleTimeout,

		DefaultImage:          contract.DefaultImage,
		PullPolicy:            string(dockerruntime.PullIfNotPresent),
		AllowPublicRegistries: true,
		Runtime:               dockerruntime.RuntimeRunc,

		CommandTimeout:    mcpserver.DefaultCommandTimeout,
		MaxCommandTimeout: mcpserver.DefaultMaxTimeout,
		OutputLimit:       mcpserver.DefaultOutputLimit,
		ExecOutputBudget:  mcpserver.DefaultExecOutputBudget,
		MaxSandboxes:      dockerbackend.DefaultMaxSandboxes,
		MaxSnapshots:      dockerbackend.DefaultMaxSnapshots,
		IdleTimeout:       dockerbackend.DefaultIdleTimeout,
		MaxLifetime:       mcpserver.DefaultMaxLifetime,
		MaxCPU:            mcpserver.DefaultMaxCPU,
		MaxMemoryBytes:    mcpserver.DefaultMaxMemoryBytes,
		MaxReadBytes:      mcpserver.DefaultMaxReadBytes,
		MaxFileBytes:      mcpserver.DefaultMaxFileBytes,
		MaxUploadBytes:    mcpserver.DefaultMaxUploadBytes,
		MaxUploadEntries:  mcpserver.DefaultMaxUploadEntries,

		LogLevel:  "info",
		LogFormat: "text",
	}
}

// DefaultShutdownMargin is what the default shutdown grace allows a call
// beyond its longest command (--max-command-timeout): resuming a paused
// sandbox, starting the exec, returning the output.
const DefaultShutdownMargin = 30 * time.Second

// shutdownGrace is how long calls in flight may take to finish once the
// server stops accepting connections.
func (o Config) shutdownGrace() time.Duration {
	if o.ShutdownGrace > 0 {
		return o.ShutdownGrace
	}
	return o.MaxCommandTimeout + DefaultShutdownMargin
}

// DefaultRateLimit is the default of Config.RateLimit: HTTP requests per
// second per identity.
const DefaultRateLimit = 100

// dockerWarmPool is the docker backend's pool size.
func (o Config) dockerWarmPool() (int, error) {
	if o.WarmPool == "" {
		return dockerbackend.DefaultWarmPool, nil
	}
	n, err := strconv.Atoi(o.WarmPool)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number (the docker backend's --warm-pool is a count of paused sandboxes)", o.WarmPool)
	}
	return n, nil
}
