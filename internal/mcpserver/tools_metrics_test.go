package mcpserver

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Metrics makes the fake a contract.MetricsBackend: a sandbox at half its
// CPU limit.
func (f *fakeBackend) Metrics(_ context.Context, caller contract.Caller, id string) (contract.Metrics, error) {
	if err := f.called("Metrics"); err != nil {
		return contract.Metrics{}, err
	}
	if _, err := f.get(caller, id); err != nil {
		return contract.Metrics{}, err
	}
	return contract.Metrics{ContainerID: id, CPUCores: 0.5, CPULimitCores: 1, CPUPercentOfLimit: 50,
		MemoryBytes: 1 << 20, MemoryLimitBytes: 512 << 20, Pids: 2, PidsLimit: 256,
		WritablePaths: []contract.PathLimit{{Path: "/app", LimitBytes: 256 << 20}}}, nil
}

var _ = Describe("sandbox_metrics on a fake backend", Label("unit"), func() {
	It("returns the backend's reading, structured and as text, for the caller's sandbox only", func() {
		h := newToolHarness(Config{})
		id := h.fake.add("alice")
		res := h.call("alice", "sandbox_metrics", jsonArgs(map[string]any{"container_id": id}))
		Expect(res.IsError).To(BeFalse(), res.Text)
		var m contract.Metrics
		res.into(&m)
		Expect(m.ContainerID).To(Equal(id))
		Expect(m.CPUPercentOfLimit).To(Equal(50.0))
		Expect(res.Text).To(ContainSubstring("cpu: 0.500 of 1 cores (50%)"))

		res = h.call("mallory", "sandbox_metrics", jsonArgs(map[string]any{"container_id": id}))
		Expect(res.IsError).To(BeTrue())
		Expect(res.Text).To(ContainSubstring("not found"))
		for _, bad := range []string{`{}`, `{"container_id":""}`, `{"container_id":"../x"}`, `{"container_id":7}`} {
			res = h.call("alice", "sandbox_metrics", bad)
			Expect(res.IsError).To(BeTrue(), bad)
		}
	})
})
