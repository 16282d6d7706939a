package session

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// OpPortForward is reaching a port in a sandbox (expose_port, previews).
const OpPortForward Op = "portforward"

// PortDialer is a Driver that reaches TCP ports inside its sandboxes.
type PortDialer interface {
	// DialPort connects to 127.0.0.1:port inside the sandbox.
	DialPort(ctx context.Context, h Handle, port int) (contract.PortConn, error)
}

// ExposureStore is a SharedDriver that keeps the exposure records of its
// sandboxes itself, where every server instance sees them (the kubernetes
// backend: an annotation on the Sandbox). A Stateless Manager has no
// entries to keep them in, and delegates all of expose_port's bookkeeping
// and the preview URLs' checks to it. now is the Manager's clock.
type ExposureStore interface {
	Expose(ctx context.Context, h Handle, port int, nonce string, expires, now time.Time) error
	Unexpose(ctx context.Context, h Handle, port int) (bool, error)
	// CheckExposed and DialExposed are the PortBackend's: x must be the
	// port's current exposure, of a live sandbox whose owner is x.Owner.
	CheckExposed(ctx context.Context, x contract.Exposure, now time.Time) error
	DialExposed(ctx context.Context, x contract.Exposure, now time.Time) (contract.PortConn, error)
}

// store is the driver's ExposureStore when this Manager keeps no entries.
func (m *Manager) store() (ExposureStore, bool) {
	s, ok := m.d.(ExposureStore)
	return s, ok && m.opts.Stateless
}

var _ contract.PortBackend = (*Manager)(nil)

// DialPort implements contract.PortBackend. The connection marks the
// sandbox busy while it is open, so a preview in use keeps its sandbox
// from being paused or reaped as idle.
func (m *Manager) DialPort(ctx context.Context, caller contract.Caller, id string, port int) (contract.PortConn, error) {
	pd, ok := m.d.(PortDialer)
	if !ok {
		return nil, fmt.Errorf("%w: this backend cannot reach ports in sandboxes", contract.ErrInvalid)
	}
	e, h, release, err := m.openRunning(ctx, caller, OpPortForward, id)
	if err != nil {
		return nil, err
	}
	conn, err := pd.DialPort(ctx, h, port)
	m.done(e, err)
	if err != nil {
		release()
		return nil, err
	}
	return &releasingConn{PortConn: conn, release: release}, nil
}

type releasingConn struct {
	contract.PortConn
	release func()
	once    sync.Once
}

func (c *releasingConn) Close() error {
	err := c.PortConn.Close()
	c.once.Do(c.release)
	return err
}

type exposure struct {
	nonce   string
	expires time.Time
}

// Expose implements contract.PortBackend. Exposures live in the entry, so
// the end of the sandbox (stop, reaping, Close) revokes them all. The
// Manager holds only the sandboxes of its own server instance, so with
// several instances (the kubernetes backend) a record here is seen by this
// instance only.
func (m *Manager) Expose(ctx context.Context, caller contract.Caller, id string, port int, nonce string, expires time.Time) error {
	e, h, err := m.open(ctx, caller, OpPortForward, id)
	if err != nil {
		return err
	}
	if s, ok := m.store(); ok && e == nil {
		return s.Expose(ctx, h, port, nonce, expires, m.opts.Clock())
	}
	if e == nil {
		return fmt.Errorf("%w: sandbox %q was made by another server instance; expose its port there", contract.ErrInvalid, id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.exposures == nil {
		e.exposures = map[int]exposure{}
	}
	e.exposures[port] = exposure{nonce: nonce, expires: expires}
	return nil
}

// Unexpose implements contract.PortBackend.
func (m *Manager) Unexpose(ctx context.Context, caller contract.Caller, id string, port int) (bool, error) {
	e, h, err := m.open(ctx, caller, OpPortForward, id)
	if s, ok := m.store(); ok && err == nil && e == nil {
		return s.Unexpose(ctx, h, port)
	}
	if err != nil || e == nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, had := e.exposures[port]
	delete(e.exposures, port)
	return had, nil
}

// DialExposed implements contract.PortBackend.
func (m *Manager) DialExposed(ctx context.Context, x contract.Exposure) (contract.PortConn, error) {
	if s, ok := m.store(); ok {
		return s.DialExposed(ctx, x, m.opts.Clock())
	}
	owner, err := m.exposedOwner(x)
	if err != nil {
		return nil, err
	}
	return m.DialPort(ctx, owner, x.ID, x.Port)
}

// CheckExposed implements contract.PortBackend.
func (m *Manager) CheckExposed(ctx context.Context, x contract.Exposure) error {
	if s, ok := m.store(); ok {
		return s.CheckExposed(ctx, x, m.opts.Clock())
	}
	_, err := m.exposedOwner(x)
	return err
}

// exposedOwner is the owner of x's sandbox when x is the port's current,
// unexpired exposure.
func (m *Manager) exposedOwner(x contract.Exposure) (contract.Caller, error) {
	m.mu.Lock()
	var owner *contract.Caller
	active := false
	for k, e := range m.entries {
		if k.id != x.ID || e.Removing || contract.IdentityHash(k.owner) != x.Owner {
			continue
		}
		c := e.owner
		owner = &c
		cur, ok := e.exposures[x.Port]
		active = ok && cur.nonce == x.Nonce && m.opts.Clock().Before(cur.expires)
		break
	}
	m.mu.Unlock()
	switch {
	case owner == nil:
		return contract.Caller{}, notFound(x.ID)
	case !active:
		return contract.Caller{}, fmt.Errorf("%w: port %d of sandbox %q", contract.ErrNotExposed, x.Port, x.ID)
	}
	return *owner, nil
}
