package execio

import (
	"archive/tar"
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
func ForwardTar(r io.Reader, w io.Writer, maxBytes int64) (TransferStats, error) {
	var stats TransferStats
	out := &cappedWriter{w: w, limit: maxBytes + DownloadFramingAllowance}
	tr := tar.NewReader(io.TeeReader(r, out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if out.err != nil {
			return stats, out.err
		}
		if err != nil {
			return stats, fmt.Errorf("reading the archive: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			stats.Dirs++
		case tar.TypeReg:
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
			return stats, fmt.Errorf("reading %q from the archive: %w", h.Name, err)
		}
	}
	// Whatever follows the end-of-archive marker belongs to the stream too.
	if _, err := io.Copy(out, r); err != nil {
		return stats, err
	}
	return stats, out.err
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
