/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpserver

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

var _ = Describe("sandbox_initialize's egress_allow", Label("unit"), func() {
	cfg := testConfig()
	egress := cfg
	egress.AllowEgress = true

	It("is refused unless the server allows egress", func() {
		_, err := initializeArgs{EgressAllow: []string{"pypi.org"}}.createRequest(cfg)
		Expect(err).To(MatchError(errArgs))
		Expect(err).To(MatchError(ContainSubstring(`egress_allow needs network "egress", which is disabled on this server (it was started without --allow-egress)`)))
	})

	It("implies network egress and passes the names on", func() {
		req, err := initializeArgs{EgressAllow: []string{"pypi.org", "*.pythonhosted.org"}}.createRequest(egress)
		Expect(err).NotTo(HaveOccurred())
		Expect(req.Network).To(Equal(contract.NetworkEgress))
		Expect(req.EgressAllow).To(Equal([]string{"pypi.org", "*.pythonhosted.org"}))
		req, err = initializeArgs{Network: "egress", EgressAllow: []string{"pypi.org"}}.createRequest(egress)
		Expect(err).NotTo(HaveOccurred())
		Expect(req.EgressAllow).To(Equal([]string{"pypi.org"}))
		req, err = initializeArgs{Network: "egress"}.createRequest(egress)
		Expect(err).NotTo(HaveOccurred())
		Expect(req.EgressAllow).To(BeNil(), "no egress_allow keeps unrestricted egress")
	})

	DescribeTable("refuses bad names with a message naming the problem",
		func(args initializeArgs, want string) {
			_, err := args.createRequest(egress)
			Expect(err).To(MatchError(errArgs))
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("with network none", initializeArgs{Network: "none", EgressAllow: []string{"pypi.org"}}, `network is "none"`),
		Entry("an empty list", initializeArgs{EgressAllow: []string{}}, "egress_allow is empty"),
		Entry("a bare *", initializeArgs{EgressAllow: []string{"*"}}, `host "*" is not a DNS name`),
		Entry("*.com", initializeArgs{EgressAllow: []string{"*.com"}}, `host "*.com" is not a DNS name`),
		Entry("a.*.com", initializeArgs{EgressAllow: []string{"a.*.com"}}, `host "a.*.com" is not a DNS name`),
		Entry("an IPv4 literal", initializeArgs{EgressAllow: []string{"169.254.169.254"}}, `host "169.254.169.254" is not a DNS name`),
		Entry("an IPv6 literal", initializeArgs{EgressAllow: []string{"[::1]"}}, `host "[::1]" is not a DNS name`),
		Entry("upper case", initializeArgs{EgressAllow: []string{"PyPI.org"}}, `host "PyPI.org" must be lower case`),
		Entry("a trailing dot", initializeArgs{EgressAllow: []string{"pypi.org."}}, `host "pypi.org." must not end with a dot`),
		Entry("a single label", initializeArgs{EgressAllow: []string{"localhost"}}, `host "localhost" is not a DNS name`),
		Entry("a URL", initializeArgs{EgressAllow: []string{"https://pypi.org/simple"}}, `is not a DNS name`),
		Entry("a port", initializeArgs{EgressAllow: []string{"pypi.org:443"}}, `is not a DNS name`),
		Entry("an empty name", initializeArgs{EgressAllow: []string{""}}, "an empty host name"),
		Entry("a name twice", initializeArgs{EgressAllow: []string{"pypi.org", "pypi.org"}}, `names "pypi.org" twice`),
		Entry("a huge name", initializeArgs{EgressAllow: []string{strings.Repeat("a.", 200) + "com"}}, "longer than 253 characters"),
		Entry("too many names", initializeArgs{EgressAllow: hostsN(contract.MaxEgressAllow + 1)}, "egress_allow names 65 hosts; at most 64"),
	)

	It("takes exactly the limit", func() {
		_, err := initializeArgs{EgressAllow: hostsN(contract.MaxEgressAllow)}.createRequest(egress)
		Expect(err).NotTo(HaveOccurred())
	})

	It("is advertised only where egress is allowed", func() {
		off, _ := sandboxInitializeTool(&deps{cfg: cfg})
		Expect(off.InputSchema.Properties).NotTo(HaveKey("egress_allow"))
		on, _ := sandboxInitializeTool(&deps{cfg: egress})
		Expect(on.InputSchema.Properties).To(HaveKey("egress_allow"))
	})
})

func hostsN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d.example.com", i)
	}
	return out
}
