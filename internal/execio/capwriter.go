package execio

import (
	"fmt"
	"io"
)

// CapWriter passes bytes through to an underlying writer until a limit, then
// writes a truncation marker once and discards (but still counts) the rest.
// It never buffers: each Write forwards at most a prefix of its own slice.
// It is not safe for concurrent use.
type CapWriter struct {
	w         io.Writer
	limit     int64
	stream    string
	written   int64
	truncated bool
	err       error
}

// NewCapWriter caps w at limit bytes; stream ("stdout", "stderr") names the
// stream in the marker.
func NewCapWriter(w io.Writer, limit int64, stream string) *CapWriter {
	return &CapWriter{w: w, limit: limit, stream: stream}
}

// Write always reports len(p) written unless the underlying writer failed,
// so a producer is drained rather than blocked once the cap is reached.
func (c *CapWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	before := c.written
	c.written += int64(len(p))
	if c.truncated {
		return len(p), nil
	}
	room := c.limit - before
	if int64(len(p)) <= room {
		if _, err := c.w.Write(p); err != nil {
			c.err = fmt.Errorf("writing %s: %w", c.stream, err)
			return 0, c.err
		}
		return len(p), nil
	}
	c.truncated = true
	if room > 0 {
		if _, err := c.w.Write(p[:room]); err != nil {
			c.err = fmt.Errorf("writing %s: %w", c.stream, err)
			return 0, c.err
		}
	}
	if _, err := io.WriteString(c.w, TruncationMarker(c.stream, c.limit)); err != nil {
		c.err = fmt.Errorf("writing %s: %w", c.stream, err)
		return 0, c.err
	}
	return len(p), nil
}

// Written counts every byte offered, including discarded ones.
func (c *CapWriter) Written() int64 { return c.written }

// Truncated reports whether the limit was exceeded.
func (c *CapWriter) Truncated() bool { return c.truncated }

// TruncationMarker is the line a CapWriter writes where it cuts a stream.
func TruncationMarker(stream string, limit int64) string {
	return fmt.Sprintf("\n[code-sandbox: %s truncated after %s]\n", stream, formatSize(limit))
}

func formatSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
}
