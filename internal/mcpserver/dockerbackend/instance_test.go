//go:build linux

package dockerbackend

import (
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Instance", Label("unit"), func() {
	It("round-trips through its string form", func() {
		in := Instance{Host: "host:with:colons", Boot: "abc", PID: 42, Start: 99}
		out, ok := ParseInstance(in.String())
		Expect(ok).To(BeTrue(), "round trip: %+v", out)
		Expect(out).To(Equal(in), "round trip")
	})

	DescribeTable("ParseInstance refuses what is not an MCP instance",
		func(bad string) {
			_, ok := ParseInstance(bad)
			Expect(ok).To(BeFalse(), "ParseInstance(%q) accepted", bad)
		},
		Entry("empty", ""),
		Entry("a node name", "n1"),
		Entry("a bare prefix", "mcp:"),
		Entry("a non-numeric PID", "mcp:h:b:x:1"),
		Entry("PID zero", "mcp:h:b:0:1"),
		Entry("another prefix", "code-sandbox:h:b:1:1"),
	)

	It("tells live, dead and unknown instances apart", func() {
		self, err := CurrentInstance()
		Expect(err).NotTo(HaveOccurred())
		Expect(self.Check(self)).To(Equal(Alive), "self")
		other := self
		other.Host = "elsewhere"
		Expect(self.Check(other)).To(Equal(Unknown), "other host")
		other = self
		other.Boot = "previous-boot"
		Expect(self.Check(other)).To(Equal(Unknown), "other boot")
		// The parent is alive; with another start time it is a reused PID.
		parent := self
		parent.PID = os.Getppid()
		parent.Start, _ = processStart(parent.PID)
		Expect(self.Check(parent)).To(Equal(Alive), "parent")
		parent.Start++
		Expect(self.Check(parent)).To(Equal(Dead), "reused PID")
		gone := self
		gone.PID = 1 << 30
		Expect(self.Check(gone)).To(Equal(Dead), "missing PID")
	})
})
