package session

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Metrics makes the fake a MetricsReader; it reports whether the sandbox
// is frozen, as a real driver reads it from the host.
func (f *fakeDriver) Metrics(_ context.Context, h Handle) (contract.Metrics, error) {
	f.record("Metrics", &h)
	return contract.Metrics{Paused: f.isPaused(h.Ref)}, nil
}

var _ = Describe("Manager.Metrics", Label("unit"), func() {
	It("reads an idle-paused sandbox without resuming it, and the read is no use", func(ctx SpecContext) {
		d := newFakeDriver()
		clock := &fakeClock{t: t0}
		m := newManager(d, clock, Options{IdleTimeout: 10 * time.Minute, IdlePause: 2 * time.Minute})
		sb := create(m, alice, time.Hour)
		clock.Advance(3 * time.Minute)
		m.reap(clock.Now())
		Expect(d.isPaused("ref-1")).To(BeTrue())
		before := m.activity("alice", sb.ID).LastUsedAt

		met, err := m.Metrics(ctx, alice, sb.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(met.ContainerID).To(Equal(sb.ID))
		Expect(met.Paused).To(BeTrue())
		Expect(d.isPaused("ref-1")).To(BeTrue(), "reading metrics must not resume")
		Expect(d.callList()).NotTo(ContainElement("Resume " + sb.ID))
		Expect(m.activity("alice", sb.ID).LastUsedAt).To(Equal(before), "reading metrics is not use")

		_, err = m.Metrics(ctx, contract.Caller{ID: "mallory"}, sb.ID)
		Expect(errors.Is(err, contract.ErrNotFound)).To(BeTrue(), "%v", err)
		_, err = m.Metrics(ctx, alice, "no-such")
		Expect(errors.Is(err, contract.ErrNotFound)).To(BeTrue(), "%v", err)
	})
})
