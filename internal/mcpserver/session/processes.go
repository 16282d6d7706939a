package session

import (
	"context"
	"fmt"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Processes implements contract.ProcessBackend: authorised and looked up
// as an exec (starting, reading and killing a background process is
// running code in the sandbox), then handed to the driver.
func (m *Manager) Processes(ctx context.Context, caller contract.Caller, id string, call contract.ProcessCall) (execio.ProcessResponse, error) {
	pd, ok := m.d.(ProcessDriver)
	if !ok {
		return execio.ProcessResponse{}, fmt.Errorf("%w: this server's backend runs no background processes", contract.ErrInvalid)
	}
	if call.Action == execio.ProcessActionStart {
		req, err := call.Command.Normalize()
		if err != nil {
			return execio.ProcessResponse{}, err
		}
		call.Command = req
	}
	e, h, release, err := m.openRunning(ctx, caller, OpExec, id)
	if err != nil {
		return execio.ProcessResponse{}, err
	}
	defer release()
	resp, err := pd.Processes(ctx, h, call)
	if err == nil && call.Action == execio.ProcessActionStart && e != nil {
		m.mu.Lock()
		e.Background = true
		m.mu.Unlock()
	}
	m.done(e, err)
	return resp, err
}
