/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// removeOrphans deletes the members of a pool named name whose pool is
// gone. Garbage collection does the same through the ownerReference; this
// covers clusters where it lags or does not run.
func (r *Reconciler) removeOrphans(ctx context.Context, namespace, name string, liveUID types.UID) error {
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.InNamespace(namespace),
		client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: name}); err != nil {
		return fmt.Errorf("listing the members of SandboxWarmPool %s/%s: %w", namespace, name, err)
	}
	return r.deleteOrphans(ctx, orphans(list.Items, name, liveUID))
}

// orphans are the Sandboxes controlled by a SandboxWarmPool called name
// other than the one with liveUID.
func orphans(sandboxes []sandboxv1alpha1.Sandbox, name string, liveUID types.UID) []*sandboxv1alpha1.Sandbox {
	var out []*sandboxv1alpha1.Sandbox
	for i := range sandboxes {
		sbx := &sandboxes[i]
		if warmpool.PoolOf(sbx) != name || !sbx.DeletionTimestamp.IsZero() {
			continue
		}
		if ref := metav1.GetControllerOfNoCopy(sbx); ref.UID != liveUID {
			out = append(out, sbx)
		}
	}
	return out
}

// deleteOrphans deletes candidates whose pool the API server confirms is
// gone: the cache may not have seen a pool that was just created.
func (r *Reconciler) deleteOrphans(ctx context.Context, candidates []*sandboxv1alpha1.Sandbox) error {
	if len(candidates) == 0 {
		return nil
	}
	log := logf.FromContext(ctx)
	current := map[string]types.UID{}
	for _, sbx := range candidates {
		ref := metav1.GetControllerOfNoCopy(sbx)
		uid, known := current[ref.Name]
		if !known {
			pool := &sandboxv1alpha1.SandboxWarmPool{}
			err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: sbx.Namespace, Name: ref.Name}, pool)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return fmt.Errorf("checking SandboxWarmPool %s/%s: %w", sbx.Namespace, ref.Name, err)
			default:
				uid = pool.UID
			}
			current[ref.Name] = uid
		}
		if uid == ref.UID {
			continue
		}
		memberUID := sbx.UID
		err := r.client.Delete(ctx, sbx, client.Preconditions{UID: &memberUID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting orphaned warm pool member %s/%s: %w", sbx.Namespace, sbx.Name, err)
		}
		log.Info("deleted a member whose SandboxWarmPool is gone", "sandbox", client.ObjectKeyFromObject(sbx), "pool", ref.Name)
	}
	return nil
}
