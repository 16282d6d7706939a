package session

import (
	"context"
	"fmt"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// OpMetrics is reading a sandbox's resource use (sandbox_metrics).
const OpMetrics Op = "metrics"

// MetricsReader is a Driver that reads its sandboxes' resource use without
// waking a paused one.
type MetricsReader interface {
	Metrics(ctx context.Context, h Handle) (contract.Metrics, error)
}

var _ contract.MetricsBackend = (*Manager)(nil)

// Metrics implements contract.MetricsBackend. Unlike every other operation
// it does not count as use (LastUsedAt stays): a client that polls metrics
// must not keep an idle sandbox from being paused or reaped, and it never
// resumes a paused one.
func (m *Manager) Metrics(ctx context.Context, caller contract.Caller, id string) (contract.Metrics, error) {
	mr, ok := m.d.(MetricsReader)
	if !ok {
		return contract.Metrics{}, fmt.Errorf("%w: this backend cannot read sandbox metrics", contract.ErrInvalid)
	}
	if err := m.authorize(ctx, caller, OpMetrics, id); err != nil {
		return contract.Metrics{}, err
	}
	m.mu.Lock()
	e, ok := m.entries[key{caller.ID, id}]
	var h Handle
	switch {
	case ok && e.Removing:
		m.mu.Unlock()
		return contract.Metrics{}, notFound(id)
	case ok:
		h = e.handle()
		h.Caller = caller
	case m.shared != nil:
		e, h = nil, Handle{ID: id, Caller: caller}
	default:
		m.mu.Unlock()
		return contract.Metrics{}, notFound(id)
	}
	m.mu.Unlock()
	met, err := mr.Metrics(ctx, h)
	m.done(e, err)
	if err != nil {
		return contract.Metrics{}, err
	}
	met.ContainerID = id
	return met, nil
}
