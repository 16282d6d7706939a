/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodelease

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestCurrent(t *testing.T) {
	now := time.Unix(10_000, 0)
	lease := func(name, holder string, renewed time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](40),
				RenewTime: &metav1.MicroTime{Time: now.Add(-renewed)},
			},
		}
	}
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		node  string
		live  bool
	}{
		{"renewed 10 s ago", lease(NamePrefix+"n1", "n1", 10*time.Second), "n1", true},
		{"renewed 41 s ago: expired", lease(NamePrefix+"n1", "n1", 41*time.Second), "n1", false},
		{"held under another node's name", lease(NamePrefix+"n1", "n2", time.Second), "", false},
		{"never renewed", &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: NamePrefix + "n1"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n1")}}, "", false},
	} {
		node, live := current(tc.lease, now)
		if live != tc.live || (tc.live && node != tc.node) {
			t.Errorf("%s: got %q live=%v, want %q live=%v", tc.name, node, live, tc.node, tc.live)
		}
	}
}

func TestName(t *testing.T) {
	if name, err := Name("worker-1.example.com"); err != nil || name != "code-sandbox-node-worker-1.example.com" {
		t.Errorf("Name: %q, %v", name, err)
	}
	if _, err := Name(strings.Repeat("a", 250)); err == nil || !strings.Contains(err.Error(), "makes no valid Lease name") {
		t.Errorf("a 268-character Lease name: %v", err)
	}
}
