package sandboxclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
)

// LogOptions select what Logs and History return.
type LogOptions struct {
	// Tail > 0 returns only the last Tail lines (records); otherwise all.
	Tail int
	// Follow keeps the stream open and delivers new output until ctx ends.
	Follow bool
}

func (o LogOptions) query() url.Values {
	q := url.Values{}
	if o.Tail > 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	if o.Follow {
		q.Set("follow", "true")
	}
	return q
}

// Exec runs req in the sandbox and copies its output to stdout and stderr
// (either may be nil to discard) as the node API streams it. A command that
// ran is a nil error whatever its exit code; look at the Result. The error
// is an *ExecError when the node API could not run it to completion.
func (c *Client) Exec(ctx context.Context, ref Ref, req execio.Request, stdout, stderr io.Writer) (execio.Result, error) {
	ns, name := ref.key()
	body, err := json.Marshal(req)
	if err != nil {
		return execio.Result{}, fmt.Errorf("sandbox %s/%s: encoding the exec request: %w", ns, name, err)
	}
	// Cancelling on return closes the stream if a writer fails mid-way,
	// which tells the node API to kill the command.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodPost,
		subresource: subresource.SubresourceExec,
		body:        bytes.NewReader(body),
		contentType: "application/json",
		accept:      subresource.ContentTypeNDJSON,
	})
	if err != nil {
		return execio.Result{}, err
	}
	defer resp.Body.Close()
	res, err := DecodeFrames(resp.Body, orDiscard(stdout), orDiscard(stderr))
	if err != nil {
		var fe *frameError
		if errors.As(err, &fe) {
			return res, &ExecError{Namespace: ns, Name: name, Message: fe.msg, Reason: fe.reason}
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return res, fmt.Errorf("sandbox %s/%s: exec: %w", ns, name, err)
	}
	return res, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// frameError is an exec stream that ended with an error frame.
type frameError struct {
	msg    string
	reason metav1.StatusReason
}

func (e *frameError) Error() string { return e.msg }

// DecodeFrames reads an exec response (NDJSON frames), writing each
// output frame to stdout or stderr as soon as it is decoded, until the frame
// that ends the stream. A stream that ends without a result or error frame
// is an io.ErrUnexpectedEOF: the command's fate is unknown.
func DecodeFrames(r io.Reader, stdout, stderr io.Writer) (execio.Result, error) {
	dec := json.NewDecoder(r)
	for {
		var f subresource.Frame
		if err := dec.Decode(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return execio.Result{}, fmt.Errorf("the exec stream ended without a result: %w", io.ErrUnexpectedEOF)
			}
			return execio.Result{}, fmt.Errorf("reading the exec stream: %w", err)
		}
		switch {
		case f.Error != "" || f.Status != nil:
			fe := &frameError{msg: f.Error}
			if f.Status != nil {
				fe.reason = f.Status.Reason
				if fe.msg == "" {
					fe.msg = f.Status.Message
				}
			}
			return execio.Result{}, fe
		case f.Result != nil:
			return *f.Result, nil
		case f.Stream == subresource.StreamStdout:
			if _, err := stdout.Write(f.Data); err != nil {
				return execio.Result{}, fmt.Errorf("writing stdout: %w", err)
			}
		case f.Stream == subresource.StreamStderr:
			if _, err := stderr.Write(f.Data); err != nil {
				return execio.Result{}, fmt.Errorf("writing stderr: %w", err)
			}
		default:
			// Frames this client does not know (a newer server's) carry
			// nothing it could show; skipping them keeps old clients
			// working.
		}
	}
}

// Upload extracts a tar stream (regular files and directories only) into
// directory destDir in the sandbox (relative paths are relative to its
// working directory). The stream is sent as it is read.
func (c *Client) Upload(ctx context.Context, ref Ref, destDir string, tarStream io.Reader) (execio.TransferStats, error) {
	ns, name := ref.key()
	if tarStream == nil {
		return execio.TransferStats{}, fmt.Errorf("sandbox %s/%s: upload to %s: the tar stream is nil", ns, name, destDir)
	}
	length, ok := knownLength(tarStream)
	if !ok {
		length = -1
	}
	return c.put(ctx, ref, url.Values{"path": {destDir}}, subresource.ContentTypeTar, tarStream, length)
}

// UploadFile writes content to the file at path in the sandbox, with mode's
// permission bits, creating missing parent directories. The node API needs
// the size up front: it is taken from content's Len() or, for a seekable
// reader such as an *os.File, from its remaining bytes; any other reader is
// first spooled to a temporary file (never to memory).
func (c *Client) UploadFile(ctx context.Context, ref Ref, path string, mode os.FileMode, content io.Reader) (execio.TransferStats, error) {
	ns, name := ref.key()
	if content == nil {
		content = bytes.NewReader(nil)
	}
	length, ok := knownLength(content)
	if !ok {
		spool, err := os.CreateTemp("", "sandbox-upload-*")
		if err != nil {
			return execio.TransferStats{}, fmt.Errorf("sandbox %s/%s: upload to %s: spooling content of unknown size: %w", ns, name, path, err)
		}
		defer func() {
			_ = spool.Close()
			_ = os.Remove(spool.Name())
		}()
		// One byte past the node's default cap is enough to know the node
		// would refuse it; spooling further would only fill the disk.
		n, err := io.Copy(spool, io.LimitReader(content, execio.DefaultUploadLimit+1))
		if err != nil {
			return execio.TransferStats{}, fmt.Errorf("sandbox %s/%s: upload to %s: spooling content: %w", ns, name, path, err)
		}
		if n > execio.DefaultUploadLimit {
			return execio.TransferStats{}, &APIError{Namespace: ns, Name: name, Code: http.StatusRequestEntityTooLarge,
				Reason: metav1.StatusReasonRequestEntityTooLarge, Source: SourceClient,
				Message: fmt.Sprintf("the content for %s is larger than %d bytes, the node API's default upload cap", path, execio.DefaultUploadLimit)}
		}
		if _, err := spool.Seek(0, io.SeekStart); err != nil {
			return execio.TransferStats{}, fmt.Errorf("sandbox %s/%s: upload to %s: rewinding spooled content: %w", ns, name, path, err)
		}
		content, length = spool, n
	}
	q := url.Values{"path": {path}, "mode": {fmt.Sprintf("%#o", mode.Perm())}}
	return c.put(ctx, ref, q, subresource.ContentTypeBinary, io.LimitReader(content, length), length)
}

// knownLength returns how many bytes r will yield, when r can tell without
// being read.
func knownLength(r io.Reader) (int64, bool) {
	switch v := r.(type) {
	case interface{ Len() int }:
		return int64(v.Len()), true
	case io.Seeker:
		if f, ok := r.(*os.File); ok {
			// Pipes and terminals are *os.Files too, but not seekable.
			if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
				return 0, false
			}
		}
		cur, err := v.Seek(0, io.SeekCurrent)
		if err != nil {
			return 0, false
		}
		end, err := v.Seek(0, io.SeekEnd)
		if err != nil {
			return 0, false
		}
		if _, err := v.Seek(cur, io.SeekStart); err != nil {
			return 0, false
		}
		return end - cur, true
	}
	return 0, false
}

// put uploads body; length is its size, or -1 when unknown (sent chunked).
func (c *Client) put(ctx context.Context, ref Ref, q url.Values, contentType string, body io.Reader, length int64) (execio.TransferStats, error) {
	ns, name := ref.key()
	if length == 0 {
		// ContentLength 0 with a body means "unknown" to net/http.
		body = http.NoBody
	} else {
		// Hiding the body's type keeps the transport from closing the
		// caller's reader (an *os.File, say) when it is done.
		body = io.NopCloser(body)
	}
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodPost,
		subresource: subresource.SubresourceFiles,
		query:       q,
		body:        body,
		length:      length,
		contentType: contentType,
		accept:      "application/json",
	})
	if err != nil {
		return execio.TransferStats{}, err
	}
	defer resp.Body.Close()
	var stats execio.TransferStats
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&stats); err != nil {
		return execio.TransferStats{}, fmt.Errorf("sandbox %s/%s: decoding the upload result for %s: %w", ns, name, q.Get("path"), err)
	}
	return stats, nil
}

// Download writes a tar of the file or tree at path to w as it arrives; its
// entries are named below path's base name. Because the node API can only
// report a failure that happens after streaming began (such as the size
// cap) in a trailer, w may have received a partial archive when the error is
// a *TransferError.
func (c *Client) Download(ctx context.Context, ref Ref, path string, w io.Writer) error {
	ns, name := ref.key()
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodGet,
		subresource: subresource.SubresourceFiles,
		query:       url.Values{"path": {path}},
		accept:      subresource.ContentTypeTar,
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("sandbox %s/%s: downloading %s: %w", ns, name, path, err)
	}
	// Trailers are only known once the body has been read to EOF.
	return trailerError(ns, name, path, resp)
}

// trailerError is the failure a stream's trailers report, or nil.
func trailerError(ns, name, path string, resp *http.Response) error {
	msg := resp.Trailer.Get(subresource.TrailerTransferError)
	if msg == "" {
		return nil
	}
	return &TransferError{Namespace: ns, Name: name, Path: path, Message: msg,
		Reason: metav1.StatusReason(resp.Trailer.Get(subresource.TrailerTransferErrorReason))}
}

// Logs copies the container's output to w. With Follow it returns when ctx
// ends (with ctx's error) or the node API closes the stream.
func (c *Client) Logs(ctx context.Context, ref Ref, opts LogOptions, w io.Writer) error {
	ns, name := ref.key()
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodGet,
		subresource: subresource.SubresourceLog,
		query:       opts.query(),
		accept:      "text/plain",
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("sandbox %s/%s: reading logs: %w", ns, name, err)
	}
	return trailerError(ns, name, "", resp)
}

// History calls fn with each exec history record, oldest first, and with
// Follow each new one as it happens, until ctx ends (returning ctx's error),
// the stream ends, or fn returns an error (which History returns).
func (c *Client) History(ctx context.Context, ref Ref, opts LogOptions, fn func(history.Record) error) error {
	ns, name := ref.key()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodGet,
		subresource: subresource.SubresourceHistory,
		query:       opts.query(),
		accept:      subresource.ContentTypeNDJSON,
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var line json.RawMessage
		if err := dec.Decode(&line); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("sandbox %s/%s: reading history: %w", ns, name, err)
		}
		// A followed history that ends early ends with a Status line.
		var kind struct {
			Kind string `json:"kind"`
		}
		if json.Unmarshal(line, &kind) == nil && kind.Kind == "Status" {
			var st metav1.Status
			if err := json.Unmarshal(line, &st); err != nil {
				return fmt.Errorf("sandbox %s/%s: reading history: %w", ns, name, err)
			}
			return &TransferError{Namespace: ns, Name: name, Message: st.Message, Reason: st.Reason}
		}
		var rec history.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("sandbox %s/%s: reading history: %w", ns, name, err)
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}

// EgressLog calls fn with each of the node egress proxy's recent decisions
// about the sandbox (credentials added, requests and connections refused),
// oldest first; opts.Tail keeps the last N. opts.Follow is refused. The
// events never carry a credential.
func (c *Client) EgressLog(ctx context.Context, ref Ref, opts LogOptions, fn func(subresource.EgressEvent) error) error {
	ns, name := ref.key()
	if opts.Follow {
		return fmt.Errorf("sandbox %s/%s: egress decisions cannot be followed", ns, name)
	}
	q := opts.query()
	q.Set(subresource.QueryEgress, "true")
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodGet,
		subresource: subresource.SubresourceLog,
		query:       q,
		accept:      subresource.ContentTypeNDJSON,
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(io.LimitReader(resp.Body, 64<<20))
	for {
		var ev subresource.EgressEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("sandbox %s/%s: reading egress decisions: %w", ns, name, err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}
