/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Policy is what one sandbox may reach. The zero Policy denies everything.
type Policy struct {
	// Sandbox is "namespace/name" (or the MCP server's container id). It
	// only labels audit events; it decides nothing.
	Sandbox string
	Rules   []Rule
}

// Rule allows one host name (or wildcard) on some ports.
type Rule struct {
	// Host is a DNS name ("api.example.com") or a wildcard
	// ("*.example.com"). A wildcard matches names with one or more labels
	// in place of the "*" (a.example.com, a.b.example.com), never the
	// bare suffix (example.com) nor a name that merely ends in the same
	// characters (badexample.com). Lower case; no trailing dot; no IP
	// addresses.
	Host string
	// Ports are the TCP ports allowed; empty means 80 and 443.
	Ports []uint16
	// Inject, when set, terminates TLS for this host at the proxy and adds
	// a header to the requests that match. Only ports 80 and 443 (or those
	// listed) are served; on 80 the header is added to plain HTTP.
	Inject *Injection
}

// Injection is a header the proxy adds to matching requests.
type Injection struct {
	// Header is the header name, e.g. "Authorization".
	Header string
	// Value is the secret value, e.g. "Bearer abc". It is never logged,
	// never in an Event, and never reaches the sandbox.
	Value []byte
	// Methods are the HTTP methods (upper case) the header is added to;
	// empty means any.
	Methods []string
	// PathPrefixes are URL path prefixes (each starting with "/") the
	// header is added to; empty means any. Matched against the cleaned
	// path, so "/v1/../admin" does not match "/v1/".
	PathPrefixes []string
}

// DefaultPorts are the ports of a Rule that lists none.
var DefaultPorts = []uint16{80, 443}

// Limits on a Policy, so that a policy cannot make the proxy's work per
// request unbounded.
const (
	MaxRules        = 256
	MaxPorts        = 32
	MaxValueBytes   = 8 << 10
	MaxPathPrefixes = 32
)

// Validate reports every problem of p at once, naming each rule by index
// and host. The webhook (through the API converter) and SetPolicy use it.
func Validate(p Policy) error {
	var errs []error
	if len(p.Rules) > MaxRules {
		errs = append(errs, fmt.Errorf("%d rules: at most %d", len(p.Rules), MaxRules))
	}
	for i, r := range p.Rules {
		where := fmt.Sprintf("rule %d (%q)", i, r.Host)
		if err := ValidateHost(r.Host); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		if len(r.Ports) > MaxPorts {
			errs = append(errs, fmt.Errorf("%s: %d ports: at most %d", where, len(r.Ports), MaxPorts))
		}
		for _, port := range r.Ports {
			if port == 0 {
				errs = append(errs, fmt.Errorf("%s: port 0", where))
			}
			if port == 53 {
				errs = append(errs, fmt.Errorf("%s: port 53 is the proxy's resolver and cannot be allowed", where))
			}
		}
		if r.Inject != nil {
			errs = append(errs, validateInjection(where, *r.Inject)...)
		}
	}
	return errors.Join(errs...)
}

func validateInjection(where string, in Injection) []error {
	var errs []error
	if in.Header == "" || !validHeaderName(in.Header) {
		errs = append(errs, fmt.Errorf("%s: injected header name %q is not a valid HTTP header name", where, in.Header))
	}
	switch http.CanonicalHeaderKey(in.Header) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Te", "Trailer", "Upgrade":
		errs = append(errs, fmt.Errorf("%s: header %q cannot be injected", where, in.Header))
	}
	if len(in.Value) == 0 {
		errs = append(errs, fmt.Errorf("%s: injected header %q has an empty value", where, in.Header))
	}
	if len(in.Value) > MaxValueBytes {
		errs = append(errs, fmt.Errorf("%s: injected header %q value longer than %d bytes", where, in.Header, MaxValueBytes))
	}
	for _, c := range in.Value {
		if c == '\r' || c == '\n' || c == 0 {
			// Said without the value: it is a secret.
			errs = append(errs, fmt.Errorf("%s: injected header %q value contains CR, LF or NUL", where, in.Header))
			break
		}
	}
	for _, m := range in.Methods {
		if m == "" || m != strings.ToUpper(m) || !validHeaderName(m) {
			errs = append(errs, fmt.Errorf("%s: method %q is not an upper-case HTTP method", where, m))
		}
	}
	if len(in.PathPrefixes) > MaxPathPrefixes {
		errs = append(errs, fmt.Errorf("%s: %d path prefixes: at most %d", where, len(in.PathPrefixes), MaxPathPrefixes))
	}
	for _, pp := range in.PathPrefixes {
		if !strings.HasPrefix(pp, "/") || strings.ContainsAny(pp, "?#\x00") {
			errs = append(errs, fmt.Errorf("%s: path prefix %q must start with / and have no query or fragment", where, pp))
		}
	}
	return errs
}

// validHeaderName: an RFC 9110 token.
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return s != ""
}

// ValidateHost checks a Rule's Host: a lower-case DNS name of two labels or
// more, or "*." followed by one; never an IP address.
func ValidateHost(h string) error {
	if h == "" {
		return errors.New("empty host")
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return errors.New("an IP address is not a host name: egress is allowed by name only")
	}
	name := h
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		name = rest
	}
	if strings.Contains(name, "*") {
		return errors.New(`a wildcard is only allowed as the whole first label ("*.example.com")`)
	}
	if name != strings.ToLower(name) {
		return errors.New("host names must be lower case")
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return fmt.Errorf("not a DNS name: %s", strings.Join(msgs, "; "))
	}
	if !strings.Contains(name, ".") {
		return errors.New("a host needs at least two labels (a single label would be resolved in a search domain)")
	}
	return nil
}

// Matcher answers whether a name and port are allowed by a Policy. It is
// immutable once built; the proxy swaps whole Matchers on SetPolicy.
type Matcher struct {
	policy Policy
}

// NewMatcher validates p and builds its Matcher.
func NewMatcher(p Policy) (*Matcher, error) {
	if err := Validate(p); err != nil {
		return nil, err
	}
	return &Matcher{policy: p}, nil
}

// NormalizeName lower-cases a DNS name and strips one trailing dot. It
// returns "" for what is not a name (an IP address, an empty string,
// characters a DNS name cannot have).
func NormalizeName(name string) string {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" || len(name) > 253 {
		return ""
	}
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return ""
	}
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return ""
	}
	return name
}

// HostMatches reports whether the (normalized) name matches a rule's Host.
func HostMatches(pattern, name string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		// suffix is ".example.com": at least one label must precede it.
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix) && !strings.HasPrefix(name, ".")
	}
	return pattern == name
}

// Rule returns the first rule allowing name (any port), or nil.
func (m *Matcher) Rule(name string) *Rule {
	if m == nil {
		return nil
	}
	name = NormalizeName(name)
	if name == "" {
		return nil
	}
	// Exact names first, so that an exact rule's injection wins over a
	// wildcard's.
	for i := range m.policy.Rules {
		if m.policy.Rules[i].Host == name {
			return &m.policy.Rules[i]
		}
	}
	for i := range m.policy.Rules {
		if HostMatches(m.policy.Rules[i].Host, name) {
			return &m.policy.Rules[i]
		}
	}
	return nil
}

// AllowsName reports whether any rule allows name (the resolver's check).
func (m *Matcher) AllowsName(name string) bool { return m.Rule(name) != nil }

// Allows returns the rule allowing name on port, or nil.
func (m *Matcher) Allows(name string, port uint16) *Rule {
	r := m.Rule(name)
	if r == nil {
		return nil
	}
	ports := r.Ports
	if len(ports) == 0 {
		ports = DefaultPorts
	}
	if !slices.Contains(ports, port) {
		return nil
	}
	return r
}

// Ports returns every port some rule allows, sorted: the ports the
// firewall redirects to the proxy for sandboxes with this policy.
func (m *Matcher) Ports() []uint16 {
	var out []uint16
	if m == nil {
		return nil
	}
	for _, r := range m.policy.Rules {
		if len(r.Ports) == 0 {
			out = append(out, DefaultPorts...)
		}
		out = append(out, r.Ports...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Sandbox is the policy's audit label.
func (m *Matcher) Sandbox() string {
	if m == nil {
		return ""
	}
	return m.policy.Sandbox
}

// InjectsInto reports whether in applies to a request with this method and
// (raw) URL path.
func (in *Injection) InjectsInto(method, path string) bool {
	if in == nil {
		return false
	}
	if len(in.Methods) > 0 && !slices.Contains(in.Methods, method) {
		return false
	}
	if len(in.PathPrefixes) == 0 {
		return true
	}
	clean := cleanPath(path)
	for _, pp := range in.PathPrefixes {
		if strings.HasPrefix(clean, pp) {
			return true
		}
	}
	return false
}

// Event is one audited decision: every request the proxy injected into and
// every refusal. It never carries a secret.
type Event struct {
	Time     time.Time
	Sandbox  string
	Host     string
	Port     uint16
	Method   string
	Path     string
	Decision string // DecisionInjected, DecisionRefused
	Reason   string // a Reason* constant
}

// Decisions.
const (
	DecisionInjected = "Injected"
	DecisionRefused  = "Refused"
	DecisionAllowed  = "Allowed"
)

// Reasons of refusals (and of injections: ReasonInjected).
const (
	ReasonNoPolicy        = "NoPolicy"        // the source address has no policy
	ReasonNotAllowed      = "NotAllowed"      // the name (or port) is not in the policy
	ReasonRawIP           = "RawIP"           // no SNI / an IP as Host
	ReasonNoSNI           = "NoSNI"           // TLS without server name
	ReasonSNIHostMismatch = "SNIHostMismatch" // terminated TLS: Host differs from SNI
	ReasonBlockedAddress  = "BlockedAddress"  // the name resolved to a blocked address (rebinding, metadata, private, node)
	ReasonResolveFailed   = "ResolveFailed"   // upstream resolution failed
	ReasonDNSType         = "DNSType"         // a DNS query type other than A (AAAA is answered empty, not refused)
	ReasonProtocol        = "Protocol"        // neither TLS nor HTTP/1.x on the port
	ReasonPolicyChanged   = "PolicyChanged"   // an open connection the new policy no longer allows
	ReasonInjected        = "Injected"
	ReasonUpstream        = "UpstreamError"
)

// cleanPath is path.Clean for a URL path, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}
