package dockerruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// A new connection to a port in a sandbox used to cost a Docker exec of
// `helper dial` (about 50 ms, the same as a command's first exec). When
// the sandbox has an idle resident helper (standby.go), the connection
// takes that helper instead: one request frame and its answer, and the
// helper relays the connection over its serve frames (helperproto's
// DialPort) for as long as it lasts, then exits. A helper that held a
// connection never runs a command again (nothing of the connection can be
// left in it for the next), so the container's next idle helper is started
// at once, in the background, off the caller's path; a connection that
// comes before it is up waits for it (less than the exec of another). With
// no idle helper and none starting (several connections at once, a helper
// without DialPort) the connection takes the exec path as before.

// dialViaStandby connects through the container's idle helper. handled is
// false when there was none, or it could not take the connection for a
// reason the exec path may not share (a helper older than DialPort): the
// caller then dials with an exec.
func (c *Client) dialViaStandby(ctx context.Context, id string, port int) (conn PortConn, handled bool, err error) {
	s := c.takeStandby(id)
	if s == nil {
		// The helper started after the last connection may be on its way:
		// waiting for it costs less than the exec of a new one.
		c.awaitPrestart(ctx, id)
		if s = c.takeStandby(id); s == nil {
			return nil, false, nil
		}
	}
	// The helper is the connection's now: start the container's next idle
	// one.
	defer c.prestartHelper(id)
	payload, err := json.Marshal(helperproto.ServeRequest{ID: "dial-" + strconv.Itoa(port), DialPort: port})
	if err != nil {
		s.close()
		return nil, false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, dialHandshakeTimeout)
	err = s.request(rctx, payload)
	cancel()
	if err == nil {
		return &serveConn{s: s}, true, nil
	}
	s.close()
	var he *helperproto.Error
	switch {
	case errors.As(err, &he) && he.Kind == helperproto.KindPortClosed:
		return nil, true, fmt.Errorf("%w: %s", ErrPortClosed, he.Message)
	case ctx.Err() != nil:
		return nil, true, fmt.Errorf("connecting to port %d in sandbox %s: %w", port, ShortID(id), ctx.Err())
	}
	// Refused otherwise (an older helper does not know DialPort), or the
	// helper ended: the exec path gives the authoritative answer.
	return nil, false, nil
}

// serveConn is a connection relayed by a resident helper: its FrameStdout
// frames are the port's bytes, FrameCloseWrite or FrameExit its end. The
// frames are hostile input: anything else ends the connection.
type serveConn struct {
	s *serveExec
	// cur is the frame pending is read from, released once used.
	cur     serveFrame
	hasCur  bool
	pending []byte
	eof     bool
	readErr error
	// writeMu keeps a CloseWrite after the writes in flight.
	writeMu sync.Mutex
}

func (p *serveConn) Read(b []byte) (int, error) {
	for len(p.pending) == 0 {
		if p.hasCur {
			p.cur.release()
			p.hasCur = false
		}
		switch {
		case p.readErr != nil:
			return 0, p.readErr
		case p.eof:
			return 0, io.EOF
		}
		f, ok := <-p.s.frames
		switch {
		case !ok:
			// The helper's stream ended without the connection's end: the
			// helper (or its sandbox) went away, or Close was called.
			p.readErr = io.ErrUnexpectedEOF
			if p.s.streamErr != nil {
				p.readErr = fmt.Errorf("the sandbox helper's connection stream: %w", p.s.streamErr)
			}
		case f.kind == helperproto.FrameStdout:
			p.cur, p.hasCur, p.pending = f, true, f.payload
		case f.kind == helperproto.FrameCloseWrite || f.kind == helperproto.FrameExit:
			f.release()
			p.eof = true
		default:
			f.release()
			p.readErr = fmt.Errorf("the sandbox helper sent a %q frame on a connection", f.kind)
			p.s.close()
		}
	}
	n := copy(b, p.pending)
	p.pending = p.pending[n:]
	return n, nil
}

// maxDataFrame bounds a FrameData, as the helper's own output frames are.
const maxDataFrame = helperproto.MaxOutputFrame

func (p *serveConn) Write(b []byte) (int, error) {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	for done := 0; done < len(b); {
		n := min(len(b)-done, maxDataFrame)
		if err := p.s.send(helperproto.FrameData, b[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return len(b), nil
}

func (p *serveConn) CloseWrite() error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	return p.s.send(helperproto.FrameCloseWrite, nil)
}

// Close ends the connection: the helper's stdin ends, and it closes the
// connection in the sandbox and exits.
func (p *serveConn) Close() error {
	p.s.close()
	return nil
}
