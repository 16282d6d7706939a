/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxnode

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/code-sandbox/code-sandbox-operator/internal/nodelease"
)

func TestDecide(t *testing.T) {
	now := time.Unix(100_000, 0)
	lease := func(name, holder string, renewedAgo time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](40),
				RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)},
			},
		}
	}
	kubelet := func(ago time.Duration) *coordinationv1.Lease { return lease("n1", "n1", ago) }
	manager := func(ago time.Duration) *coordinationv1.Lease { return lease(nodelease.NamePrefix+"n1", "n1", ago) }
	at := func(ago time.Duration) time.Time { return now.Add(-ago + 40*time.Second) }

	for _, tc := range []struct {
		name    string
		obs     Observation
		lost    bool
		recheck time.Time
		message string
	}{
		{name: "healthy: both Leases fresh", recheck: at(10 * time.Second),
			obs: Observation{NodeExists: true, KubeletLease: kubelet(10 * time.Second), ManagerLease: manager(5 * time.Second)}},
		{name: "manager rollout: its Lease deleted, the kubelet renews", recheck: at(3 * time.Second),
			obs: Observation{NodeExists: true, KubeletLease: kubelet(3 * time.Second)}},
		{name: "crashlooping manager: its Lease expired, the kubelet renews", recheck: at(time.Second),
			obs: Observation{NodeExists: true, KubeletLease: kubelet(time.Second), ManagerLease: manager(5 * time.Minute)}},
		{name: "kubelet stopped, manager still renews (no loss of its sandboxes)", recheck: at(2 * time.Second),
			obs: Observation{NodeExists: true, KubeletLease: kubelet(time.Minute), ManagerLease: manager(2 * time.Second)}},
		{name: "node stopped: both expired", lost: true, message: "its manager's Lease expired",
			obs: Observation{NodeExists: true, KubeletLease: kubelet(41 * time.Second), ManagerLease: manager(45 * time.Second)}},
		{name: "node stopped after the manager was removed", lost: true, message: "its manager's Lease is gone",
			obs: Observation{NodeExists: true, KubeletLease: kubelet(time.Hour)}},
		{name: "expiry is exact: renewed 40 s ago has expired", lost: true,
			obs: Observation{NodeExists: true, KubeletLease: kubelet(40 * time.Second), ManagerLease: manager(40 * time.Second)}},
		{name: "renewed 39.999 s ago is current", recheck: now.Add(time.Millisecond),
			obs: Observation{NodeExists: true, KubeletLease: kubelet(40*time.Second - time.Millisecond), ManagerLease: manager(time.Hour)}},
		{name: "Node deleted with its Lease, no manager", lost: true, message: "the Node and its kubelet's Lease are gone",
			obs: Observation{}},
		{name: "Node deleted but the kubelet still renews (it re-registers)", recheck: at(time.Second),
			obs: Observation{KubeletLease: kubelet(time.Second)}},
		{name: "a Node without a kubelet Lease (written by hand) is never lost", message: "no kubelet Lease",
			obs: Observation{NodeExists: true}},
		{name: "a kubelet Lease held by another node does not count", message: "no kubelet Lease",
			obs: Observation{NodeExists: true, KubeletLease: lease("n1", "n2", time.Hour)}},
		{name: "a kubelet Lease never renewed does not count", message: "no kubelet Lease",
			obs: Observation{NodeExists: true, KubeletLease: &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n1")}}}},
		{name: "a manager Lease held as another node is no manager", lost: true, message: "names no renewal",
			obs: Observation{NodeExists: true, KubeletLease: kubelet(time.Hour), ManagerLease: lease(nodelease.NamePrefix+"n1", "n2", 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.obs.Node = "n1"
			v := Decide(tc.obs, now)
			if v.Lost != tc.lost {
				t.Fatalf("lost = %v, want %v (%s)", v.Lost, tc.lost, v.Message)
			}
			if !v.RecheckAt.Equal(tc.recheck) {
				t.Errorf("recheck at %v, want %v", v.RecheckAt, tc.recheck)
			}
			if !strings.Contains(v.Message, tc.message) || !strings.Contains(v.Message, "n1") {
				t.Errorf("message %q does not name the node and %q", v.Message, tc.message)
			}
		})
	}
}
