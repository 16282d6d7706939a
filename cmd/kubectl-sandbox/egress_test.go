/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

var _ = Describe("Egress decision lines", Label("unit"), func() {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	DescribeTable("render one decision per line, quoting what the sandbox sent",
		func(ev subresource.EgressEvent, want string) {
			Expect(formatEgressEvent(ev)).To(Equal(want))
		},
		Entry("a refusal", subresource.EgressEvent{Time: t0, Host: "evil.org", Port: 443, Decision: "Refused", Reason: "NotAllowed"},
			"2026-11-28T10:00:00Z Refused NotAllowed evil.org:443"),
		Entry("an injection", subresource.EgressEvent{Time: t0, Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/x", Decision: "Injected", Reason: "Injected"},
			"2026-11-28T10:00:00Z Injected Injected api.example.com:443 GET /v1/x"),
		Entry("no host (a raw IP without SNI)", subresource.EgressEvent{Time: t0, Port: 443, Decision: "Refused", Reason: "NoSNI"},
			"2026-11-28T10:00:00Z Refused NoSNI -:443"),
		Entry("terminal escapes and newlines in a path", subresource.EgressEvent{Time: t0, Host: "a.example.com", Port: 80, Method: "GET", Path: "/\x1b[2J\nRefused fake", Decision: "Refused", Reason: "NotAllowed"},
			`2026-11-28T10:00:00Z Refused NotAllowed a.example.com:80 GET "/\x1b[2J\nRefused fake"`),
		Entry("a space in a host", subresource.EgressEvent{Time: t0, Host: "a b", Decision: "Refused", Reason: "NotAllowed"},
			`2026-11-28T10:00:00Z Refused NotAllowed "a b"`),
	)
})
