package dockerruntime

import (
	"regexp"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Fresh identity", dockerLabel, func() {
	It("gives every sandbox its own read-only /etc/machine-id and hostname, and removes the machine-id with the container", func(ctx SpecContext) {
		ids := map[string]bool{}
		hosts := map[string]bool{}
		var last Container
		for i, img := range []string{busyboxImage, busyboxImage, pythonImage} {
			ct, spec := startSandbox(ctx, func(s *Spec) { s.Image = img; s.Owner.Name = "box-" + string(rune('a'+i)) })
			r := sh(ctx, ct.ID, `cat /etc/machine-id; hostname; echo x >/etc/machine-id && echo WROTE`)
			Expect(r.Stdout).NotTo(ContainSubstring("WROTE"), r.String())
			lines := regexp.MustCompile(`\n`).Split(r.Stdout, -1)
			Expect(lines[0]).To(MatchRegexp(`^[0-9a-f]{32}$`), r.String())
			Expect(lines[1]).To(Equal(Hostname(spec.Owner)))
			ids[lines[0]] = true
			hosts[lines[1]] = true
			last = ct
		}
		Expect(ids).To(HaveLen(3), "machine-ids repeat")
		Expect(hosts).To(HaveLen(3), "hostnames repeat")

		info, err := rt.Docker().ContainerInspect(ctx, last.ID)
		Expect(err).NotTo(HaveOccurred())
		var vol string
		for _, m := range info.Mounts {
			if v := MachineIDVolumeOf(m.Destination, m.Source); v != "" {
				vol = v
			}
		}
		Expect(vol).NotTo(BeEmpty())
		_, err = rt.Docker().VolumeInspect(ctx, vol)
		Expect(err).NotTo(HaveOccurred())
		Expect(rt.Remove(ctx, last.ID, 0)).To(Succeed())
		_, err = rt.Docker().VolumeInspect(ctx, vol)
		Expect(cerrdefs.IsNotFound(err)).To(BeTrue(), "the machine-id volume outlived its container: %v", err)
	}, SpecTimeout(90*time.Second))

	It("sweeps machine-id volumes no container mounts, and keeps those in use", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		info, err := rt.Docker().ContainerInspect(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		var inUse string
		for _, m := range info.Mounts {
			if v := MachineIDVolumeOf(m.Destination, m.Source); v != "" {
				inUse = v
			}
		}
		Expect(inUse).NotTo(BeEmpty())
		orphans, err := rt.prepareMachineIDs(ctx, 2)
		Expect(err).NotTo(HaveOccurred())
		// Age 0 here (an hour in use): this also takes rt's ready ones,
		// so rt drops them after.
		rt.sweepMachineIDs(ctx, 0)
		rt.ReleaseMachineIDs(ctx)
		for _, o := range orphans {
			_, err := rt.Docker().VolumeInspect(ctx, o.volume)
			Expect(cerrdefs.IsNotFound(err)).To(BeTrue(), "orphan %s survived the sweep", o.volume)
		}
		_, err = rt.Docker().VolumeInspect(ctx, inUse)
		Expect(err).NotTo(HaveOccurred(), "the sweep removed a mounted machine-id")
		Expect(sh(ctx, ct.ID, `cat /etc/machine-id`).Stdout).To(MatchRegexp(`^[0-9a-f]{32}\n$`))
		// The next create works (rt writes a fresh one).
		startSandbox(ctx, nil)
	}, SpecTimeout(90*time.Second))

	It("writes machine-ids ahead, in batches, and removes the unused ones on Close", func(ctx SpecContext) {
		c, err := New(Options{})
		Expect(err).NotTo(HaveOccurred())
		_, first, err := c.machineIDMount(ctx) // none ready: its own, and a refill starts
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { _ = c.removeMachineID(ctx, first) })
		Eventually(func() int {
			c.machineIDs.mu.Lock()
			defer c.machineIDs.mu.Unlock()
			return len(c.machineIDs.ready)
		}).WithTimeout(30 * time.Second).Should(Equal(machineIDPoolSize))
		seen := map[string]bool{first: true}
		for range 3 {
			t0 := time.Now()
			m, v, err := c.machineIDMount(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(time.Since(t0)).To(BeNumerically("<", 50*time.Millisecond), "a ready machine-id is taken without a Docker call")
			Expect(seen).NotTo(HaveKey(v))
			seen[v] = true
			Expect(m.Target).To(Equal("/etc/machine-id"))
			Expect(m.ReadOnly).To(BeTrue())
			DeferCleanup(func(ctx SpecContext) { _ = c.removeMachineID(ctx, v) })
		}
		c.machineIDs.mu.Lock()
		ready := append([]preparedID(nil), c.machineIDs.ready...)
		c.machineIDs.mu.Unlock()
		Expect(ready).NotTo(BeEmpty())
		Expect(c.Close()).To(Succeed())
		c2, err := New(Options{})
		Expect(err).NotTo(HaveOccurred())
		defer c2.Close()
		for _, id := range ready {
			_, err := c2.Docker().VolumeInspect(ctx, id.volume)
			Expect(cerrdefs.IsNotFound(err)).To(BeTrue(), "ready volume %s outlived Close", id.volume)
		}
	}, SpecTimeout(90*time.Second))
})

func TestOrphanFiller(t *testing.T) {
	tools := map[string]string{LabelManagedBy: ManagedByValue + "-tools"}
	old := time.Now().Add(-fillerOrphanAge - time.Second)
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		state   string
		created time.Time
		want    bool
	}{
		{"a never-started filler left by a killed process", tools, "created", old, true},
		{"a filler in use right now", tools, "created", time.Now(), false},
		{"a started container is no filler", tools, "running", old, false},
		{"a sandbox", map[string]string{LabelManagedBy: ManagedByValue}, "created", old, false},
		{"someone else's container", map[string]string{"x": "y"}, "created", old, false},
	} {
		if got := orphanFiller(tc.labels, tc.state, tc.created); got != tc.want {
			t.Errorf("%s: orphanFiller = %v, want %v", tc.name, got, tc.want)
		}
	}
}
