package dockerruntime

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/docker/docker/api/types"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// ErrPortClosed: nothing listens on the port inside the sandbox.
var ErrPortClosed = errors.New("port not listening")

// ErrInvalidPort: a port outside 1-65535.
var ErrInvalidPort = errors.New("invalid port")

// dialHandshakeTimeout bounds the wait for the helper's verdict (connected
// or refused); the helper's own connect timeout is shorter.
const dialHandshakeTimeout = 15 * time.Second

// PortConn is a byte stream to a TCP port inside a sandbox. CloseWrite
// passes the end of what the caller sends on to the sandbox's server.
type PortConn interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// CheckPort is the one bound on ports: 1-65535.
func CheckPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("%w: port %d is not in 1-65535", ErrInvalidPort, port)
	}
	return nil
}

// DialPort connects to 127.0.0.1:port inside the sandbox container id,
// through `helper dial` run with a Docker exec: the helper is in the
// sandbox's network namespace, so this needs no network of the sandbox's
// (it works with network None) and publishes nothing on the host. A
// connection takes the sandbox's idle resident helper when there is one
// (portdial_serve.go), else it costs one exec. A port with nothing listening is
// ErrPortClosed, with a message naming the port.
func (c *Client) DialPort(ctx context.Context, id string, port int) (PortConn, error) {
	if err := CheckPort(port); err != nil {
		return nil, err
	}
	if err := c.awaitThaw(ctx, id); err != nil {
		return nil, err
	}
	if conn, handled, err := c.dialViaStandby(ctx, id, port); handled {
		return conn, err
	}
	_, attach, err := c.startExec(ctx, id, ExecOptions{
		Cmd:       []string{HelperPath, "dial", "--port=" + strconv.Itoa(port)},
		openStdin: true,
	})
	if err != nil {
		return nil, err
	}
	pc := &portConn{attach: attach}
	stop := context.AfterFunc(ctx, func() { attach.Close() })
	timer := time.AfterFunc(dialHandshakeTimeout, func() { attach.Close() })
	err = pc.handshake()
	timer.Stop()
	if !stop() || err != nil {
		attach.Close()
		where := fmt.Sprintf("connecting to port %d in sandbox %s", port, ShortID(id))
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", where, ctx.Err())
		}
		var he *helperproto.Error
		if errors.As(err, &he) && he.Kind == helperproto.KindPortClosed {
			return nil, fmt.Errorf("%w: %s", ErrPortClosed, he.Message)
		}
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return pc, nil
}

// portConn demultiplexes the exec's stream (Docker's 8-byte frame headers,
// no TTY): stdout frames are the port's bytes; stderr carries the helper's
// verdict before any of them.
type portConn struct {
	attach types.HijackedResponse
	// pending is what is left of the current stdout frame.
	pending int
	stderr  bytes.Buffer
	closeMu sync.Once
}

// handshake reads frames until the helper says connected (nil) or the
// stream ends (its error line, or a generic failure).
func (p *portConn) handshake() error {
	for {
		stream, size, err := p.header()
		if err != nil {
			if he, ok := helperproto.ParseError(p.stderr.Bytes()); ok {
				return he
			}
			text := bytes.TrimSpace(p.stderr.Bytes())
			if len(text) == 0 {
				return fmt.Errorf("the sandbox helper ended without connecting (%v); a sandbox created before the helper could dial must be recreated", err)
			}
			return fmt.Errorf("the sandbox helper ended without connecting: %s", text)
		}
		if stream == 1 {
			// Bytes before the verdict: the helper never does this.
			return errors.New("the sandbox helper relayed bytes before connecting")
		}
		if p.stderr.Len()+size > 64<<10 {
			return errors.New("the sandbox helper wrote too much on stderr")
		}
		if _, err := io.CopyN(&p.stderr, p.attach.Reader, int64(size)); err != nil {
			return fmt.Errorf("reading the sandbox helper's stderr: %w", err)
		}
		if bytes.Contains(p.stderr.Bytes(), []byte(helperproto.DialConnected)) {
			p.stderr.Reset()
			return nil
		}
	}
}

func (p *portConn) header() (stream byte, size int, err error) {
	var h [8]byte
	if _, err := io.ReadFull(p.attach.Reader, h[:]); err != nil {
		return 0, 0, err
	}
	return h[0], int(binary.BigEndian.Uint32(h[4:])), nil
}

func (p *portConn) Read(b []byte) (int, error) {
	for p.pending == 0 {
		stream, size, err := p.header()
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				return 0, io.EOF
			}
			return 0, err
		}
		if stream != 1 {
			// The helper's stderr after connecting (an error at the end):
			// not the port's bytes.
			if _, err := io.CopyN(io.Discard, p.attach.Reader, int64(size)); err != nil {
				return 0, io.EOF
			}
			continue
		}
		p.pending = size
	}
	n, err := p.attach.Reader.Read(b[:min(len(b), p.pending)])
	p.pending -= n
	if err == io.EOF && p.pending > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (p *portConn) Write(b []byte) (int, error) { return p.attach.Conn.Write(b) }

func (p *portConn) CloseWrite() error { return p.attach.CloseWrite() }

func (p *portConn) Close() error {
	p.closeMu.Do(p.attach.Close)
	return nil
}
