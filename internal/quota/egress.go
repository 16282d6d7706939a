/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota

import (
	"fmt"
	"strings"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// EgressViolations returns why q refuses the network of s: network mode
// Egress where allowEgress is false, unrestricted Egress (no
// spec.network.egress) where q requires a policy, and every allowed host
// outside q's allowedHosts, each named. It is the one egress check: the
// Sandbox webhook runs it on create and on every policy change, the warm
// pool webhook on a template.
func EgressViolations(q *sandboxv1alpha1.SandboxQuota, n *sandboxv1alpha1.SandboxNetwork) []string {
	if n.Mode != sandboxv1alpha1.NetworkEgress {
		return nil
	}
	spec := q.Spec
	if !spec.AllowEgress {
		return []string{fmt.Sprintf("sandbox quota %q does not allow network mode Egress (its allowEgress is false); use network mode None", q.Name)}
	}
	rules := spec.Egress
	if rules == nil {
		return nil
	}
	if n.Egress == nil {
		if rules.RequirePolicy || len(rules.AllowedHosts) > 0 {
			return []string{fmt.Sprintf("sandbox quota %q requires an egress policy (spec.network.egress) for network mode Egress: unrestricted egress reaches every public host", q.Name)}
		}
		return nil
	}
	if len(rules.AllowedHosts) == 0 {
		return nil
	}
	var out []string
	for _, r := range n.Egress.Allow {
		if !HostAllowed(rules.AllowedHosts, r.Host) {
			out = append(out, fmt.Sprintf("sandbox quota %q does not allow egress to host %q; allowed hosts: %s",
				q.Name, r.Host, strings.Join(rules.AllowedHosts, ", ")))
		}
	}
	return out
}

// HostAllowed reports whether host (a policy's host, itself possibly a
// wildcard) is covered by one of patterns: every name host matches must be
// matched by the pattern. Comparison is exact on lower-case names, which
// the CRD enforces; anything else (upper case, a trailing dot, an IP
// address) matches nothing here rather than something by accident.
func HostAllowed(patterns []string, host string) bool {
	for _, p := range patterns {
		if hostCovers(p, host) {
			return true
		}
	}
	return false
}

// hostCovers reports whether pattern p matches every name that host h
// matches. "*.example.com" matches names with one or more labels before
// ".example.com"; so it covers "a.example.com", "*.example.com" and
// "*.a.example.com", not "example.com". A literal pattern covers only
// itself.
func hostCovers(p, h string) bool {
	if p == "" || h == "" {
		return false
	}
	suffix, wild := strings.CutPrefix(p, "*.")
	if !wild {
		return p == h
	}
	if suffix == "" || strings.Contains(suffix, "*") {
		return false
	}
	if under, hwild := strings.CutPrefix(h, "*."); hwild {
		return under == suffix || (strings.HasSuffix(under, "."+suffix) && len(under) > len(suffix)+1)
	}
	return strings.HasSuffix(h, "."+suffix) && len(h) > len(suffix)+1
}
