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
	It("defaults to the docker backend's pool of one; 0 turns it off", func() {
		Expect(DefaultConfig().dockerWarmPool()).To(Equal(dockerbackend.DefaultWarmPool))
		Expect(configWith(func(o *Config) { o.WarmPool = "0" }).dockerWarmPool()).To(BeZero())
	})

	It("refuses a negative, absurd or non-numeric size, and a pool name that is not a name on the kubernetes backend", func() {
		for _, c := range []struct{ backend, pool string }{
			{"docker", "-1"},
			{"docker", "65"},
			{"docker", "python-pool"},
			{"kubernetes", "Not_A_Name"},
		} {
			err := startupError(func(o *Config) { o.Backend, o.WarmPool = c.backend, c.pool }, loopbackNoAuth)
			Expect(err).To(HaveOccurred(), "started with %+v", c)
			Expect(isUsageError(err)).To(BeTrue(), "%+v: want a usage error, got %v", c, err)
			Expect(err.Error()).To(ContainSubstring("--warm-pool"))
		}
		err := startupError(func(o *Config) { o.Backend, o.WarmPool = "kubernetes", "Not_A_Name" }, loopbackNoAuth)
		Expect(err).To(MatchError(ContainSubstring("names a SandboxWarmPool")))
	})
})
