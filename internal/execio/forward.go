package execio

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
)

// DownloadFramingAllowance is the tar framing (headers, padding, long
// names) a download may carry on top of its cap on file content.
const DownloadFramingAllowance int64 = 16 << 20

// ForwardTar copies a tar stream from r to w byte for byte while parsing
// it, counting entries and stopping with ErrTooLarge once the declared file
// content passes maxBytes or the whole stream passes maxBytes plus
// DownloadFramingAllowance. It is how a download is capped as it passes
// through, so that neither a tampered helper nor a misbehaving node can
// flood the receiver.
//
// The stream is written by code the sandbox controls (the helper's stdout
// is writable by the sandbox user), so every header is checked before its
// content is read: only directories, regular files and symbolic links (the
// node API's download contract sends a symlink as a link; it has no
// content) pass, anything else, sparse files above all (see EntryKind),
// is ErrUnsupportedEntry. Reading stops when ctx ends.
func ForwardTar(ctx context.Context, r io.Reader, w io.Writer, maxBytes int64) (TransferStats, error) {
	var stats TransferStats
	out := &cappedWriter{w: w, limit: maxBytes + DownloadFramingAllowance}
	cr := &ctxReader{ctx: ctx, r: r}
	tr := tar.NewReader(io.TeeReader(cr, out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if out.err != nil {
			return stats, out.err
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return stats, cerr
			}
			return stats, fmt.Errorf("reading the archive: %w", err)
		}
		kind, kerr := EntryKind(h)
		if kerr != nil && h.Typeflag == tar.TypeSymlink && h.Size == 0 {
			kind, kerr = "symlink", nil
		}
		if kerr != nil {
			return stats, fmt.Errorf("refusing the download: %w", kerr)
		}
		switch kind {
		case "dir":
			stats.Dirs++
		case "file":
			if h.Size > maxBytes-stats.Bytes {
				return stats, fmt.Errorf("%w: %q (%d bytes) takes the download past its %d-byte limit", ErrTooLarge, h.Name, h.Size, maxBytes)
			}
			stats.Files++
			stats.Bytes += h.Size
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			if out.err != nil {
				return stats, out.err
			}
			if cerr := ctx.Err(); cerr != nil {
				return stats, cerr
			}
			return stats, fmt.Errorf("reading %q from the archive: %w", h.Name, err)
		}
	}
	// Whatever follows the end-of-archive marker belongs to the stream too.
	if _, err := io.Copy(out, cr); err != nil {
		return stats, err
	}
	return stats, out.err
}

// ctxReader fails reads once ctx has ended, so a stream that keeps
// trickling cannot hold the forwarder past its request.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// cappedWriter fails with ErrTooLarge once more than limit bytes went
// through, and remembers the first error (its own or the writer's).
type cappedWriter struct {
	w       io.Writer
	limit   int64
	written int64
	err     error
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.written += int64(len(p)); c.written > c.limit {
		c.err = fmt.Errorf("%w: the archive exceeds %d bytes including tar headers", ErrTooLarge, c.limit)
		return 0, c.err
	}
	if _, err := c.w.Write(p); err != nil {
		c.err = fmt.Errorf("writing the download: %w", err)
		return 0, c.err
	}
	return len(p), nil
}
