/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package imagepolicy

import (
	"errors"
	"strings"
	"testing"
)

func TestDefaultPolicy(t *testing.T) {
	allowed := []string{
		"busybox",
		"busybox:1.36",
		"code-sandbox-test/busybox:1",
		"library/python:3@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"docker.io/library/python:3",
		"index.docker.io/library/python:3",
		"ghcr.io/org/image:tag",
		"registry.example.com:5000/team/app",
		"quay.io/org/app",
		"8.8.8.8:5000/x",
		"[2001:4860:4860::8888]:5000/x",
		"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	}
	p := Default()
	for _, ref := range allowed {
		if err := p.Check(ref); err != nil {
			t.Errorf("Check(%q) = %v, want allowed", ref, err)
		}
	}
	refused := map[string]string{
		"127.0.0.1:5000/x":              "loopback",
		"127.0.0.1/x":                   "loopback",
		"127.8.9.10:1/x":                "loopback",
		"[::1]:5000/x":                  "loopback",
		"[::ffff:7f00:1]:5000/x":        "loopback",
		"localhost/x":                   "localhost",
		"localhost:5000/x":              "localhost",
		"LOCALHOST:5000/x":              "localhost",
		"foo.localhost:80/x":            "localhost",
		"10.0.0.5:2379/x":               "private",
		"172.16.3.4/x":                  "private",
		"192.168.1.1:443/x":             "private",
		"[fd00::1]:5000/x":              "private",
		"[fc00::1]/x":                   "private",
		"169.254.169.254/latest":        "link-local",
		"[fe80::1]:80/x":                "link-local",
		"100.64.0.1:80/x":               "shared",
		"100.127.255.254/x":             "shared",
		"0.0.0.0:80/x":                  "unspecified",
		"[::]:80/x":                     "unspecified",
		"239.1.2.3/x":                   "multicast",
		"255.255.255.255/x":             "reserved",
		"[64:ff9b::a00:1]/x":            "NAT64",
		"127.1:5000/x":                  "non-canonical",
		"2130706433:5000/x":             "non-canonical",
		"0x7f000001:5000/x":             "non-canonical",
		"10.0.0.010/x":                  "non-canonical",
		"registry:5000/x":               "single-label",
		"Etcd/x":                        "single-label",
		"metadata.google.internal/x":    "special-use",
		"printer.local:631/x":           "special-use",
		"nas.home.arpa/x":               "special-use",
		"Not A Reference":               "invalid",
		"127.0.0.1:5000/UPPER/case:tag": "invalid",
	}
	for ref, why := range refused {
		err := p.Check(ref)
		if !errors.Is(err, ErrNotAllowed) {
			t.Errorf("Check(%q) = %v, want ErrNotAllowed", ref, err)
			continue
		}
		if !strings.Contains(err.Error(), why) {
			t.Errorf("Check(%q) = %q, want the reason to mention %q", ref, err, why)
		}
	}
}

func TestAllowList(t *testing.T) {
	p, err := New([]string{"127.0.0.1:5000", "localhost", "10.0.0.0/8", "[::1]:5001", "registry", "fd00::7", " "}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{
		"127.0.0.1:5000/x", "[::ffff:7f00:1]:5000/x", "localhost/x", "localhost:1234/x",
		"10.1.2.3:2379/x", "[::1]:5001/x", "registry:80/x", "[fd00::7]:5000/x", "ghcr.io/x",
	} {
		if err := p.Check(ref); err != nil {
			t.Errorf("Check(%q) = %v, want allowed", ref, err)
		}
	}
	for _, ref := range []string{"127.0.0.1:5001/x", "127.0.0.2:5000/x", "[::1]:5000/x", "192.168.0.1/x", "foo.localhost/x"} {
		if err := p.Check(ref); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("Check(%q) = %v, want ErrNotAllowed", ref, err)
		}
	}
}

func TestStrictAllowList(t *testing.T) {
	p, err := New([]string{"registry.corp.example:5000"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check("registry.corp.example:5000/team/app"); err != nil {
		t.Errorf("listed registry refused: %v", err)
	}
	for _, ref := range []string{"busybox", "docker.io/library/busybox", "ghcr.io/x", "registry.corp.example/x", "registry.corp.example:5001/x"} {
		if err := p.Check(ref); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("Check(%q) = %v, want ErrNotAllowed", ref, err)
		}
	}
	p, err = New([]string{"docker.io"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check("busybox"); err != nil {
		t.Errorf("docker.io listed, busybox refused: %v", err)
	}
}

func TestNewRejectsBadEntries(t *testing.T) {
	for _, bad := range []string{"10.0.0.0/33", "http://registry", "reg istry", "host:port", "host:123456", "-bad.example"} {
		if _, err := New([]string{bad}, true); err == nil {
			t.Errorf("New(%q) accepted a bad entry", bad)
		}
	}
}

func TestNilPolicyIsDefault(t *testing.T) {
	var p *Policy
	if err := p.Check("127.0.0.1:5000/x"); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("nil policy allowed a loopback registry: %v", err)
	}
	if err := p.Check("busybox"); err != nil {
		t.Errorf("nil policy refused busybox: %v", err)
	}
}
