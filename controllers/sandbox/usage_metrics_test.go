/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

// fakeSampler is Docker's answers, scripted: the collector's arithmetic is
// pure logic (the real readings are tested in internal/dockerruntime).
type fakeSampler struct {
	list  []dockerruntime.Container
	stats map[string]dockerruntime.Stats
}

func (f *fakeSampler) ListManaged(context.Context, dockerruntime.ListFilter) ([]dockerruntime.Container, error) {
	return f.list, nil
}

func (f *fakeSampler) Sample(_ context.Context, id string) (dockerruntime.Stats, error) {
	st, ok := f.stats[id]
	if !ok {
		return st, errors.New("gone")
	}
	return st, nil
}

var _ = Describe("UsageCollector (unit)", Label("unit"), Serial, func() {
	ct := func(id, ns, status string) dockerruntime.Container {
		return dockerruntime.Container{ID: id, Labels: map[string]string{dockerruntime.LabelNamespace: ns}, State: dockerruntime.ContainerState{Status: status}}
	}
	It("totals count, CPU (from two readings) and memory per namespace, paused included, and drops namespaces that left", func() {
		t0 := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
		f := &fakeSampler{
			list: []dockerruntime.Container{ct("a1", "team-a", "running"), ct("a2", "team-a", "paused"), ct("b1", "team-b", "running"), ct("x", "team-x", "exited")},
			stats: map[string]dockerruntime.Stats{
				"a1": {At: t0, CPUTotalNanos: 1e9, MemoryBytes: 100},
				"a2": {At: t0, CPUTotalNanos: 5e9, MemoryBytes: 50},
				"b1": {At: t0, CPUTotalNanos: 0, MemoryBytes: 7},
			},
		}
		u := &UsageCollector{Docker: f, Node: "n"}
		u.Collect(context.Background())
		Expect(testutil.ToFloat64(nsSandboxes.WithLabelValues("team-a"))).To(Equal(2.0))
		Expect(testutil.ToFloat64(nsMemory.WithLabelValues("team-a"))).To(Equal(150.0))
		Expect(testutil.ToFloat64(nsCPU.WithLabelValues("team-a"))).To(BeZero(), "one reading is no rate")

		t1 := t0.Add(10 * time.Second)
		f.stats["a1"] = dockerruntime.Stats{At: t1, CPUTotalNanos: 6e9, MemoryBytes: 100} // 0.5 cores
		f.stats["a2"] = dockerruntime.Stats{At: t1, CPUTotalNanos: 5e9, MemoryBytes: 50}  // paused: 0
		f.stats["b1"] = dockerruntime.Stats{At: t1, CPUTotalNanos: 20e9, MemoryBytes: 7}  // 2 cores
		u.Collect(context.Background())
		Expect(testutil.ToFloat64(nsCPU.WithLabelValues("team-a"))).To(BeNumerically("~", 0.5, 1e-9))
		Expect(testutil.ToFloat64(nsCPU.WithLabelValues("team-b"))).To(BeNumerically("~", 2, 1e-9))

		// team-b's sandbox is gone; a restarted container (counter went
		// back) gives no negative rate.
		f.list = []dockerruntime.Container{ct("a1", "team-a", "running")}
		f.stats["a1"] = dockerruntime.Stats{At: t1.Add(10 * time.Second), CPUTotalNanos: 1, MemoryBytes: 100}
		u.Collect(context.Background())
		Expect(testutil.CollectAndCount(nsSandboxes)).To(Equal(1))
		Expect(testutil.ToFloat64(nsCPU.WithLabelValues("team-a"))).To(BeZero())
	})
})
