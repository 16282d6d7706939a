/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// tarOverheadPerEntry bounds what tar adds around each entry's content
// (header, padding, PAX records), for the upload body cap.
const tarOverheadPerEntry = 2048

// serveUpload writes a tar tree into a directory, or one file.
func (s *Server) serveUpload(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	ctx := r.Context()
	q := r.URL.Query()
	target, err := execio.ResolvePath(workingDir(sbx), q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	mediaType := subresource.ContentTypeBinary
	if v := r.Header.Get("Content-Type"); v != "" {
		if mediaType, _, err = mime.ParseMediaType(v); err != nil {
			writeError(w, newError(http.StatusUnsupportedMediaType, "UnsupportedMediaType", "bad Content-Type %q: %v", v, err))
			return
		}
	}
	limits := execio.UploadLimits{MaxBytes: s.cfg.FileTransferLimit, MaxEntries: execio.DefaultMaxEntries}

	var archive io.Reader
	switch mediaType {
	case subresource.ContentTypeTar:
		if q.Has("mode") {
			writeError(w, badRequest("mode applies to single-file uploads (%s), not to archives, whose entries carry their own", subresource.ContentTypeBinary))
			return
		}
		maxBody := limits.MaxBytes + int64(limits.MaxEntries)*tarOverheadPerEntry
		if r.ContentLength > maxBody {
			writeError(w, tooLarge("the upload is %d bytes, more than the %d allowed", r.ContentLength, maxBody))
			return
		}
		archive = http.MaxBytesReader(unwrapWriter(w), r.Body, maxBody)
	case subresource.ContentTypeBinary:
		if target.Rel == "" {
			writeError(w, badRequest("path %q names the directory %s; a single-file upload needs a file path", q.Get("path"), target.Root))
			return
		}
		mode := int64(0o644)
		if v := q.Get("mode"); v != "" {
			m, err := strconv.ParseInt(v, 8, 32)
			if err != nil || m < 0 || m > 0o777 {
				writeError(w, badRequest("mode %q is not an octal permission between 0 and 0777", v))
				return
			}
			mode = m
		}
		// The tar header needs the size up front, and the cap is checked
		// before a byte is read.
		if r.ContentLength < 0 {
			writeError(w, newError(http.StatusLengthRequired, "LengthRequired", "a single-file upload needs a Content-Length"))
			return
		}
		if r.ContentLength > limits.MaxBytes {
			writeError(w, tooLarge("the file is %d bytes, more than the %d allowed", r.ContentLength, limits.MaxBytes))
			return
		}
		// One entry named by the whole relative path, extracted at the
		// root, so that missing parent directories are created like in any
		// tar extraction, all beneath the root.
		name, size := target.Rel, r.ContentLength
		target.Rel = ""
		pr, pw := io.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			pw.CloseWithError(execio.WriteSingleFileTar(pw, name, mode, size, r.Body))
		}()
		// Closing the reader unblocks the writer if the copy stops early;
		// waiting for it keeps r.Body from being read after we return.
		defer func() {
			_ = pr.Close()
			<-done
		}()
		archive = pr
	default:
		writeError(w, newError(http.StatusUnsupportedMediaType, "UnsupportedMediaType",
			"Content-Type %q is not supported; send %s (a tree) or %s (one file)", mediaType, subresource.ContentTypeTar, subresource.ContentTypeBinary))
		return
	}

	release, lerr := s.limits.acquire(sbx.UID)
	if lerr != nil {
		writeError(w, lerr)
		return
	}
	defer release()
	stats, err := s.cfg.Runtime.CopyIn(ctx, ct.ID, target, archive, limits)
	log := logf.FromContext(ctx)
	if err != nil {
		log.Info("upload failed", "root", target.Root, "rel", target.Rel, "error", err.Error())
		writeError(w, err)
		return
	}
	log.Info("upload done", "root", target.Root, "rel", target.Rel, "files", stats.Files, "bytes", stats.Bytes)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(stats)
}

// serveDownload streams a tar of a file or tree. An error before the first
// byte is a normal error answer; one after it (say, the size cap) can only
// be reported in the subresource.TrailerTransferError trailer.
func (s *Server) serveDownload(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	ctx := r.Context()
	src, err := execio.ResolvePath(workingDir(sbx), r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	release, lerr := s.limits.acquire(sbx.UID)
	if lerr != nil {
		writeError(w, lerr)
		return
	}
	defer release()

	w.Header().Set("Trailer", subresource.TrailerTransferError+", "+subresource.TrailerTransferErrorReason)
	lw := &lazyWriter{w: w, contentType: subresource.ContentTypeTar}
	stats, err := s.cfg.Runtime.CopyOut(ctx, ct.ID, src, lw, s.cfg.FileTransferLimit)
	log := logf.FromContext(ctx)
	if err != nil {
		log.Info("download failed", "root", src.Root, "rel", src.Rel, "afterBytes", lw.n, "error", err.Error())
		if !lw.started {
			writeError(w, err)
			return
		}
		setStreamTrailers(w, err)
		return
	}
	if !lw.started {
		// Nothing written at all is still a valid (empty) answer.
		lw.start()
	}
	log.Info("download done", "root", src.Root, "rel", src.Rel, "files", stats.Files, "bytes", stats.Bytes)
}

// setStreamTrailers reports err in the trailers of a stream that already
// began: its message and its reason.
func setStreamTrailers(w http.ResponseWriter, err error) {
	e := classify(err)
	w.Header().Set(subresource.TrailerTransferError, e.Message)
	w.Header().Set(subresource.TrailerTransferErrorReason, string(e.Reason))
}

// lazyWriter commits the response status only on the first write, so that
// errors found before any output still get a proper status code.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
	n           int64
	flush       bool
}

func (l *lazyWriter) start() {
	l.started = true
	h := l.w.Header()
	h.Set("Content-Type", l.contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	l.w.WriteHeader(http.StatusOK)
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.start()
	}
	n, err := l.w.Write(p)
	l.n += int64(n)
	if err == nil && l.flush {
		err = http.NewResponseController(l.w).Flush()
	}
	if err != nil {
		return n, errors.Join(errClientGone, err)
	}
	return n, nil
}

// errClientGone marks a failed write to the caller.
var errClientGone = errors.New("writing to the caller failed")
