/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// servePortForward forwards one TCP connection to 127.0.0.1:port inside
// the Sandbox (subresource.PortForwardProtocol): the port is dialled
// through the sandbox's helper first, so that a closed port is a clear
// refusal (502, cause PortClosed) and not an upgraded connection that ends
// at once; then the request is answered 101 and bytes flow both ways. The
// connection holds one of the Sandbox's exec slots while it lasts.
func (s *Server) servePortForward(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	port, perr := subresource.ParsePortForward(r)
	if perr != nil {
		writeError(w, perr)
		return
	}
	release, lerr := s.limits.acquire(sbx.UID)
	if lerr != nil {
		writeError(w, lerr)
		return
	}
	defer release()
	log := logf.FromContext(r.Context()).WithValues("port", port)
	pc, err := s.cfg.Runtime.DialPort(r.Context(), ct.ID, port)
	switch {
	case errors.Is(err, dockerruntime.ErrPortClosed):
		writeError(w, subresource.NewError(http.StatusBadGateway, metav1.StatusReasonServiceUnavailable, "sandbox %s/%s: %v", sbx.Namespace, sbx.Name, err).
			Because(subresource.CausePortClosed, subresource.QueryPort))
		return
	case err != nil:
		writeError(w, err)
		return
	}
	defer pc.Close()
	rc := http.NewResponseController(w)
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", subresource.PortForwardProtocol)
	w.WriteHeader(http.StatusSwitchingProtocols)
	conn, brw, err := rc.Hijack()
	if err != nil {
		log.Error(err, "hijacking the portforward connection")
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})
	log.Info("port forward opened")
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Bytes the client sent right behind its request are buffered.
		_, _ = io.Copy(pc, brw.Reader)
		_ = pc.CloseWrite()
	}()
	_, _ = io.Copy(conn, pc)
	// The sandbox's server is done; tell the client, and let its side
	// finish (or close) on its own.
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = conn.Close()
	}
	// A client that never closes its side is closed for.
	t := time.AfterFunc(30*time.Second, func() { _ = conn.Close() })
	wg.Wait()
	t.Stop()
	log.Info("port forward closed", "duration", time.Since(start).Round(time.Millisecond).String())
}
