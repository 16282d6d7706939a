// Command code-sandbox-mcp is a Model Context Protocol server that gives AI
// agents disposable, hardened code sandboxes. It is a drop-in replacement
// for the code-sandbox-mcp tools (sandbox_initialize, copy_project,
// write_file, sandbox_exec, copy_file, sandbox_stop and the
// containers://{id}/logs resource) with more of them, and a security model:
// see docs/mcp.md.
//
// This file is the command line: it defines the flags, fills an
// mcpmain.Config from them (its defaults are mcpmain.DefaultConfig's) and
// hands it to mcpmain, which does the wiring.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/go-units"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/mcpmain"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, mcpmain.Run))
}

// run parses the command line args (without the program name) and calls
// serve with the Config they give, or prints the client configuration
// ("config") or the version; it returns the process's exit code
// (mcpmain.ExitUsage for bad flags or arguments).
func run(args []string, stdout, stderr io.Writer, serve func(mcpmain.Config) int) int {
	// Whatever happens below, stdout is the protocol's alone.
	log.SetOutput(stderr)
	if len(args) > 0 {
		switch args[0] {
		case "config", "print-config":
			return printConfig(args[1:], stdout, stderr)
		case "update":
			return runUpdate(args[1:], stderr)
		case "version":
			return runVersion(args[1:], stdout, stderr)
		}
	}
	cfg, fs, cli, err := parse(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return mcpmain.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %q (subcommands: config, update, version)\n", fs.Args())
		return mcpmain.ExitUsage
	}
	if cli.showVersion {
		return printVersion(cli.updates, stdout, stderr)
	}
	if cli.updates.check {
		// The notice goes to stderr, whatever the transport: in stdio mode
		// stdout is the protocol's alone.
		if err := cli.updates.refusal(); err != nil {
			fmt.Fprintln(stderr, "--check-updates:", err)
			return mcpmain.ExitUsage
		}
		go func() {
			if notice := updateNotice(cli.updates, stderr); notice != "" {
				fmt.Fprintln(stderr, notice)
			}
		}()
	}
	return serve(cfg)
}

// cliFlags are the command line's flags that are not the server's Config.
type cliFlags struct {
	showVersion bool
	updates     updateFlags
}

// parse fills a Config from args, starting from mcpmain.DefaultConfig.
func parse(args []string, stderr io.Writer) (mcpmain.Config, *flag.FlagSet, cliFlags, error) {
	cfg := mcpmain.DefaultConfig()
	var cli cliFlags
	fs := newFlagSet(&cfg, &cli.showVersion)
	cli.updates.register(fs, "update-index-url")
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return cfg, fs, cli, err
	}
	cfg.WarmPool = strings.TrimSpace(cfg.WarmPool)
	return cfg, fs, cli, nil
}

// printConfig prints client configuration snippets: the stdio form with
// this binary's absolute path (and any server flags given after
// "config"), and the HTTP form.
func printConfig(args []string, stdout, stderr io.Writer) int {
	cfg, fs, _, err := parse(args, stderr)
	if err != nil {
		return mcpmain.ExitUsage
	}
	serverArgs := []string{}
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "http" {
			serverArgs = append(serverArgs, "--"+f.Name+"="+f.Value.String())
		}
	})
	return mcpmain.PrintClientConfig(stdout, cfg, serverArgs)
}

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
	vals *[]string
	set  bool
}

func (l *defaultListFlag) String() string {
	if l == nil || l.vals == nil {
		return ""
	}
	return strings.Join(*l.vals, ",")
}

func (l *defaultListFlag) Set(v string) error {
	if !l.set {
		*l.vals, l.set = nil, true
	}
	return (*listFlag)(l.vals).Set(v)
}

// mapFlag is a repeatable KEY=VALUE flag.
type mapFlag map[string]string

func (m *mapFlag) String() string {
	var kv []string
	for k, v := range *m {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

func (m *mapFlag) Set(v string) error {
	k, val, ok := strings.Cut(strings.TrimSpace(v), "=")
	if !ok || k == "" || val == "" {
		return fmt.Errorf("%q: want VALUE=NAMESPACE", v)
	}
	if *m == nil {
		*m = map[string]string{}
	}
	if old, dup := (*m)[k]; dup && old != val {
		return fmt.Errorf("%q is mapped twice (to %s and %s)", k, old, val)
	}
	(*m)[k] = val
	return nil
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

// newFlagSet defines the flags; each one's default is o's value.
func newFlagSet(o *mcpmain.Config, showVersion *bool) *flag.FlagSet {
	fs := flag.NewFlagSet("code-sandbox-mcp", flag.ContinueOnError)
	fs.StringVar(&o.Backend, "backend", o.Backend, "where sandboxes run: docker (the local Docker Engine) or kubernetes")
	fs.BoolVar(&o.NamespaceFromServiceAccount, "namespace-from-serviceaccount", o.NamespaceFromServiceAccount, "kubernetes backend: put the Sandboxes of a caller that authenticates as a ServiceAccount in that ServiceAccount's namespace (others use --namespace), so one server serves many teams under their own RBAC and SandboxQuotas")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "kubernetes backend: namespace for Sandbox resources (default: the kubeconfig context's, in a cluster the pod's, else \"default\"); docker backend with --auth kubernetes and no --allow-user/--allow-group: only callers who may create sandboxes (sandbox.code-sandbox.dev) in this namespace are admitted (required then)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig for the kubernetes backend and --auth kubernetes (default: in-cluster; the kubernetes backend also tries $KUBECONFIG and ~/.kube/config)")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "kubernetes backend: pin Sandboxes to this node (spec.nodeName; default: any manager with capacity)")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "kubernetes backend: how long sandbox_initialize waits for a Sandbox to become Ready")
	fs.StringVar(&o.DockerHost, "docker-host", o.DockerHost, "Docker endpoint (default: as the Docker CLI finds it: DOCKER_HOST, DOCKER_CONTEXT or the current context, else the local socket or, on Windows, named pipe)")

	fs.StringVar(&o.HTTPAddr, "http", o.HTTPAddr, "serve streamable HTTP on this address (for example 127.0.0.1:8080) instead of stdio")
	fs.StringVar(&o.PreviewAddr, "preview-addr", o.PreviewAddr, "serve expose_port's preview URLs on this address (for example 127.0.0.1:8081), a separate origin from --http. Empty: no expose_port")
	fs.StringVar(&o.PreviewURL, "preview-url", o.PreviewURL, "external base URL of --preview-addr put in preview URLs (default http://ADDR)")
	fs.BoolVar(&o.AllowRemote, "allow-remote", o.AllowRemote, "allow --http to bind a non-loopback address (requires --auth token, kubernetes or oidc)")
	fs.StringVar(&o.Auth, "auth", o.Auth, "HTTP authentication: token (--token-file), kubernetes (TokenReview), oidc (JWT access tokens from --oidc-issuer-url) or none (loopback only)")
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "file of \"TOKEN IDENTITY\" lines for --auth token; re-read when it changes")
	audiences := &defaultListFlag{vals: &o.TokenAudiences}
	fs.Var(audiences, "token-audience", "--auth kubernetes: the server's own audiences; a token must be valid for one of them (repeatable; callers get one with `kubectl create token SA --audience "+auth.DefaultTokenAudience+"`)")
	fs.BoolVar(&o.AcceptAPIServerAudience, "accept-apiserver-audience", o.AcceptAPIServerAudience, "--auth kubernetes: also accept tokens for the API server's own audiences (tried after --token-audience fails). WEAKER: such a token can be replayed against the API server, and any token a caller hands to another service for the API server becomes a credential for this one")
	fs.Var((*listFlag)(&o.AllowUsers), "allow-user", "--backend docker with --auth kubernetes: admit this Kubernetes user, for example system:serviceaccount:NS:NAME (repeatable; with --allow-group replaces the RBAC check on --namespace)")
	fs.Var((*listFlag)(&o.AllowGroups), "allow-group", "--backend docker with --auth kubernetes: admit members of this Kubernetes group, for example system:serviceaccounts:NS (repeatable; with --allow-user replaces the RBAC check on --namespace)")
	fs.Var((*listFlag)(&o.AuthorizationServers), "authorization-server", "OAuth authorization server issuer to advertise in the protected resource metadata (repeatable; --auth oidc: default --oidc-issuer-url)")
	fs.Var((*listFlag)(&o.ScopesSupported), "scope", "OAuth scope a client should ask its authorization server for, advertised in the protected resource metadata and in every 401's WWW-Authenticate (repeatable; default: none)")
	fs.StringVar(&o.PublicURL, "public-url", o.PublicURL, "the MCP endpoint's public URL: the OAuth resource identifier, and under --auth oidc the audience every token must name (default http://ADDR/mcp)")
	fs.StringVar(&o.OIDC.IssuerURL, "oidc-issuer-url", o.OIDC.IssuerURL, "--auth oidc: the OpenID Connect issuer (https; must equal its tokens' iss exactly); discovery and keys come from it")
	fs.StringVar(&o.OIDC.CAFile, "oidc-ca-file", o.OIDC.CAFile, "--auth oidc: PEM CAs the issuer's certificate must chain to (default: the system roots)")
	fs.StringVar(&o.OIDC.UsernameClaim, "oidc-username-claim", o.OIDC.UsernameClaim, "--auth oidc: the claim that names the caller")
	fs.StringVar(&o.OIDC.UsernamePrefix, "oidc-username-prefix", o.OIDC.UsernamePrefix, "--auth oidc: prefix of the Kubernetes username the claim maps to (what RBAC and SubjectAccessReviews see); may not start with system:")
	fs.StringVar(&o.OIDC.GroupsClaim, "oidc-groups-claim", o.OIDC.GroupsClaim, "--auth oidc: claim (string or list) whose values, each after --oidc-groups-prefix, are the caller's Kubernetes groups (default: none)")
	fs.StringVar(&o.OIDC.GroupsPrefix, "oidc-groups-prefix", o.OIDC.GroupsPrefix, "--auth oidc: prefix of every group --oidc-groups-claim gives; may not start with system:")
	fs.StringVar(&o.OIDC.NamespaceClaim, "oidc-namespace-claim", o.OIDC.NamespaceClaim, "--auth oidc, kubernetes backend: claim (string or list) whose value --oidc-namespace maps to the namespace of the caller's Sandboxes")
	fs.Var((*mapFlag)(&o.OIDC.Namespaces), "oidc-namespace", "--auth oidc, kubernetes backend: VALUE=NAMESPACE: a caller whose --oidc-namespace-claim has VALUE keeps its Sandboxes in NAMESPACE (repeatable). Only mapped values count; unmapped callers use --namespace; values mapping to several namespaces are refused")
	fs.Var((*listFlag)(&o.AllowedHosts), "allowed-hosts", "Host header values accepted (default: localhost, 127.0.0.1 and [::1] with the listening port, and the public URL's host)")
	fs.Var((*listFlag)(&o.AllowedOrigins), "allowed-origins", "browser Origins accepted besides the request's own loopback origin (http://localhost:PORT and the like); requests without Origin are always accepted")
	fs.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "serve HTTPS with this certificate")
	fs.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "key for --tls-cert")
	fs.Var((*sizeFlag)(&o.MaxBodyBytes), "max-body-bytes", "largest HTTP request body: a write_file call may be this long")
	fs.Var((*sizeFlag)(&o.MaxMessageBytes), "max-message-bytes", "largest HTTP request body of any message but a write_file call (at most --max-body-bytes); read from the message as it arrives, and refused with 413 before it is decoded")
	fs.IntVar(&o.MaxToolCallsPerIdentity, "max-tool-calls-per-identity", o.MaxToolCallsPerIdentity, "tool calls one identity may have in flight over HTTP (429 beyond, before the call is decoded); 0 disables")
	fs.Float64Var(&o.RateLimit, "rate-limit", o.RateLimit, "HTTP requests per second per identity, with bursts of twice that (429 beyond); 0 disables")
	fs.IntVar(&o.MaxRequestsPerPeer, "max-requests-per-peer", o.MaxRequestsPerPeer, "HTTP requests one remote address (IPv4, or IPv6 /64) may have in flight at once, GET streams included (429 beyond); 0 disables. Behind a reverse proxy every client shares the proxy's address")
	fs.IntVar(&o.AuthFailuresPerMinute, "auth-failures-per-minute", o.AuthFailuresPerMinute, "failed HTTP authentications one remote address may cause per minute (a bucket of that size); beyond it the address gets 429 before its token is checked (no TokenReview); 0 disables")
	fs.IntVar(&o.MaxSessionsPerIdentity, "max-sessions-per-identity", o.MaxSessionsPerIdentity, "open MCP sessions one identity may have over HTTP on this replica (an initialize beyond it gets 429); 0 disables")
	fs.DurationVar(&o.HTTPReadHeaderTimeout, "http-read-header-timeout", o.HTTPReadHeaderTimeout, "how long a client may take to send an HTTP request's headers")
	fs.DurationVar(&o.HTTPReadTimeout, "http-read-timeout", o.HTTPReadTimeout, "how long a client may take to send a whole HTTP request, body included (responses, such as SSE streams, are not limited)")
	fs.DurationVar(&o.HTTPIdleTimeout, "http-idle-timeout", o.HTTPIdleTimeout, "how long an idle keep-alive HTTP connection is kept open")
	fs.DurationVar(&o.DrainDelay, "drain-delay", o.DrainDelay, "on SIGTERM over HTTP: how long to keep serving with /readyz failing before no longer accepting connections, so that a Service's endpoints drop this replica first (a few seconds behind a Service; 0 locally)")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace", o.ShutdownGrace, "on SIGTERM over HTTP: how long calls in flight may take to finish after --drain-delay (0: --max-command-timeout plus 30s); keep the pod's terminationGracePeriodSeconds above --drain-delay plus this")

	fs.StringVar(&o.DefaultImage, "default-image", o.DefaultImage, "image sandbox_initialize uses when none is given")
	fs.Var((*listFlag)(&o.AllowedImages), "allowed-image", "image pattern (path.Match) sandboxes may use, for example python:* (repeatable; default: any)")
	fs.StringVar(&o.PullPolicy, "pull-policy", o.PullPolicy, "image pull policy: IfNotPresent, Never or Always")
	fs.Var((*listFlag)(&o.AllowedRegistries), "allowed-registries", "docker backend: image registry sandboxes may use besides public ones: host (any port), host:port or CIDR (repeatable; default: none, so loopback, private, link-local and single-label registry hosts and localhost are refused)")
	fs.BoolVar(&o.AllowPublicRegistries, "allow-public-registries", o.AllowPublicRegistries, "docker backend: allow any public registry host (and images without one, which are Docker Hub's); false makes --allowed-registries a strict allow-list")
	fs.StringVar(&o.Runtime, "runtime", o.Runtime, "OCI runtime: runc or runsc (gVisor)")
	fs.BoolVar(&o.AllowEgress, "allow-egress", o.AllowEgress, "let sandbox_initialize ask for network \"egress\"")
	fs.Var((*listFlag)(&o.EgressAllowCIDRs), "egress-allow-cidr", "with --allow-egress and the docker backend: IPv4 CIDR egress sandboxes may reach although private or link-local (repeatable; default: none). The docker backend installs the egress iptables rules (needs root) unless a node manager owns them")
	fs.Var((*listFlag)(&o.HostDirs), "allow-host-dir", "host directory copy_project, copy_file and copy_file_from_sandbox may use (repeatable; default: none). Over HTTP each identity gets its own subdirectory of it")
	fs.StringVar(&o.OwnerKeyFile, "owner-key-file", o.OwnerKeyFile, "file holding the secret key (at least 16 bytes, e.g. openssl rand -hex 32) of the identity hashes that label sandboxes (sandbox.code-sandbox.dev/mcp-owner) and name per-identity host directories, and of the MCP session IDs; share it between instances and keep it across restarts. Missing: a random key for this process")

	fs.DurationVar(&o.CommandTimeout, "command-timeout", o.CommandTimeout, "default timeout of one command")
	fs.DurationVar(&o.MaxCommandTimeout, "max-command-timeout", o.MaxCommandTimeout, "largest timeout_seconds a call may ask for")
	fs.Var((*sizeFlag)(&o.OutputLimit), "output-limit", "cap on each of stdout and stderr per command")
	fs.Var((*sizeFlag)(&o.ExecOutputBudget), "exec-output-budget", "cap on the output one sandbox_exec call keeps and returns, across all its commands and both streams (each command keeps the end of its output within its share)")
	fs.IntVar(&o.MaxSandboxes, "max-sandboxes", o.MaxSandboxes, "sandboxes one identity may have at once")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", o.IdleTimeout, "remove a sandbox unused for this long")
	fs.DurationVar(&o.IdlePause, "idle-pause", o.IdlePause, "pause a sandbox unused for this long (no CPU, memory kept) until its next exec or file transfer resumes it; 0 turns it off; shorter than --idle-timeout")
	fs.DurationVar(&o.MaxLifetime, "max-lifetime", o.MaxLifetime, "longest a sandbox may live (and the default lifetime)")
	fs.Float64Var(&o.MaxCPU, "max-cpu", o.MaxCPU, "most CPUs a sandbox may ask for")
	fs.Var((*sizeFlag)(&o.MaxMemoryBytes), "max-memory", "most memory a sandbox may ask for")
	fs.Var((*sizeFlag)(&o.MaxReadBytes), "max-read-bytes", "largest file read_file returns")
	fs.Var((*sizeFlag)(&o.MaxFileBytes), "max-file-bytes", "largest file copy_file and copy_file_from_sandbox move")
	fs.Var((*sizeFlag)(&o.MaxUploadBytes), "max-upload-bytes", "largest total copy_project sends")
	fs.IntVar(&o.MaxUploadEntries, "max-upload-entries", o.MaxUploadEntries, "most files and directories copy_project sends")
	fs.StringVar(&o.HistoryDir, "history-dir", o.HistoryDir, "keep exec history in files here (default: in memory)")
	fs.StringVar(&o.SnapshotRegistry, "snapshot-registry", o.SnapshotRegistry, "docker backend: keep sandbox_snapshot's tars in this OCI registry repository (HOST[:PORT]/PATH; plain HTTP only on loopback), removed on exit, instead of --snapshot-dir")
	fs.StringVar(&o.SnapshotDir, "snapshot-dir", o.SnapshotDir, "docker backend: keep sandbox_snapshot's snapshots in a directory of this server run under this one, removed on exit (default: the system temp directory)")
	fs.IntVar(&o.MaxSnapshots, "max-snapshots", o.MaxSnapshots, "most snapshots one identity may keep at once")
	fs.StringVar(&o.WarmPool, "warm-pool", "", fmt.Sprintf("docker backend: keep this many paused sandboxes of the default settings (--default-image, default CPU and memory, no network) ready, so that such a sandbox_initialize returns at once; 0 turns it off (default %d, at most %d). kubernetes backend: the name of a SandboxWarmPool in the Sandboxes' namespace that a sandbox_initialize with the default settings claims from (default: none)", dockerbackend.DefaultWarmPool, dockerbackend.MaxWarmPool))

	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&o.LogFormat, "log-format", o.LogFormat, "log format: text or json")
	fs.BoolVar(showVersion, "version", false, "print the version and exit")
	return fs
}
