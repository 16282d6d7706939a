/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

var _ session.Pauser = (*driver)(nil)

// Pause implements session.Pauser: it sets spec.paused, and the node's
// manager freezes the container. It does not wait for that: the next use
// resumes the Sandbox whatever state it reached.
func (b *driver) Pause(ctx context.Context, h session.Handle) error {
	sbx, err := b.lookup(ctx, h)
	if err != nil {
		return err
	}
	return b.setPaused(ctx, sbx, true)
}

// Resume implements session.Pauser: it clears spec.paused and waits until
// the manager reports the Sandbox Ready again.
func (b *driver) Resume(ctx context.Context, h session.Handle) error {
	sbx, err := b.lookup(ctx, h)
	if err != nil {
		return err
	}
	_, err = b.running(ctx, sbx)
	return err
}

// running returns sbx ready for commands: a paused Sandbox (by --idle-pause,
// or by anyone who may update it) is resumed first, and the call waits for
// the manager to thaw it.
func (b *driver) running(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (*sandboxv1alpha1.Sandbox, error) {
	if !sbx.Spec.Paused {
		return sbx, nil
	}
	if err := b.setPaused(ctx, sbx, false); err != nil {
		return nil, err
	}
	b.log.Info("resuming a paused sandbox", "sandbox", sbx.Name)
	return b.waitReady(ctx, sbx)
}

// setPaused patches spec.paused alone (a merge patch: nothing else of the
// spec is sent, so the CRD's immutability rules see no other change).
func (b *driver) setPaused(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, paused bool) error {
	patch := client.RawPatch(client.Merge.Type(), fmt.Appendf(nil, `{"spec":{"paused":%t}}`, paused))
	if err := b.kube.Patch(ctx, sbx, patch); err != nil {
		return apiError(fmt.Sprintf("setting spec.paused=%t on sandbox %s", paused, sbx.Name), err)
	}
	return nil
}
