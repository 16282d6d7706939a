package kubebackend

import (
	"bytes"
)

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
