/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxnode

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/nodelease"
)

// Observation is what the control plane read about one node.
type Observation struct {
	// Node is the node's name.
	Node string
	// NodeExists: the Node object exists.
	NodeExists bool
	// KubeletLease is kube-node-lease/<node>, written only by the node's
	// kubelet (the node authorizer confines it to its own Lease); nil when
	// there is none.
	KubeletLease *coordinationv1.Lease
	// ManagerLease is the node manager's Lease (internal/nodelease); nil
	// when there is none.
	ManagerLease *coordinationv1.Lease
}

// Verdict is what Decide concluded.
type Verdict struct {
	// Lost: the node is gone, and its Sandboxes are NodeLost.
	Lost bool
	// Message says why, for the condition (when Lost) or the log.
	Message string
	// RecheckAt is when the verdict may change by itself (the earliest
	// expiry of a Lease still current); zero when only a write (a Lease
	// created, a Node deleted) can change it.
	RecheckAt time.Time
}

// Decide is the node-loss rule. A node is lost when both
//   - its kubelet is gone: the kubelet's node Lease has expired
//     (renewTime + leaseDurationSeconds ≤ now), or the Node object and its
//     Lease are both gone; and
//   - its manager is gone: the manager's Lease is missing or expired.
//
// Either alone is not enough: a manager rollout or a crashlooping manager
// on a healthy node loses its Lease while the kubelet renews its own, and
// a kubelet that stops renewing on a node whose manager still runs has not
// lost its sandboxes. A Node with no kubelet Lease at all (a Node object
// written by hand, as the dev cluster does) is never declared lost by its
// kubelet side. Both Leases are written only by the node itself (the
// kubelet under the node authorizer, the manager under
// config/policy/node_lease_policy.yaml): nothing a namespace user, a
// sandbox or another node's manager can write decides it.
func Decide(o Observation, now time.Time) Verdict {
	var recheck time.Time
	soonest := func(t time.Time) {
		if recheck.IsZero() || t.Before(recheck) {
			recheck = t
		}
	}

	var kubeletGone bool
	var kubeletWhy string
	expiry, ok := kubeletExpiry(o.KubeletLease, o.Node)
	switch {
	case ok && now.Before(expiry):
		soonest(expiry)
	case ok:
		kubeletGone = true
		kubeletWhy = fmt.Sprintf("its kubelet last renewed the node's Lease at %s (expired at %s)",
			o.KubeletLease.Spec.RenewTime.UTC().Format(time.RFC3339), expiry.UTC().Format(time.RFC3339))
	case !o.NodeExists:
		kubeletGone = true
		kubeletWhy = "the Node and its kubelet's Lease are gone"
	default:
		// A Node without a usable kubelet Lease: no evidence of loss.
		return Verdict{Message: fmt.Sprintf("node %s has no kubelet Lease to judge by; it is not declared lost", o.Node)}
	}

	var managerGone bool
	var managerWhy string
	switch node, mexp, mok := managerExpiry(o.ManagerLease); {
	case o.ManagerLease == nil:
		managerGone, managerWhy = true, "its manager's Lease is gone"
	case !mok || node != o.Node:
		managerGone, managerWhy = true, "its manager's Lease names no renewal for it"
	case now.Before(mexp):
		soonest(mexp)
	default:
		managerGone = true
		managerWhy = fmt.Sprintf("its manager's Lease expired at %s", mexp.UTC().Format(time.RFC3339))
	}

	if kubeletGone && managerGone {
		return Verdict{Lost: true, Message: fmt.Sprintf("node %s is lost: %s, and %s", o.Node, kubeletWhy, managerWhy)}
	}
	return Verdict{Message: fmt.Sprintf("node %s is not lost", o.Node), RecheckAt: recheck}
}

// kubeletExpiry is when the kubelet's node Lease expires; ok is false for
// a missing Lease, one never renewed, or one held by someone else.
func kubeletExpiry(l *coordinationv1.Lease, node string) (time.Time, bool) {
	if l == nil {
		return time.Time{}, false
	}
	s := l.Spec
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil || s.HolderIdentity == nil || *s.HolderIdentity != node || l.Name != node {
		return time.Time{}, false
	}
	return s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second), true
}

func managerExpiry(l *coordinationv1.Lease) (string, time.Time, bool) {
	if l == nil {
		return "", time.Time{}, false
	}
	return nodelease.Expiry(l)
}
