/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"strings"
	"testing"
)

func TestParseRole(t *testing.T) {
	for _, tc := range []struct {
		value          string
		wantRole       string
		wantDeprecated bool
	}{
		{value: "node", wantRole: roleNode},
		{value: "control-plane", wantRole: roleControlPlane},
		// The former name runs the same role, with a warning that names
		// the new one.
		{value: "webhook", wantRole: roleControlPlane, wantDeprecated: true},
	} {
		role, deprecation, err := parseRole(tc.value)
		if err != nil {
			t.Errorf("parseRole(%q): %v", tc.value, err)
			continue
		}
		if role != tc.wantRole {
			t.Errorf("parseRole(%q) = %q, want %q", tc.value, role, tc.wantRole)
		}
		if got := deprecation != ""; got != tc.wantDeprecated {
			t.Errorf("parseRole(%q) deprecation = %q, want one: %v", tc.value, deprecation, tc.wantDeprecated)
		}
		if tc.wantDeprecated && !strings.Contains(deprecation, "--role control-plane") {
			t.Errorf("parseRole(%q) deprecation %q does not name --role control-plane", tc.value, deprecation)
		}
	}
}

func TestParseRoleRefusesUnknownRoles(t *testing.T) {
	for _, value := range []string{"", "Node", "controlplane", "control_plane", "webhook ", "node,control-plane", "\x00"} {
		role, _, err := parseRole(value)
		if err == nil {
			t.Errorf("parseRole(%q) = %q, want an error", value, role)
			continue
		}
		if !strings.Contains(err.Error(), "node or control-plane") || !strings.Contains(err.Error(), "--role") {
			t.Errorf("parseRole(%q) error %q does not name the flag and its values", value, err)
		}
	}
}
