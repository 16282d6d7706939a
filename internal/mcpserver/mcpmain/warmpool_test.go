/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
)

var _ = Describe("--warm-pool", func() {
	It("defaults to the docker backend's pool of one and remembers whether it was given", func() {
		o := parseFlags()
		Expect(o.warmPool.count()).To(Equal(dockerbackend.DefaultWarmPool))
		Expect(o.warmPool.set).To(BeFalse())
		o = parseFlags("--warm-pool", "0")
		Expect(o.warmPool.count()).To(BeZero())
		Expect(o.warmPool.set).To(BeTrue())
	})

	It("refuses a negative, absurd or non-numeric size, and a pool name that is not a name on the kubernetes backend", func() {
		for _, args := range [][]string{
			{"--backend", "docker", "--warm-pool", "-1"},
			{"--backend", "docker", "--warm-pool", "65"},
			{"--backend", "docker", "--warm-pool", "python-pool"},
			{"--backend", "kubernetes", "--warm-pool", "Not_A_Name"},
		} {
			err := startupError(append(args, "--http", "127.0.0.1:0", "--auth", "none")...)
			Expect(err).To(HaveOccurred(), "started with %q", args)
			Expect(isUsageError(err)).To(BeTrue(), "%q: want a usage error, got %v", args, err)
			Expect(err.Error()).To(ContainSubstring("--warm-pool"))
		}
		err := startupError("--backend", "kubernetes", "--warm-pool", "Not_A_Name", "--http", "127.0.0.1:0", "--auth", "none")
		Expect(err).To(MatchError(ContainSubstring("names a SandboxWarmPool")))
	})
})
