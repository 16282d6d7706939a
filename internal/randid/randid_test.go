/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package randid_test

import (
	"regexp"
	"testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

func TestHexIsLowercaseHexOfTwiceTheLength(t *testing.T) {
	for _, n := range []int{0, 1, 6, 16} {
		got := randid.Hex(n)
		if !regexp.MustCompile(`^[0-9a-f]*$`).MatchString(got) || len(got) != 2*n {
			t.Errorf("Hex(%d) = %q, want %d lowercase hex digits", n, got, 2*n)
		}
	}
}

func TestHexDoesNotRepeat(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := randid.Hex(8)
		if seen[id] {
			t.Fatalf("Hex(8) repeated %s within 1000 calls", id)
		}
		seen[id] = true
	}
}
