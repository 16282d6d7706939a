/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

// deletedTracker remembers the UIDs of Sandboxes whose delete event this
// manager saw, until Reconcile has removed what they left behind on this
// node. The work queue is keyed by namespace/name, so a Sandbox deleted and
// at once re-created under the same name reaches Reconcile as the new
// object; without this record the old one's container would wait for the
// orphan sweep.
type deletedTracker struct {
	mu   sync.Mutex
	uids map[types.NamespacedName]map[types.UID]struct{}
}

func newDeletedTracker() *deletedTracker {
	return &deletedTracker{uids: map[types.NamespacedName]map[types.UID]struct{}{}}
}

// add records uids as deleted under key.
func (t *deletedTracker) add(key types.NamespacedName, uids ...types.UID) {
	if len(uids) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	set := t.uids[key]
	if set == nil {
		set = map[types.UID]struct{}{}
		t.uids[key] = set
	}
	for _, uid := range uids {
		set[uid] = struct{}{}
	}
}

// take returns and forgets the UIDs recorded under key. A caller that fails
// to clean up puts them back with add, so the retry still knows them.
func (t *deletedTracker) take(key types.NamespacedName) []types.UID {
	t.mu.Lock()
	defer t.mu.Unlock()
	set := t.uids[key]
	delete(t.uids, key)
	out := make([]types.UID, 0, len(set))
	for uid := range set {
		out = append(out, uid)
	}
	return out
}

// releaseUID drops the capacity held for key, but only by the Sandbox with
// this UID: a successor under the same name keeps its own claim.
func (t *claimTracker) releaseUID(key types.NamespacedName, uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claimed[key] == uid {
		delete(t.claimed, key)
	}
}

// sandboxEventHandler enqueues Sandboxes by namespace/name, as
// handler.EnqueueRequestForObject does, and first records the UID of every
// deleted one so that Reconcile removes its container at once (see
// deletedTracker).
type sandboxEventHandler struct {
	handler.EnqueueRequestForObject
	deleted *deletedTracker
}

func (h *sandboxEventHandler) Delete(ctx context.Context, evt event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if sbx, ok := evt.Object.(*sandboxv1alpha1.Sandbox); ok && sbx != nil && sbx.UID != "" {
		h.deleted.add(client.ObjectKeyFromObject(sbx), sbx.UID)
	}
	h.EnqueueRequestForObject.Delete(ctx, evt, q)
}

// removeVanished cleans up after the Sandbox key, which is gone (NotFound) or
// was deleted and re-created (deleted holds the UIDs whose delete events were
// seen): it removes this node's containers labelled with that namespace/name
// whose Sandbox no longer exists with the same UID, at once rather than at
// the next orphan sweep, and drops the exec history of the deleted UIDs. A
// Sandbox whose finalizer was stripped by hand never reaches finalize, so
// this is what removes its container. On failure the deleted UIDs are put
// back for the retry.
func (r *SandboxReconciler) removeVanished(ctx context.Context, key types.NamespacedName, deleted []types.UID) error {
	list, err := r.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: r.opts.NodeName})
	if err == nil {
		mine := list[:0]
		for _, ct := range list {
			if ct.Labels[dockerruntime.LabelNamespace] == key.Namespace && ct.Labels[dockerruntime.LabelName] == key.Name {
				mine = append(mine, ct)
			}
		}
		_, err = r.removeOrphans(ctx, mine)
	}
	if err != nil {
		r.deleted.add(key, deleted...)
		return fmt.Errorf("removing the containers of deleted sandbox %s: %w", key, err)
	}
	for _, uid := range deleted {
		// The API server deleted this UID, and UIDs are never reused: what
		// finalize would have dropped can go whether or not a container
		// was left.
		r.backoff.reset(uid)
		r.deleteHistoryOf(ctx, uid)
	}
	return nil
}

// deleteHistoryOf drops the exec history of a Sandbox whose container is
// gone. A failure is logged, not retried: a leftover history file must not
// keep a Sandbox stuck in Terminating.
func (r *SandboxReconciler) deleteHistoryOf(ctx context.Context, uid types.UID) {
	if r.opts.History == nil {
		return
	}
	if err := r.opts.History.Delete(string(uid)); err != nil {
		logf.FromContext(ctx).Error(err, "deleting exec history", "uid", uid)
	}
}
