/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerbackend

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

var _ = Describe("egress_allow on the Docker backend", Label("docker"), func() {
	It("is refused, never ignored, and creates nothing", func(ctx SpecContext) {
		b := poolBackend(0)
		caller := contract.Caller{ID: "egress-allow-test"}
		_, err := b.Create(ctx, caller, contract.CreateRequest{Image: testenv.PythonImage, Network: contract.NetworkEgress,
			EgressAllow: []string{"pypi.org"}})
		Expect(err).To(MatchError(contract.ErrInvalid))
		Expect(err).To(MatchError(ContainSubstring("egress_allow is not supported on the Docker backend")))
		list, err := b.List(ctx, caller)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
	})
})
