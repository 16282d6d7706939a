package mcpmain

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// startPreview serves preview URLs (expose_port) on their own listener,
// --preview-addr, so that a preview is another origin than the MCP
// endpoint. It returns the base URL the tools hand out (--preview-url, or
// http://ADDR) and a function that stops the listener. On the kubernetes
// backend every replica serves every URL: the exposure records live on the
// Sandboxes (kubebackend/ports.go), and the URL's key derives from the owner
// key the replicas share.
func startPreview(o Config, backend any, logger *slog.Logger) (string, func(), error) {
	pb, ok := backend.(contract.PortBackend)
	if !ok {
		return "", nil, usagef("--preview-addr: this backend cannot reach ports in sandboxes")
	}
	host, _, err := net.SplitHostPort(o.PreviewAddr)
	if err != nil {
		return "", nil, usagef("--preview-addr %q: want HOST:PORT: %v", o.PreviewAddr, err)
	}
	if !isLoopbackHost(host) && !o.AllowRemote {
		return "", nil, usagef("--preview-addr %q is not a loopback address; bind 127.0.0.1, or pass --allow-remote", o.PreviewAddr)
	}
	if o.PreviewURL != "" && !strings.HasPrefix(o.PreviewURL, "http://") && !strings.HasPrefix(o.PreviewURL, "https://") {
		return "", nil, usagef("--preview-url %q: want an http:// or https:// URL", o.PreviewURL)
	}
	ln, err := net.Listen("tcp", o.PreviewAddr)
	if err != nil {
		return "", nil, usagef("--preview-addr: %v", err)
	}
	base := o.PreviewURL
	if base == "" {
		base = "http://" + ln.Addr().String()
	}
	srv := &http.Server{
		Handler:           mcpserver.PreviewHandler(pb, logger),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("preview listener", "error", err)
		}
	}()
	logger.Info("serving previews", "addr", ln.Addr().String(), "url", base)
	return base, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
