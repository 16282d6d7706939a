/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// member builds a member for the choice functions: hash "new" is fresh.
func member(name, hash, node string, idle bool, created int) *sandboxv1alpha1.Sandbox {
	s := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{
		Name: name, UID: types.UID(name),
		Labels:            map[string]string{sandboxv1alpha1.LabelTemplateHash: hash},
		CreationTimestamp: metav1.NewTime(time.Unix(int64(created), 0)),
	}}
	s.Status.NodeName = node
	if idle {
		s.Status.ContainerID = "c-" + name
		s.Status.Conditions = []metav1.Condition{
			{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonPaused},
			{Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.SandboxReasonPaused},
		}
	}
	return s
}

func names(ss []*sandboxv1alpha1.Sandbox) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDeletionPreference(t *testing.T) {
	v := &view{hash: "new"}
	got := names(byDeletionPreference(v, []*sandboxv1alpha1.Sandbox{
		member("fresh-idle-old", "new", "a", true, 1),
		member("fresh-idle-new", "new", "a", true, 5),
		member("fresh-busy", "new", "a", false, 1),
		member("stale-idle", "old", "a", true, 1),
		member("stale-busy", "old", "a", false, 1),
	}))
	want := []string{"stale-busy", "stale-idle", "fresh-busy", "fresh-idle-new", "fresh-idle-old"}
	if !equal(got, want) {
		t.Fatalf("deletion order %v, want %v", got, want)
	}
}

// TestForgedMemberIsStale: a member with the current template's hash label
// whose spec is not the template's (made past admission) is stale: never
// ready, deleted before any fresh member, idle and older though it is.
func TestForgedMemberIsStale(t *testing.T) {
	tmpl := sandboxv1alpha1.SandboxTemplate{Image: "busybox:1", Resources: sandboxv1alpha1.SandboxResources{Memory: ptr.To(resource.MustParse("16Mi"))}}
	v := &view{hash: "new", template: tmpl}
	real := member("real", "new", "a", false, 5)
	forged := member("forged", "new", "a", true, 1)
	for _, s := range []*sandboxv1alpha1.Sandbox{real, forged} {
		s.Spec.Image, s.Spec.Resources.Memory, s.Spec.Paused = tmpl.Image, ptr.To(resource.MustParse("16Mi")), true
	}
	forged.Spec.Resources.Memory = ptr.To(resource.MustParse("2Gi"))
	v.active = []*sandboxv1alpha1.Sandbox{real, forged}
	if v.fresh(forged) || !v.fresh(real) {
		t.Fatalf("fresh: forged %v, real %v; want false, true", v.fresh(forged), v.fresh(real))
	}
	if v.ready() != 0 || v.stale() != 1 {
		t.Errorf("ready %d, stale %d; want 0, 1", v.ready(), v.stale())
	}
	if got := names(byDeletionPreference(v, v.active)); !equal(got, []string{"forged", "real"}) {
		t.Errorf("deletion order %v, want forged first", got)
	}
}

func TestRolloutVictims(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []*sandboxv1alpha1.Sandbox
		pending []pendingCreate
		want    []string
	}{{
		name: "one per node, a stale member not idle first",
		members: []*sandboxv1alpha1.Sandbox{
			member("a1", "old", "a", true, 1), member("a2", "old", "a", false, 1),
			member("b1", "old", "b", true, 1), member("b2", "new", "b", true, 1),
		},
		want: []string{"a2", "b1"},
	}, {
		name: "a fresh member starting on a node holds that node back",
		members: []*sandboxv1alpha1.Sandbox{
			member("a1", "old", "a", true, 1), member("a2", "new", "a", false, 1),
			member("b1", "old", "b", true, 1),
		},
		want: []string{"b1"},
	}, {
		name: "an unbound fresh member holds back every node",
		members: []*sandboxv1alpha1.Sandbox{
			member("a1", "old", "a", true, 1), member("x", "new", "", false, 1),
		},
	}, {
		name:    "so does a fresh member the cache does not show yet",
		members: []*sandboxv1alpha1.Sandbox{member("a1", "old", "a", true, 1)},
		pending: []pendingCreate{{hash: "new"}},
	}, {
		name: "unbound stale members wait until nothing is in flight",
		members: []*sandboxv1alpha1.Sandbox{
			member("u1", "old", "", false, 1), member("a1", "new", "a", false, 1), member("b1", "old", "b", true, 1),
		},
		want: []string{"b1"},
	}, {
		name: "nothing stale",
		members: []*sandboxv1alpha1.Sandbox{
			member("a1", "new", "a", true, 1), member("b1", "new", "b", false, 1),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := &view{hash: "new", active: tc.members, pending: tc.pending}
			if got := names(rolloutVictims(v)); !equal(got, tc.want) && len(got)+len(tc.want) > 0 {
				t.Fatalf("victims %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCreateBackoff(t *testing.T) {
	r := NewReconciler(nil, nil, nil, nil, Options{CreateBackoffMax: 10 * time.Second})
	for failures, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 60: 10 * time.Second} {
		if got := r.backoff(failures); got != want {
			t.Errorf("backoff after %d failures: %s, want %s", failures, got, want)
		}
	}
}
