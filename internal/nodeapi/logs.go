/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
)

// tailFollow reads ?tail=N&follow=BOOL.
func tailFollow(r *http.Request) (tail int, follow bool, err *apiError) {
	q := r.URL.Query()
	if v := q.Get("tail"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 0 {
			return 0, false, badRequest("tail %q is not a non-negative integer", v)
		}
		tail = n
	}
	if v := q.Get("follow"); v != "" {
		b, perr := strconv.ParseBool(v)
		if perr != nil {
			return 0, false, badRequest("follow %q is not a boolean", v)
		}
		follow = b
	}
	return tail, follow, nil
}

// serveLog streams the container's output (stdout and stderr interleaved).
func (s *Server) serveLog(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	tail, follow, perr := tailFollow(r)
	if perr != nil {
		writeError(w, perr)
		return
	}
	if follow {
		// A follow lasts until its caller leaves or the container stops.
		release, lerr := s.followers.acquire(sbx.UID)
		if lerr != nil {
			writeError(w, lerr)
			return
		}
		defer release()
	}
	w.Header().Set("Trailer", subresource.TrailerTransferError+", "+subresource.TrailerTransferErrorReason)
	lw := &lockedWriter{w: &lazyWriter{w: w, contentType: "text/plain; charset=utf-8", flush: follow}}
	err := s.cfg.Runtime.Logs(r.Context(), ct.ID, dockerruntime.LogsOptions{Tail: tail, Follow: follow}, lw, lw)
	if err != nil {
		if !lw.w.started {
			writeError(w, err)
			return
		}
		logf.FromContext(r.Context()).Info("log stream ended early", "error", err.Error())
		if r.Context().Err() == nil {
			setStreamTrailers(w, err)
		}
		return
	}
	if !lw.w.started {
		lw.w.start()
	}
}

// lockedWriter serialises writes of two streams into one response.
type lockedWriter struct {
	mu sync.Mutex
	w  *lazyWriter
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// serveHistory streams the exec history as NDJSON of history.Record.
func (s *Server) serveHistory(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox) {
	tail, follow, perr := tailFollow(r)
	if perr != nil {
		writeError(w, perr)
		return
	}
	key := string(sbx.UID)
	if !follow {
		recs, err := s.cfg.History.Tail(key, tail)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", subresource.ContentTypeNDJSON)
		enc := json.NewEncoder(w)
		for i := range recs {
			if err := enc.Encode(&recs[i]); err != nil {
				return
			}
		}
		return
	}
	// A follow lasts until its caller leaves or the Sandbox's history is
	// deleted with it (history.ErrDeleted).
	release, lerr := s.followers.acquire(sbx.UID)
	if lerr != nil {
		writeError(w, lerr)
		return
	}
	defer release()
	lw := &lazyWriter{w: w, contentType: subresource.ContentTypeNDJSON, flush: true}
	// The headers go out at once, so a follower knows it is connected.
	lw.start()
	_ = http.NewResponseController(w).Flush()
	enc := json.NewEncoder(lw)
	err := s.cfg.History.Follow(r.Context(), key, tail, func(rec history.Record) error {
		return enc.Encode(&rec)
	})
	switch {
	case errors.Is(err, history.ErrDeleted):
		// The Sandbox is gone, and its history with it.
		_ = enc.Encode(streamStatus(sbx.Name, notFound("sandbox %s/%s was deleted, and its history with it", sbx.Namespace, sbx.Name), ""))
	case err != nil && r.Context().Err() == nil:
		// Typically a follower too slow to keep up; it reconnects with a
		// tail. The last line says so, as a metav1.Status.
		logf.FromContext(r.Context()).Info("history stream ended", "error", err.Error())
		_ = enc.Encode(streamStatus(sbx.Name, err, ""))
	}
}
