/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerbackend

import (
	"context"
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

var _ = Describe("sandbox metrics on the Docker backend", Label("docker"), func() {
	It("reads a sandbox's figures, also while it is paused, without waking it, for its owner only", func(ctx SpecContext) {
		b := poolBackend(0)
		caller := contract.Caller{ID: "metrics-test"}
		sb, err := b.Create(ctx, caller, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		m, err := b.Metrics(ctx, caller, sb.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(m.ContainerID).To(Equal(sb.ID))
		Expect(m.Paused).To(BeFalse())
		Expect(m.MemoryLimitBytes).To(BeNumerically(">", 0))
		Expect(m.CPULimitCores).To(BeNumerically(">", 0))
		Expect(m.Pids).To(BeNumerically(">=", 1))
		Expect(m.WritablePaths).To(HaveLen(3))
		Expect(m.Network).To(BeNil(), "a sandbox without network access has no interface to count")

		_, err = b.Metrics(ctx, contract.Caller{ID: "mallory"}, sb.ID)
		Expect(errors.Is(err, contract.ErrNotFound)).To(BeTrue(), "%v", err)

		cts := containersOfRun(ctx, b)
		Expect(cts).To(HaveLen(1))
		Expect(b.driver.docker.Pause(ctx, cts[0].ID)).To(Succeed())
		m, err = b.Metrics(ctx, caller, sb.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(m.Paused).To(BeTrue())
		ct, err := b.driver.docker.Inspect(context.Background(), cts[0].ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(ct.State.Paused).To(BeTrue(), "reading metrics must not unpause")
		Expect(b.driver.docker.Unpause(ctx, cts[0].ID)).To(Succeed())
	}, SpecTimeout(2*60e9))
})
