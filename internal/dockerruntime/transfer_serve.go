package dockerruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// File transfers run the helper's own `untar` and `tar` (the one walker,
// with its limits and path rules) as a command of the sandbox's resident
// helper, instead of a Docker exec each: a 1 KiB write_file cost ~50 ms,
// nearly all of it the exec's process setup, and costs what a repeated
// command does this way. A helper that lists
// helperproto.FeatureStreamedUntar runs them in its serve process instead
// of forking itself (which started the Go binary again, ~3-4 ms). An upload
// of at most serveUploadMax (sanitised) goes as the command's stdin; a
// larger one streams as data frames of uploadChunk to such a helper
// (streamUntar), or through an exec of its own where the helper is older.
// A download streams back as the command's stdout frames, recounted and
// bounded on this side by execio.ForwardTar as before.

// serveUploadMax bounds an upload carried in the resident helper's request
// frame (helperproto.MaxRequestFrame, base64 in JSON); it is held in memory
// while it is sent.
const serveUploadMax = 4 << 20

// uploadChunk is one data frame of a streamed upload: what the manager
// holds of it at a time, besides the sanitiser's pipe.
const uploadChunk = 256 << 10

// transferTimeout is a transfer's command timeout in the helper: none of
// its own, as with an exec; the caller's context bounds it.
const transferTimeout = execio.MaxTimeout

// runInHelper runs argv, one of the helper's own subcommands, as a command
// of the sandbox's resident helper: stdin fed, stdout and stderr streamed
// to w and stderr. handled is false, with nothing run, when the sandbox's
// helper predates serve; the caller then uses an exec.
func (c *Client) runInHelper(ctx context.Context, id string, argv []string, stdin []byte, stdout, stderr io.Writer) (code int, handled bool, err error) {
	if c.isLegacy(id) {
		return 0, false, nil
	}
	runID := newRunID()
	request, err := json.Marshal(helperproto.ServeRequest{ID: runID, Argv: argv, Stdin: stdin})
	if err != nil {
		return 0, true, fmt.Errorf("encoding the transfer for the sandbox helper: %w", err)
	}
	s, err := c.acceptedServe(ctx, id, request, c.callTimeout+helperBackstopGrace)
	if errors.Is(err, errHelperWithoutServe) {
		c.markLegacy(id)
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	res, reusable, err := c.streamServe(ctx, s, execio.Request{
		TimeoutSeconds:   int64(transferTimeout / time.Second),
		OutputLimitBytes: math.MaxInt64, // bounded by the caller's writer
	}, stdout, stderr, runID)
	if reusable {
		c.park(id, s)
	} else {
		s.close()
	}
	return res.ExitCode, true, err
}

// untarArgv and tarArgv are the helper's transfer commands.
func untarArgv(dest execio.Target, limits execio.UploadLimits) []string {
	argv := []string{HelperPath, "untar", "--root=" + dest.Root, "--dest=" + dest.Rel,
		fmt.Sprintf("--max-bytes=%d", limits.MaxBytes), fmt.Sprintf("--max-entries=%d", limits.MaxEntries)}
	if limits.Symlinks {
		argv = append(argv, "--links=1")
	}
	return argv
}

func tarArgv(src execio.Target, maxBytes int64) []string {
	return []string{HelperPath, "tar", "--root=" + src.Root, "--path=" + src.Rel, fmt.Sprintf("--max-bytes=%d", maxBytes)}
}

// failingReader returns err (io.EOF when nil) on every read: the end of a
// replayed upload whose sanitiser failed, so the exec's helper sees the
// archive cut where the sanitiser stopped, as it would have streamed.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) {
	if f.err == nil {
		return 0, io.EOF
	}
	return 0, f.err
}

// noteFeatures records what a container's helper can do (from its ready
// frame).
func (c *Client) noteFeatures(id string, r helperproto.Ready) {
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	if c.standby.features == nil {
		c.standby.features = map[string]helperproto.Ready{}
	}
	c.standby.features[id] = r
}

// helperHas says whether the container's helper lists feature. Unknown
// (no helper of this client started there yet: a manager restarted since)
// starts one, as the transfer would, and parks it.
func (c *Client) helperHas(ctx context.Context, id, feature string) bool {
	if c.isLegacy(id) {
		return false
	}
	c.awaitPrestart(ctx, id)
	c.standby.mu.Lock()
	r, known := c.standby.features[id]
	c.standby.mu.Unlock()
	if known {
		return r.Has(feature)
	}
	sctx, cancel := c.bounded(ctx)
	defer cancel()
	s, err := c.startServe(sctx, id)
	if err != nil {
		if errors.Is(err, errHelperWithoutServe) {
			c.markLegacy(id)
		}
		return false
	}
	c.park(id, s)
	c.standby.mu.Lock()
	r = c.standby.features[id]
	c.standby.mu.Unlock()
	return r.Has(feature)
}

// streamUntar uploads archive (already sanitised, of any size) to the
// container's resident helper, which extracts it in its serve process as
// it arrives: data frames of uploadChunk, so neither side holds more than a
// frame of it. handled is false, with nothing sent, when the helper cannot
// (older than helperproto.FeatureStreamedUntar, or no serve); the caller
// then uses an exec. A read error of archive (the sanitiser's verdict) ends
// the stream there, so the helper sees the archive cut, as an exec would.
// abort fails archive's reads once the helper has ended the command, so a
// sender waiting for more of a slow client's upload is not left behind.
func (c *Client) streamUntar(ctx context.Context, id string, dest execio.Target, limits execio.UploadLimits, archive io.Reader, abort func(), stderr io.Writer) (code int, handled bool, err error) {
	if !c.helperHas(ctx, id, helperproto.FeatureStreamedUntar) {
		return 0, false, nil
	}
	runID := newRunID()
	request, err := json.Marshal(helperproto.ServeRequest{ID: runID, Argv: untarArgv(dest, limits), StdinFrames: true})
	if err != nil {
		return 0, true, fmt.Errorf("encoding the transfer for the sandbox helper: %w", err)
	}
	s, err := c.acceptedServe(ctx, id, request, c.callTimeout+helperBackstopGrace)
	if errors.Is(err, errHelperWithoutServe) {
		c.markLegacy(id)
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	// The sender stops at the archive's end, at its error, or when the
	// helper has ended the command (its exit frame: an archive refused part
	// way); it always ends the stream with FrameCloseWrite, which the
	// helper reads to the end of before its next request.
	stopSend := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		buf := make([]byte, uploadChunk)
		var sendErr error
		for {
			select {
			case <-stopSend:
			default:
				n, rerr := io.ReadFull(archive, buf)
				if n > 0 {
					if sendErr = s.send(helperproto.FrameData, buf[:n]); sendErr != nil {
						sent <- sendErr
						return
					}
				}
				if rerr == nil {
					continue
				}
			}
			break
		}
		sent <- s.send(helperproto.FrameCloseWrite, nil)
	}()
	res, reusable, err := c.streamServe(ctx, s, execio.Request{
		TimeoutSeconds:   int64(transferTimeout / time.Second),
		OutputLimitBytes: math.MaxInt64,
	}, io.Discard, stderr, runID)
	close(stopSend)
	abort()
	var sendErr error
	if reusable {
		// The helper drains the rest; the sender's write is bounded by the
		// connection's write deadline.
		sendErr = <-sent
	} else {
		// A helper gone or confused: its connection is closed, which fails
		// a sender blocked on it.
		s.close()
		<-sent //nolint:errcheck // the helper is gone; its stream's error is the one reported
	}
	if reusable && sendErr == nil {
		c.park(id, s)
	} else {
		s.close()
	}
	if err == nil && sendErr != nil && res.ExitCode == 0 {
		err = fmt.Errorf("streaming the upload to the sandbox helper in %s: %w", ShortID(id), sendErr)
	}
	return res.ExitCode, true, err
}
