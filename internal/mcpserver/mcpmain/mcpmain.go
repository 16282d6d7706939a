// Package mcpmain is the code-sandbox-mcp binary's wiring: the validation of
// its Config, the choice and construction of the backend (Docker or
// Kubernetes), authentication, and the stdio or HTTP transport. The binary's
// main defines the flags, fills a Config and calls Run (see docs/mcp.md for
// the flags); the tests drive the same wiring with a Config.
package mcpmain

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
)

// ExitUsage is the exit code for bad flags or an unusable configuration.
const ExitUsage = 2

// Run serves with cfg until stdin ends (stdio) or a signal arrives, and
// returns the process's exit code: 0, 1 for a failure while serving, 2
// (ExitUsage) for a configuration the server refuses.
func Run(cfg Config) int {
	// Whatever happens below, stdout is the protocol's alone.
	log.SetOutput(os.Stderr)
	logger, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return ExitUsage
	}
	slog.SetDefault(logger)
	if err := serve(cfg, logger); err != nil {
		logger.Error("code-sandbox-mcp failed", "error", err)
		var ue usageError
		if errors.As(err, &ue) {
			return ExitUsage
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

func serve(o Config, logger *slog.Logger) error {
	return serveWith(o, logger, func() (context.Context, context.CancelFunc) {
		return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	}, nil)
}

// serveWith is serve with the run's context made by newCtx (once the
// backend exists) and, over HTTP, listening called with the endpoint's URL
// once the server accepts connections. Tests drive the real wiring
// through it.
func serveWith(o Config, logger *slog.Logger, newCtx func() (context.Context, context.CancelFunc), listening func(url string)) error {
	if o.HTTPAddr == "" && (o.AcceptAPIServerAudience || len(o.AllowUsers) > 0 || len(o.AllowGroups) > 0) {
		return usagef("--accept-apiserver-audience, --allow-user and --allow-group are for --http with --auth kubernetes")
	}
	if o.HTTPAddr == "" && (!reflect.DeepEqual(o.OIDC, DefaultConfig().OIDC) || len(o.ScopesSupported) > 0) {
		return usagef("the --oidc-* flags and --scope are for --http with --auth oidc")
	}
	cfg, err := toolConfig(o)
	if err != nil {
		return err
	}
	if o.HTTPAddr != "" {
		// Several identities share an HTTP endpoint: each gets its own
		// subdirectory of every --allow-host-dir.
		cfg.HostRoots.SeparateIdentities()
	}
	if err := loadOwnerKey(o, logger); err != nil {
		return err
	}
	var stdout *os.File
	if o.HTTPAddr == "" {
		// Claimed before anything else runs, so no later output can reach
		// the protocol stream by accident.
		if stdout, err = claimStdout(); err != nil {
			return err
		}
	}
	if o.IdlePause < 0 || (o.IdlePause > 0 && o.IdlePause >= o.IdleTimeout) {
		return usagef("--idle-pause %s: want 0 (off) or a duration shorter than --idle-timeout (%s)", o.IdlePause, o.IdleTimeout)
	}
	var kube *kubeSetup
	switch o.Backend {
	case "docker":
		if o.NamespaceFromServiceAccount {
			return usagef("--namespace-from-serviceaccount needs --backend kubernetes")
		}
		n, err := o.dockerWarmPool()
		if err != nil {
			return usagef("--warm-pool: %v", err)
		}
		if n < 0 || n > dockerbackend.MaxWarmPool {
			return usagef("--warm-pool %d: want 0 (off) to %d paused sandboxes", n, dockerbackend.MaxWarmPool)
		}
	case "kubernetes":
		if errs := validation.IsDNS1123Subdomain(o.WarmPool); o.WarmPool != "" && len(errs) > 0 {
			return usagef("--warm-pool %q: the kubernetes backend's --warm-pool names a SandboxWarmPool: %s", o.WarmPool, strings.Join(errs, "; "))
		}
		if kube, err = loadKube(o); err != nil {
			return err
		}
	default:
		return usagef("--backend %q: want docker or kubernetes", o.Backend)
	}
	var hs *httpSetup
	if o.HTTPAddr != "" {
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
	// The backend outlives ctx (a signal): calls in flight while the HTTP
	// server drains still need it.
	bctx, bstop := context.WithCancel(context.WithoutCancel(ctx))
	defer bstop()
	backend.Start(bctx)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := backend.Close(cctx); err != nil {
			logger.Error("closing the backend at exit (docker: removing this server's sandboxes)", "error", err)
		}
	}()
	attrs := []any{"version", version.Version, "backend", o.Backend, "instance", backend.InstanceID(),
		"default_image", cfg.DefaultImage, "egress", cfg.AllowEgress, "host_dirs", cfg.HostRoots.Roots()}
	if kube != nil {
		attrs = append(attrs, "namespace", kube.namespace)
	}
	logger.Info("code-sandbox-mcp starting", attrs...)

	if o.PreviewAddr != "" {
		base, stopPreview, err := startPreview(o, backend, logger)
		if err != nil {
			return err
		}
		defer stopPreview()
		cfg.PreviewBaseURL = base
	}
	mcpSrv, err := mcpserver.New(cfg, backend, logger)
	if err != nil {
		return usageError{err}
	}
	if hs == nil {
		err := transport.ServeStdio(ctx, mcpSrv, os.Stdin, stdout, logger)
		stop()
		logger.Info("stdio session ended; removing sandboxes")
		return err
	}
	return hs.run(ctx, stop, mcpSrv, backend, logger, listening)
}

// loadOwnerKey keys the identity hashes that label sandboxes and name the
// identities' host directories with --owner-key-file, or with a key of
// this process's own when the file is missing.
func loadOwnerKey(o Config, logger *slog.Logger) error {
	generated := true
	if o.OwnerKeyFile != "" {
		var err error
		if generated, err = contract.LoadIdentityKey(o.OwnerKeyFile); err != nil {
			return usageError{err}
		}
	}
	if generated && (o.Backend == "kubernetes" || (o.HTTPAddr != "" && len(o.HostDirs) > 0)) {
		logger.Warn("no owner key (--owner-key-file): using a random key of this process, so after a restart it no longer recognizes the Sandboxes, per-identity host directories and MCP session IDs of earlier runs, and other instances (replicas) never do",
			"owner_key_file", o.OwnerKeyFile)
	}
	return nil
}

func toolConfig(o Config) (mcpserver.Config, error) {
	roots, err := mcpserver.NewHostRoots(o.HostDirs)
	if err != nil {
		return mcpserver.Config{}, usageError{err}
	}
	cfg := mcpserver.Config{
		Version:          version.Version,
		DefaultImage:     o.DefaultImage,
		AllowedImages:    o.AllowedImages,
		AllowEgress:      o.AllowEgress,
		MaxNanoCPUs:      int64(o.MaxCPU * 1e9),
		MaxMemoryBytes:   o.MaxMemoryBytes,
		MaxLifetime:      o.MaxLifetime,
		CommandTimeout:   o.CommandTimeout,
		MaxTimeout:       o.MaxCommandTimeout,
		OutputLimit:      o.OutputLimit,
		ExecOutputBudget: o.ExecOutputBudget,
		HostRoots:        roots,
		MaxReadBytes:     o.MaxReadBytes,
		MaxFileBytes:     o.MaxFileBytes,
		MaxUploadBytes:   o.MaxUploadBytes,
		MaxUploadEntries: o.MaxUploadEntries,
	}
	// The tool descriptions state the backend's own defaults.
	switch o.Backend {
	case "kubernetes":
		// The Sandbox API's defaults; the grace period is the node
		// manager's --stop-grace-period, which this server does not know.
		cfg.SandboxNanoCPUs, cfg.SandboxMemoryBytes = sandboxv1alpha1.DefaultNanoCPUs, sandboxv1alpha1.DefaultMemoryBytes
		cfg.SandboxWorkingDir = sandboxv1alpha1.DefaultWorkingDir
	default:
		cfg.SandboxNanoCPUs, cfg.SandboxMemoryBytes = dockerruntime.DefaultNanoCPUs, dockerruntime.DefaultMemoryBytes
		cfg.SandboxWorkingDir, cfg.StopGrace = dockerruntime.DefaultWorkingDir, dockerbackend.DefaultStopGrace
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}
