/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package integration_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

var _ = Describe("sandboxclient metrics through the API server and the aggregated API", Label("integration"), func() {
	It("reads a Sandbox's metrics with the shipped roles, and RBAC refuses a user without get sandboxes/metrics", func(ctx context.Context) {
		ns := newNamespace()
		sbx := createSandbox(ns, "box")
		waitReady(sbx)
		m, err := newClient(cfg).Metrics(ctx, sandboxclient.Named(ns, "box"))
		Expect(err).NotTo(HaveOccurred())
		Expect(m.Version).To(Equal(subresource.MetricsVersion))
		Expect(m.Name).To(Equal("box"))
		Expect(m.Memory.Limit).To(BeNumerically(">", 0))
		Expect(m.Pids.Used).To(BeNumerically(">=", 1))

		names, err := newClient(cfg).SandboxNames(ctx, ns)
		Expect(err).NotTo(HaveOccurred())
		Expect(names).To(Equal([]string{"box"}))

		bind(ns, execRole, saSubject(ns, "runner"))
		Eventually(func() error {
			_, err := newClient(serviceAccountConfig(ns, "runner")).Metrics(ctx, sandboxclient.Named(ns, "box"))
			return err
		}, 10*time.Second, 500*time.Millisecond).Should(Succeed())

		// sandbox-reader may read Sandboxes, not their metrics.
		bind(ns, "sandbox-reader", saSubject(ns, "reader"))
		_, err = newClient(serviceAccountConfig(ns, "reader")).Metrics(ctx, sandboxclient.Named(ns, "box"))
		Expect(sandboxclient.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(`"sandboxes/metrics"`))
	}, SpecTimeout(2*time.Minute))
})
