/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := Policy{Rules: []Rule{
		{Host: "api.example.com"},
		{Host: "*.example.com", Ports: []uint16{443, 8443}},
		{Host: "x.example.org", Inject: &Injection{Header: "Authorization", Value: []byte("Bearer a"), Methods: []string{"GET"}, PathPrefixes: []string{"/v1/"}}},
	}}
	if err := Validate(good); err != nil {
		t.Fatal(err)
	}
	if err := Validate(Policy{}); err != nil {
		t.Fatalf("the zero policy (deny all) is valid: %v", err)
	}
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Host: ""}, "empty host"},
		{Rule{Host: "1.2.3.4"}, "IP address"},
		{Rule{Host: "[::1]"}, "IP address"},
		{Rule{Host: "169.254.169.254"}, "IP address"},
		{Rule{Host: "localhost"}, "two labels"},
		{Rule{Host: "*"}, "wildcard"},
		{Rule{Host: "*.com"}, "two labels"},
		{Rule{Host: "a.*.example.com"}, "wildcard"},
		{Rule{Host: "*example.com"}, "wildcard"},
		{Rule{Host: "**.example.com"}, "wildcard"},
		{Rule{Host: "API.example.com"}, "lower case"},
		{Rule{Host: "a_b.example.com"}, "DNS name"},
		{Rule{Host: "a.example.com", Ports: []uint16{0}}, "port 0"},
		{Rule{Host: "a.example.com", Ports: []uint16{53}}, "port 53"},
		{Rule{Host: "a.example.com", Inject: &Injection{Header: "Bad Header", Value: []byte("v")}}, "header name"},
		{Rule{Host: "a.example.com", Inject: &Injection{Header: "Host", Value: []byte("v")}}, "cannot be injected"},
		{Rule{Host: "a.example.com", Inject: &Injection{Header: "X-K"}}, "empty value"},
		{Rule{Host: "a.example.com", Inject: &Injection{Header: "X-K", Value: []byte("a\r\nX-Evil: 1")}}, "CR, LF"},
		{Rule{Host: "a.example.com", Inject: &Injection{Header: "X-K", Value: []byte("v"), Methods: []string{"get"}}}, "upper-case"},
		{Rule{Host: "a.example.com", Inject: &Injection{Header: "X-K", Value: []byte("v"), PathPrefixes: []string{"v1"}}}, "start with /"},
	} {
		err := Validate(Policy{Rules: []Rule{tc.rule}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error with %q", tc.rule, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "a\r\nX-Evil") {
			t.Errorf("the error shows the secret value: %v", err)
		}
	}
}

func TestMatcher(t *testing.T) {
	m, err := NewMatcher(Policy{Rules: []Rule{
		{Host: "*.example.com"},
		{Host: "api.example.com", Ports: []uint16{8443}, Inject: &Injection{Header: "X-K", Value: []byte("v")}},
		{Host: "exact.org"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		port uint16
		ok   bool
	}{
		{"a.example.com", 443, true},
		{"a.b.example.com", 80, true},
		{"A.Example.COM.", 443, true},
		{"example.com", 443, false},
		{"badexample.com", 443, false},
		{".example.com", 443, false},
		{"a.example.com.evil.net", 443, false},
		{"a.example.com", 22, false},
		{"api.example.com", 8443, true},
		{"api.example.com", 443, false}, // the exact rule wins, and lists 8443 only
		{"exact.org", 443, true},
		{"sub.exact.org", 443, false},
		{"1.2.3.4", 443, false},
		{"", 443, false},
	} {
		if got := m.Allows(tc.name, tc.port) != nil; got != tc.ok {
			t.Errorf("Allows(%q, %d) = %v, want %v", tc.name, tc.port, got, tc.ok)
		}
	}
	if r := m.Rule("api.example.com"); r == nil || r.Inject == nil {
		t.Error("the exact rule with the injection should win over the wildcard")
	}
	if got := m.Ports(); len(got) != 3 || got[0] != 80 || got[1] != 443 || got[2] != 8443 {
		t.Errorf("Ports() = %v", got)
	}
	var zero *Matcher
	if zero.Allows("a.example.com", 443) != nil {
		t.Error("a nil Matcher allows")
	}
}

func TestInjectsInto(t *testing.T) {
	in := &Injection{Methods: []string{"GET", "POST"}, PathPrefixes: []string{"/v1/", "/exact"}}
	for _, tc := range []struct {
		method, path string
		ok           bool
	}{
		{"GET", "/v1/models", true},
		{"POST", "/v1/", true},
		{"PUT", "/v1/models", false},
		{"GET", "/v1", false},
		{"GET", "/v2/models", false},
		{"GET", "/v1/../admin", false},
		{"GET", "//v1/x", true}, // cleaned, as documented
		{"GET", "/exact", true},
		{"GET", "/exactly", true}, // a prefix, as documented
		{"GET", "", false},
	} {
		if got := in.InjectsInto(tc.method, tc.path); got != tc.ok {
			t.Errorf("InjectsInto(%s %q) = %v, want %v", tc.method, tc.path, got, tc.ok)
		}
	}
}
