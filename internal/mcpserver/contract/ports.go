package contract

import (
	"context"
	"errors"
	"io"
	"time"
)

// PortConn is a byte stream to a TCP port inside a sandbox; CloseWrite
// passes the end of what the caller sends on to the sandbox's server.
type PortConn interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// ErrPortClosed: nothing listens on the port inside the sandbox.
var ErrPortClosed = errors.New("port not listening")

// PortBackend is a Backend that reaches TCP ports inside its sandboxes
// (expose_port and its preview URLs).
type PortBackend interface {
	// DialPort connects to 127.0.0.1:port inside one of the caller's
	// sandboxes.
	DialPort(ctx context.Context, caller Caller, id string, port int) (PortConn, error)
	// Expose records that the caller's sandbox's port is exposed under
	// nonce until expires, replacing an earlier exposure of the port.
	Expose(ctx context.Context, caller Caller, id string, port int, nonce string, expires time.Time) error
	// Unexpose revokes the port's exposure; false when there was none.
	Unexpose(ctx context.Context, caller Caller, id string, port int) (bool, error)
	// DialExposed connects to an exposed port for a preview URL, acting
	// for the sandbox's owner: x must name the port's current, unexpired
	// exposure (else ErrNotExposed), of a sandbox that still exists and
	// whose owner's IdentityHash is x.Owner (else ErrNotFound).
	DialExposed(ctx context.Context, x Exposure) (PortConn, error)
	// CheckExposed is DialExposed's check alone, for a request that
	// reuses a connection DialExposed made.
	CheckExposed(ctx context.Context, x Exposure) error
}

// Exposure names one exposure of a port, as a preview URL carries it.
type Exposure struct {
	// Owner is the IdentityHash of the sandbox's owner.
	Owner string
	ID    string
	Port  int
	Nonce string
}

// ErrNotExposed: the port is not exposed under this URL any more (revoked
// by unexpose_port, replaced by a later expose_port, or expired).
var ErrNotExposed = errors.New("preview revoked or expired")
