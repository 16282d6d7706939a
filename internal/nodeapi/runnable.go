/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// ShutdownGracePeriod is how long a stopping manager lets running requests
// finish before it cancels them (which kills their commands).
const ShutdownGracePeriod = 5 * time.Second

// Runnable serves a handler over TLS on a listener until its context ends.
// It is a controller-runtime manager.Runnable (mgr.Add).
type Runnable struct {
	listener net.Listener
	server   *http.Server
	log      logr.Logger
}

// NewRunnable prepares to serve handler on l with tlsConfig (see
// ServerTLSConfig); name says in logs which API it is. The aggregated API
// server is served the same way.
func NewRunnable(name string, l net.Listener, handler http.Handler, tlsConfig *tls.Config) *Runnable {
	rlog := logf.Log.WithName(name)
	return &Runnable{
		listener: l,
		log:      rlog,
		server: &http.Server{
			Handler:   handler,
			TLSConfig: tlsConfig,
			// Streams (exec output, follow) run long, so there is no write
			// timeout; headers and idle connections are bounded.
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          log.New(&logrWriter{log: rlog}, "", 0),
		},
	}
}

// Addr is the address the API listens on.
func (r *Runnable) Addr() net.Addr { return r.listener.Addr() }

// Start serves until ctx ends, then shuts down: running requests get
// ShutdownGracePeriod to finish before they are canceled.
func (r *Runnable) Start(ctx context.Context) error {
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	r.server.BaseContext = func(net.Listener) context.Context { return base }
	errCh := make(chan error, 1)
	go func() { errCh <- r.server.ServeTLS(r.listener, "", "") }()
	r.log.Info("serving", "address", r.listener.Addr().String())
	select {
	case err := <-errCh:
		return fmt.Errorf("node API server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGracePeriod)
	defer cancel()
	if err := r.server.Shutdown(sctx); err != nil {
		// Streams still open after the grace period: cancel them, which
		// kills their commands, and close their connections.
		cancelBase()
		_ = r.server.Close()
	}
	if err := <-errCh; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("node API server: %w", err)
	}
	return nil
}

// NeedLeaderElection is false: every node's manager serves its own API.
func (r *Runnable) NeedLeaderElection() bool { return false }

// logrWriter sends net/http's own error log (TLS handshake failures and the
// like) to the manager's logger, at debug level: scanners cause plenty.
type logrWriter struct{ log logr.Logger }

func (w *logrWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
