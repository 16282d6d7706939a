package dockerbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

var _ session.PortDialer = (*driver)(nil)

// DialPort implements session.PortDialer through the sandbox's helper
// (dockerruntime.DialPort), so it needs no network of the sandbox's.
func (b *driver) DialPort(ctx context.Context, h session.Handle, port int) (contract.PortConn, error) {
	if err := b.thawed(ctx, h); err != nil {
		return nil, err
	}
	conn, err := b.docker.DialPort(ctx, h.Ref, port)
	switch {
	case err == nil:
		return conn, nil
	case errors.Is(err, dockerruntime.ErrPortClosed):
		return nil, fmt.Errorf("%w: %s", contract.ErrPortClosed, strings.TrimPrefix(err.Error(), dockerruntime.ErrPortClosed.Error()+": "))
	case errors.Is(err, dockerruntime.ErrInvalidPort):
		return nil, fmt.Errorf("%w: %v", contract.ErrInvalid, err)
	case errors.Is(err, dockerruntime.ErrNotFound):
		return nil, session.Gone(mapErr(err))
	}
	return nil, mapErr(err)
}
