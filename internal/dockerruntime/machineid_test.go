package dockerruntime

import (
	"regexp"
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
		vol := MachineIDVolume(info.Name)
		_, err = rt.Docker().VolumeInspect(ctx, vol)
		Expect(err).NotTo(HaveOccurred())
		Expect(rt.Remove(ctx, last.ID, 0)).To(Succeed())
		_, err = rt.Docker().VolumeInspect(ctx, vol)
		Expect(cerrdefs.IsNotFound(err)).To(BeTrue(), "the machine-id volume outlived its container: %v", err)
	}, SpecTimeout(90*time.Second))
})
