package dockerruntime

import (
	"time"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// A Docker exec costs tens of milliseconds before the command's first
// instruction (the daemon, containerd and runc set up a process in the
// container): more than everything else a command through the node API
// costs. So commands run through a resident `helper serve` (helperproto's
// serve protocol): one exec that stays, takes a command on its stdin and
// forks `helper run` for it in the sandbox. After a command its helper goes
// back to the sandbox's idle slot for the next one. Each sandbox that has
// run a command keeps at most one idle helper: a process of a few MiB,
// charged to the sandbox like any of its processes, that exits when the
// manager closes it or goes away (its stdin ends). Concurrent commands each
// get their own, and all but one exit afterwards.

// serveCommand starts a resident helper. A variable so that a test can ask
// the real helper for a subcommand it lacks, as a helper older than `serve`
// would be asked for `serve`.
var serveCommand = []string{HelperPath, "serve"}

// errHelperWithoutServe marks a sandbox whose helper predates `serve` (its
// tools volume is from an older manager); its commands take the exec per
// command path.
var errHelperWithoutServe = errors.New("the sandbox's helper has no serve subcommand")

// errNotAccepted is a helper that ended before it took the request: the
// command did not start, so another helper may run it.
var errNotAccepted = errors.New("the sandbox helper ended before taking the command")

// serveFrame is a frame from a helper. Its payload is borrowed from
// framePool; the receiver gives it back with release once used.
type serveFrame struct {
	kind    byte
	payload []byte
	buf     *[]byte
}

func (f serveFrame) release() { framePool.Put(f.buf) }

// framePool keeps output frames from turning a flood into garbage.
var framePool = sync.Pool{New: func() any {
	b := make([]byte, helperproto.MaxOutputFrame)
	return &b
}}

// serveExec is one `helper serve` exec: its frames in order, and its stdin.
type serveExec struct {
	container string
	execID    string
	attach    types.HijackedResponse
	// frames is closed when the stream ends; streamErr says why when that
	// was not the helper ending it.
	frames    chan serveFrame
	streamErr error
	// ended is closed with frames, for a watcher that must not take them.
	ended     chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	writeMu   sync.Mutex
	stderr    lockedBuffer
	// writeTimeout bounds one frame write (a Docker call's timeout): a
	// helper that stops reading (SIGSTOPped from inside the sandbox) must
	// not pin a frame, up to 16 MiB of stdin, for the command's timeout.
	writeTimeout time.Duration
}

// startServe execs a helper and waits until it is ready for a request, for
// as long as ctx allows (the caller bounds it).
func (c *Client) startServe(ctx context.Context, id string) (*serveExec, error) {
	execID, attach, err := c.startExec(ctx, id, ExecOptions{Cmd: serveCommand, openStdin: true})
	if err != nil {
		return nil, err
	}
	s := &serveExec{
		container:    id,
		execID:       execID,
		attach:       attach,
		frames:       make(chan serveFrame),
		ended:        make(chan struct{}),
		closing:      make(chan struct{}),
		stderr:       lockedBuffer{b: boundedBuffer{max: helperStderrMax}},
		writeTimeout: c.callTimeout,
	}
	go s.read()
	go c.forgetWhenGone(id, s)
	select {
	case f, ok := <-s.frames:
		if ok {
			if f.kind == helperproto.FrameReady {
				c.noteFeatures(id, helperproto.ParseReady(f.payload))
			}
			f.release()
		}
		if ok && f.kind == helperproto.FrameReady {
			return s, nil
		}
		s.close()
		if ok {
			return nil, fmt.Errorf("the sandbox helper in %s sent a %q frame before it was ready", ShortID(id), f.kind)
		}
		if s.streamErr != nil {
			return nil, fmt.Errorf("starting the sandbox helper in %s: %w", ShortID(id), s.streamErr)
		}
		code, err := c.execExitCode(context.WithoutCancel(ctx), execID)
		if err != nil {
			return nil, err
		}
		if code == helperproto.ExitUsage {
			return nil, errHelperWithoutServe
		}
		return nil, helperFailure("starting the sandbox helper in "+ShortID(id), code, s.stderr.Bytes())
	case <-ctx.Done():
		s.close()
		return nil, classify(ctx.Err(), "waiting for the sandbox helper in "+ShortID(id))
	}
}

// read turns the exec's stream into frames. Nothing from the helper is
// trusted: a frame over helperproto.MaxOutputFrame ends the stream.
func (s *serveExec) read() {
	defer close(s.ended)
	defer close(s.frames)
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, &s.stderr, s.attach.Reader)
		pw.CloseWithError(err)
	}()
	for {
		buf := framePool.Get().(*[]byte)
		kind, payload, err := helperproto.ReadFrameInto(pr, *buf)
		if err != nil {
			framePool.Put(buf)
			if !errors.Is(err, io.EOF) {
				s.streamErr = err
				s.close()
			}
			pr.CloseWithError(err)
			return
		}
		select {
		case s.frames <- serveFrame{kind, payload, buf}:
		case <-s.closing:
			framePool.Put(buf)
			pr.CloseWithError(io.ErrClosedPipe)
			return
		}
	}
}

// send writes one frame to the helper's stdin.
func (s *serveExec) send(kind byte, payload []byte) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.writeTimeout > 0 {
		// A hijacked Docker connection is a net.Conn; one that cannot take
		// a deadline is still bounded by the caller's context (request).
		if s.attach.Conn.SetWriteDeadline(time.Now().Add(s.writeTimeout)) == nil {
			defer s.attach.Conn.SetWriteDeadline(time.Time{}) //nolint:errcheck // best effort
		}
	}
	// The header and the payload go out as they are (writev), not copied
	// into one more buffer of the payload's size (up to 16 MiB of stdin).
	// Same layout as helperproto.AppendFrame: kind, big-endian length.
	frame := net.Buffers{binary.BigEndian.AppendUint32([]byte{kind}, uint32(len(payload))), payload}
	_, err := frame.WriteTo(s.attach.Conn)
	return err
}

// request hands the helper its command and waits until it takes it.
func (s *serveExec) request(ctx context.Context, payload []byte) error {
	// A helper that stops reading (its container frozen, say) must not
	// hold the caller past ctx.
	stop := context.AfterFunc(ctx, s.close)
	defer stop()
	if err := s.send(helperproto.FrameRequest, payload); err != nil {
		if ctx.Err() != nil {
			return classify(ctx.Err(), "handing the command to the sandbox helper in "+ShortID(s.container))
		}
		return fmt.Errorf("%w: %v", errNotAccepted, err)
	}
	f, ok := <-s.frames
	if ok {
		defer f.release()
	}
	switch {
	case ctx.Err() != nil:
		return classify(ctx.Err(), "handing the command to the sandbox helper in "+ShortID(s.container))
	case !ok:
		return errNotAccepted
	case f.kind == helperproto.FrameAccepted:
		return nil
	case f.kind == helperproto.FrameStderr:
		if he, ok := helperproto.ParseError(f.payload); ok {
			return fmt.Errorf("the sandbox helper in %s refused the command: %w", ShortID(s.container), he)
		}
	}
	return fmt.Errorf("the sandbox helper in %s answered the command with a %q frame", ShortID(s.container), f.kind)
}

func (s *serveExec) close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.attach.Close()
	})
}

// standbys holds at most one idle helper per container.
type standbys struct {
	mu     sync.Mutex
	idle   map[string]*serveExec
	closed bool
	// legacy are containers whose helper predates serve.
	legacy map[string]bool
	// starting are the helper starts prestartHelper began, closed when
	// each ends (prestart.go).
	starting map[string]chan struct{}
	// features are what each container's helper said it can do in its
	// ready frame (one binary per container: its tools volume), known once
	// a helper of this client started there (transfer_serve.go).
	features map[string]helperproto.Ready
}

// takeStandby returns the container's idle helper, or nil.
func (c *Client) takeStandby(id string) *serveExec {
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	s := c.standby.idle[id]
	delete(c.standby.idle, id)
	return s
}

// park keeps a helper whose command ended cleanly as the container's idle
// one, or closes it when the container has one already, or has been
// removed, or the helper's stream has ended.
func (c *Client) park(id string, s *serveExec) {
	c.standby.mu.Lock()
	keep := !c.standby.closed && c.standby.idle[id] == nil && !s.gone()
	if keep {
		if c.standby.idle == nil {
			c.standby.idle = map[string]*serveExec{}
		}
		c.standby.idle[id] = s
	}
	c.standby.mu.Unlock()
	if !keep {
		s.close()
	}
}

func (s *serveExec) gone() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

// forgetWhenGone drops a helper whose stream ended while it was idle: its
// container stopped or was removed, or something in the sandbox killed it.
func (c *Client) forgetWhenGone(id string, s *serveExec) {
	<-s.ended
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	if c.standby.idle[id] == s {
		delete(c.standby.idle, id)
	}
}

// dropStandby closes the container's idle helper (it is being removed).
func (c *Client) dropStandby(id string) {
	c.standby.mu.Lock()
	s := c.standby.idle[id]
	delete(c.standby.idle, id)
	delete(c.standby.legacy, id)
	delete(c.standby.features, id)
	c.standby.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// closeStandbys closes every idle helper (the client is closing).
func (c *Client) closeStandbys() {
	c.standby.mu.Lock()
	idle := c.standby.idle
	c.standby.idle = nil
	c.standby.closed = true
	c.standby.mu.Unlock()
	for _, s := range idle {
		s.close()
	}
}

// markLegacy records a container whose helper has no serve.
func (c *Client) markLegacy(id string) {
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	if c.standby.legacy == nil {
		c.standby.legacy = map[string]bool{}
	}
	c.standby.legacy[id] = true
}

func (c *Client) isLegacy(id string) bool {
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	return c.standby.legacy[id]
}

// lockedBuffer is a boundedBuffer written by one goroutine and read by
// another.
type lockedBuffer struct {
	mu sync.Mutex
	b  boundedBuffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.b.buf.Bytes()...)
}
