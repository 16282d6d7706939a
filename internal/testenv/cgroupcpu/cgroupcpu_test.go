/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cgroupcpu

import "testing"

func TestNearLimit(t *testing.T) {
	for _, c := range []struct {
		name                   string
		reported, limit, truth float64
		truthOK, wantSatisfied bool
	}{
		{"at the limit", 0.49, 0.5, 0.5, true, true},
		{"at the limit, truth unknown", 0.45, 0.5, 0, false, true},
		{"above the cap", 0.7, 0.5, 0.7, true, false},
		{"low on a quiet host", 0.2, 0.5, 0.5, true, false},
		{"low, truth unknown", 0.2, 0.5, 0, false, false},
		{"low on a busy host, tracking it", 0.21, 0.5, 0.25, true, true},
		{"low on a busy host, not tracking it", 0.05, 0.5, 0.3, true, false},
	} {
		if err := NearLimit(c.reported, c.limit, c.truth, c.truthOK); (err == nil) != c.wantSatisfied {
			t.Errorf("%s: NearLimit(%v, %v, %v, %v) = %v", c.name, c.reported, c.limit, c.truth, c.truthOK, err)
		}
	}
}
