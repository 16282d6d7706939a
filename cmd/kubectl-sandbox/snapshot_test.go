/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("snapshot and fork arguments", Label("unit"), func() {
	DescribeTable("are refused before anything is sent",
		func(want string, args ...string) {
			c := newCLI()
			code, out, errOut := c.run("", args...)
			Expect(code).To(Equal(exitError))
			Expect(out).To(BeEmpty())
			Expect(errOut).To(ContainSubstring(want))
			_, called := c.cluster.LastSubresourceRequest()
			Expect(called).To(BeFalse())
		},
		Entry("fork --count 0", "--count must be between 1 and 16, not 0", "fork", "box", "--count", "0"),
		Entry("fork --count 17", "--count must be between 1 and 16, not 17", "fork", "box", "--count", "17"),
		Entry("fork without a name", "fork takes one sandbox name (got 0 arguments)", "fork"),
		Entry("fork of a bad name", `invalid sandbox name "../x"`, "fork", "../x", "--count", "1"),
		Entry("fork from a bad snapshot name", `invalid snapshot name "A/B"`, "fork", "box", "--snapshot", "A/B"),
		Entry("snapshot with a bad name", `invalid snapshot name "../../etc"`, "snapshot", "box", "--name", "../../etc"),
		Entry("snapshot of two sandboxes", "snapshot takes one sandbox name (got 2 arguments)", "snapshot", "a", "b"),
	)

	It("truncates generated name prefixes", func() {
		Expect(truncateName("short", 47)).To(Equal("short"))
		long := "a123456789012345678901234567890123456789012345-.xyz"
		Expect(len(truncateName(long, 47))).To(BeNumerically("<=", 47))
		Expect(truncateName(long, 47)).NotTo(HaveSuffix("-"))
	})
})
