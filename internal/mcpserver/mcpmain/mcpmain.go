// Package mcpmain is the code-sandbox-mcp binary's wiring: its flags, their
// validation, the choice and construction of the backend (Docker or
// Kubernetes), authentication, and the stdio or HTTP transport. The binary's
// main only calls Run; the tests drive the same wiring (see docs/mcp.md for
// the flags).
package mcpmain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
)

// exitUsage is the exit code for bad flags or an unusable configuration.
const exitUsage = 2

// listFlag is a repeatable flag; each use may also carry a comma list.
// Run runs the server with the command line args (without the program name)
// and returns the process's exit code: 0, 1 for a failure while serving, 2
// (exitUsage) for bad flags or a configuration the server refuses.
func Run(args []string) int {
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
