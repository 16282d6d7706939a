package kubebackend

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
)

// downloadFramingAllowance is the tar framing (headers, padding, long
// names) a download may carry on top of its content cap.
const downloadFramingAllowance int64 = 16 << 20

// forwardTar copies the node API's tar stream from r to w byte for byte
// while parsing it, counting entries and stopping with execio.ErrTooLarge
// once the declared content passes maxBytes. The node API caps transfers
// at its own, larger limit; this is the tool's cap.
func forwardTar(r io.Reader, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	var stats execio.TransferStats
	out := &cappedWriter{w: w, limit: maxBytes + downloadFramingAllowance}
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
			return stats, fmt.Errorf("reading the sandbox's archive: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			stats.Dirs++
		case tar.TypeReg:
			if h.Size > maxBytes-stats.Bytes {
				return stats, fmt.Errorf("%w: %q (%d bytes) takes the download past its %d-byte limit", execio.ErrTooLarge, h.Name, h.Size, maxBytes)
			}
			stats.Files++
			stats.Bytes += h.Size
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			if out.err != nil {
				return stats, out.err
			}
			return stats, fmt.Errorf("reading %q from the sandbox's archive: %w", h.Name, err)
		}
	}
	// The end-of-archive padding belongs to the stream too.
	if _, err := io.Copy(out, r); err != nil {
		return stats, err
	}
	return stats, out.err
}

// cappedWriter fails with ErrTooLarge past limit bytes and remembers the
// first error, its own or the writer's.
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
		c.err = fmt.Errorf("%w: the archive exceeds %d bytes including tar headers", execio.ErrTooLarge, c.limit)
		return 0, c.err
	}
	if _, err := c.w.Write(p); err != nil {
		c.err = fmt.Errorf("writing the download: %w", err)
		return 0, c.err
	}
	return len(p), nil
}

// outputWriter adapts an OutputFunc to the io.Writer the client streams an
// exec's output to.
type outputWriter struct {
	stream string
	out    mcpserver.OutputFunc
}

func (w outputWriter) Write(p []byte) (int, error) {
	if w.out != nil {
		w.out(w.stream, p)
	}
	return len(p), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf     bytes.Buffer
	max     int
	dropped bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		rest := append([]byte(nil), t.buf.Bytes()[over:]...)
		t.buf.Reset()
		t.buf.Write(rest)
		t.dropped = true
	}
	return len(p), nil
}
