/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerbackend

import (
	"context"
	"errors"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

var _ session.Pauser = (*driver)(nil)

// Pause implements session.Pauser: the container is frozen with the cgroup
// freezer, so it uses no CPU and keeps its memory, files and processes.
func (b *driver) Pause(ctx context.Context, h session.Handle) error {
	return b.freeze(ctx, h, b.docker.Pause)
}

// Resume implements session.Pauser.
func (b *driver) Resume(ctx context.Context, h session.Handle) error {
	return b.freeze(ctx, h, b.docker.Unpause)
}

func (b *driver) freeze(ctx context.Context, h session.Handle, op func(context.Context, string) error) error {
	if err := b.thawed(ctx, h); err != nil {
		return err
	}
	err := op(ctx, h.Ref)
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forgetHistory(h.ID)
		return session.Gone(mapErr(err))
	}
	return mapErr(err)
}
