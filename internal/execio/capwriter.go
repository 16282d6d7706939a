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

// TailBuffer keeps the last max bytes written to it, in a ring that grows
// up to max on demand and is never reallocated after that, and counts what
// it drops. It is the one tail buffer of the module: container logs and
// sandbox_exec's inline output both use it. It is not safe for concurrent
// use.
type TailBuffer struct {
	max     int
	buf     []byte // the kept bytes; a ring starting at start once len == max
	start   int
	written int64
}

// NewTailBuffer keeps the last max bytes (none when max ≤ 0).
func NewTailBuffer(max int) *TailBuffer { return &TailBuffer{max: max} }

// Write never fails.
func (t *TailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	t.written += int64(n)
	if t.max <= 0 || n == 0 {
		return n, nil
	}
	if n >= t.max {
		// p alone fills the buffer.
		t.grow(t.max)
		t.buf = append(t.buf[:0], p[n-t.max:]...)
		t.start = 0
		return n, nil
	}
	if len(t.buf) < t.max {
		take := min(t.max-len(t.buf), len(p))
		t.grow(len(t.buf) + take)
		t.buf = append(t.buf, p[:take]...)
		p = p[take:]
	}
	for len(p) > 0 {
		c := copy(t.buf[t.start:], p)
		p = p[c:]
		t.start = (t.start + c) % t.max
	}
	return n, nil
}

// grow makes room for n bytes without ever allocating more than max.
func (t *TailBuffer) grow(n int) {
	if n <= cap(t.buf) {
		return
	}
	c := min(max(2*cap(t.buf), n, 4<<10), t.max)
	nb := make([]byte, len(t.buf), c)
	copy(nb, t.buf)
	t.buf = nb
}

// Bytes returns a copy of the kept bytes, oldest first.
func (t *TailBuffer) Bytes() []byte {
	out := make([]byte, 0, len(t.buf))
	out = append(out, t.buf[t.start:]...)
	return append(out, t.buf[:t.start]...)
}

// String is Bytes as a string.
func (t *TailBuffer) String() string { return string(t.Bytes()) }

// Len is how many bytes are kept.
func (t *TailBuffer) Len() int { return len(t.buf) }

// Written counts every byte written, kept or not.
func (t *TailBuffer) Written() int64 { return t.written }

// Dropped counts the bytes written but no longer kept.
func (t *TailBuffer) Dropped() int64 { return t.written - int64(len(t.buf)) }

// Truncated reports whether anything was dropped.
func (t *TailBuffer) Truncated() bool { return t.Dropped() > 0 }

// TailMarker is the line put before the kept end of a stream whose first
// dropped bytes are not shown.
func TailMarker(stream string, dropped int64) string {
	return fmt.Sprintf("[code-sandbox: %s: the first %s not shown; the last part follows]\n", stream, formatSize(dropped))
}
