/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package contract

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxEgressAllow is the most names sandbox_initialize's egress_allow takes:
// the Sandbox API's limit (spec.network.egress.allow, MaxItems 64).
const MaxEgressAllow = 64

// egressHost is the CRD's rule for spec.network.egress.allow[].host,
// written once more here because the MCP server's packages may not import
// the API types; controllers/sandbox's CEL tests check that the two agree
// on every adversarial host they try.
var egressHost = regexp.MustCompile(`^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])+[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidateEgressHost checks one egress_allow entry as the Sandbox API
// would: a lower-case DNS name of two or more labels without a trailing
// dot, optionally "*." and such a name; never an IP address.
func ValidateEgressHost(h string) error {
	switch {
	case h == "":
		return fmt.Errorf("an empty host name")
	case len(h) > 253:
		return fmt.Errorf("host %q… is longer than 253 characters", h[:40])
	case h != strings.ToLower(h):
		return fmt.Errorf("host %q must be lower case", h)
	case strings.HasSuffix(h, "."):
		return fmt.Errorf("host %q must not end with a dot", h)
	case !egressHost.MatchString(h):
		return fmt.Errorf("host %q is not a DNS name of two or more labels, optionally starting with \"*.\" (no IP addresses, no '*' elsewhere, no \"*.\" before a single label such as *.com)", h)
	}
	return nil
}
