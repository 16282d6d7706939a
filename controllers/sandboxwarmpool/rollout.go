/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool

import (
	"sort"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// byDeletionPreference orders members best to delete first: stale before
// fresh, then not idle before idle (an idle member is what a claim
// wants), then newest first (the least invested in).
func byDeletionPreference(v *view, members []*sandboxv1alpha1.Sandbox) []*sandboxv1alpha1.Sandbox {
	out := append([]*sandboxv1alpha1.Sandbox(nil), members...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if fa, fb := v.fresh(a), v.fresh(b); fa != fb {
			return !fa
		}
		if ia, ib := warmpool.Idle(a), warmpool.Idle(b); ia != ib {
			return !ia
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Name > b.Name
	})
	return out
}

// rolloutVictims picks the stale members to replace now: one on each node
// that hosts stale members and has no fresh member on its way to idle, so
// that a broken template costs each node one member, not all of them, and a
// node never has more than one replacement starting. A fresh member not yet
// bound to a node may land on any, so it holds back every node. Stale
// members not bound to any node are replaced one at a time, only when no
// fresh member is in flight at all.
func rolloutVictims(v *view) []*sandboxv1alpha1.Sandbox {
	staleByNode := map[string][]*sandboxv1alpha1.Sandbox{}
	inFlight := map[string]bool{}
	anywhere := false
	for _, p := range v.pending {
		if p.hash == v.hash {
			anywhere = true
		}
	}
	for _, s := range v.active {
		switch {
		case !v.fresh(s):
			staleByNode[s.Status.NodeName] = append(staleByNode[s.Status.NodeName], s)
		case warmpool.Idle(s):
		case s.Status.NodeName == "":
			anywhere = true
		default:
			inFlight[s.Status.NodeName] = true
		}
	}
	if anywhere || len(staleByNode) == 0 {
		return nil
	}
	nodes := make([]string, 0, len(staleByNode))
	for node := range staleByNode {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	var victims []*sandboxv1alpha1.Sandbox
	for _, node := range nodes {
		if inFlight[node] || (node == "" && len(inFlight) > 0) {
			continue
		}
		victims = append(victims, byDeletionPreference(v, staleByNode[node])[0])
	}
	return victims
}
