/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

const (
	// spreadStep is how long a manager holds back from an unbound pool
	// member for each member of that pool it holds beyond the node with
	// the fewest: long against a claim (a status write, milliseconds), so
	// the emptier node wins, short against filling a pool.
	spreadStep = 250 * time.Millisecond
	// spreadMaxWait bounds the hold-back, so that a pool still fills when
	// the emptier nodes cannot take members (full, or their manager is
	// stuck): they hold a Lease but never claim.
	spreadMaxWait = 2 * time.Second
)

// spreadTracker remembers when this manager first saw each unbound pool
// member it held back from, so that the hold-back is counted once from
// then, not again at every requeue.
type spreadTracker struct {
	mu    sync.Mutex
	first map[types.UID]time.Time
}

func newSpreadTracker() *spreadTracker {
	return &spreadTracker{first: map[types.UID]time.Time{}}
}

// remaining returns how much of wait is left for uid, counting from the
// first call for it.
func (t *spreadTracker) remaining(uid types.UID, now time.Time, wait time.Duration) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	first, ok := t.first[uid]
	if !ok {
		if len(t.first) > 1000 {
			// Members claimed by other nodes never come back here; drop
			// what is long past any hold-back.
			for k, at := range t.first {
				if now.Sub(at) > time.Minute {
					delete(t.first, k)
				}
			}
		}
		first = now
		t.first[uid] = now
	}
	return first.Add(wait).Sub(now)
}

func (t *spreadTracker) forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.first, uid)
}

// spreadExcess is how many more of a pool's members self holds than the
// live node holding the fewest. held counts members per node; live lists
// the nodes whose manager holds a current Lease (self counts as live).
func spreadExcess(held map[string]int, live []string, self string) int {
	fewest := held[self]
	for _, node := range live {
		fewest = min(fewest, held[node])
	}
	return held[self] - fewest
}

// spreadWait is how long this manager should still hold back from claiming
// the unbound warm pool member sbx, so that members spread over the nodes
// with a live manager: a manager holding more of the pool's members than
// another live node gives that node spreadStep per extra member
// (spreadMaxWait at most) to claim it first. Zero for everything else, and
// when the live nodes are unknown (no Leases configured, or listing them
// failed: spreading is a preference, never a reason not to provision).
func (r *SandboxReconciler) spreadWait(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) time.Duration {
	pool := warmpool.PoolOf(sbx)
	if r.opts.LiveNodes == nil || pool == "" || sbx.Spec.NodeName != "" {
		return 0
	}
	log := logf.FromContext(ctx)
	live, err := r.opts.LiveNodes(ctx)
	if err != nil {
		log.V(1).Info("not spreading warm pool members: the live nodes are unknown", "error", err.Error())
		return 0
	}
	if len(live) == 0 || (len(live) == 1 && live[0] == r.opts.NodeName) {
		return 0
	}
	held, err := r.poolMembersByNode(ctx, sbx.Namespace, pool)
	if err != nil {
		log.V(1).Info("not spreading warm pool members", "error", err.Error())
		return 0
	}
	excess := spreadExcess(held, live, r.opts.NodeName)
	if excess <= 0 {
		r.spread.forget(sbx.UID)
		return 0
	}
	wait := min(time.Duration(excess)*spreadStep, spreadMaxWait)
	left := r.spread.remaining(sbx.UID, r.clock.Now(), wait)
	if left > 0 {
		log.V(1).Info("holding back from a warm pool member so that an emptier node takes it",
			"pool", pool, "held", held, "live", live, "wait", left)
	}
	return left
}

// poolMembersByNode counts the members of one pool bound to each node,
// counting this manager's own claims its cache may not show yet.
func (r *SandboxReconciler) poolMembersByNode(ctx context.Context, namespace, pool string) (map[string]int, error) {
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.InNamespace(namespace),
		client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: pool}); err != nil {
		return nil, err
	}
	r.claims.mu.Lock()
	mine := make(map[types.UID]bool, len(r.claims.claimed))
	for _, uid := range r.claims.claimed {
		mine[uid] = true
	}
	r.claims.mu.Unlock()
	held := map[string]int{}
	for i := range list.Items {
		m := &list.Items[i]
		if warmpool.PoolOf(m) != pool || !m.DeletionTimestamp.IsZero() {
			continue
		}
		switch node := m.Status.NodeName; {
		case node != "":
			held[node]++
		case mine[m.UID]:
			held[r.opts.NodeName]++
		}
	}
	return held, nil
}
