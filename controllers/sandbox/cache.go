/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// CacheOptions is the node manager's cache: it keeps the full object only
// for its own node's Sandboxes.
//
// Every manager watches every Sandbox, because it must see unbound ones to
// claim them. A Sandbox's command and env (up to 64 KiB each), and the
// command of the template a claim recorded, are needed only by the node that runs it, so
// for a Sandbox bound elsewhere or not bound yet they are dropped before the
// object enters the cache (managedFields too, for every object); once a
// claim binds one to this node, Reconcile reads them from the API server
// (fillStripped; the claim's own status write also returns the whole
// object), and every later watch event carries the whole object.
// Without this, one namespace editor's big Sandboxes cost memory in every
// manager of the fleet.
func CacheOptions(node string) cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&sandboxv1alpha1.Sandbox{}: {Transform: StripForeign(node)},
		},
	}
}

// StripForeign is the Sandbox cache transform of CacheOptions. With node
// empty it strips every Sandbox: the control-plane role (quota and pool
// controllers, aggregated API) never reads a command or env.
func StripForeign(node string) toolscache.TransformFunc {
	strip := cache.TransformStripManagedFields()
	return func(obj any) (any, error) {
		obj, err := strip(obj)
		if err != nil {
			return obj, err
		}
		sbx, ok := obj.(*sandboxv1alpha1.Sandbox)
		if !ok || (node != "" && sbx.Status.NodeName == node) {
			return obj, nil
		}
		sbx.Spec.Command = nil
		sbx.Spec.Env = nil
		// The recorded template's shape (resources) may still be
		// counted; only its command is big.
		if wp := sbx.Status.WarmPool; wp != nil && wp.Template != nil {
			wp.Template.Command = nil
		}
		return sbx, nil
	}
}

// fillStripped gives sbx, just claimed for this node from a cache that
// stripped it (StripForeign), its command and env from the API server.
// Both are immutable, so the values read now are the ones it was created
// with.
func (r *SandboxReconciler) fillStripped(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) error {
	fresh := &sandboxv1alpha1.Sandbox{}
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(sbx), fresh); err != nil {
		return fmt.Errorf("reading the claimed Sandbox: %w", err)
	}
	if fresh.UID != sbx.UID {
		return fmt.Errorf("the claimed Sandbox %s was replaced (uid %s, now %s)", sbx.Name, sbx.UID, fresh.UID)
	}
	sbx.Spec.Command = fresh.Spec.Command
	sbx.Spec.Env = fresh.Spec.Env
	return nil
}
