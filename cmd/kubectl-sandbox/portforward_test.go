/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("port-forward's [LOCAL:]REMOTE", Label("unit"), func() {
	It("reads REMOTE, LOCAL:REMOTE and :REMOTE", func() {
		for arg, want := range map[string][2]int{"8000": {8000, 8000}, "9090:8000": {9090, 8000}, ":8000": {0, 8000}, "1:65535": {1, 65535}} {
			local, remote, err := parsePortPair(arg)
			Expect(err).NotTo(HaveOccurred(), arg)
			Expect([2]int{local, remote}).To(Equal(want), arg)
		}
	})
	It("refuses ports outside 1-65535 and non-numbers, naming which side", func() {
		for arg, side := range map[string]string{"0": "remote", "65536": "remote", "x": "remote", "8000:": "remote", "0:80": "local", "a:80": "local", "70000:80": "local", "": "remote"} {
			_, _, err := parsePortPair(arg)
			Expect(err).To(MatchError(HavePrefix(side+" port")), arg)
		}
	})
})
