package sandboxhelper

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

var _ = Describe("serve's dial requests", unit, func() {
	DescribeTable("are a command or a dial to a port in 1-65535, never both",
		func(payload, wantErr string) {
			_, err := parseServeRequest(helperproto.FrameRequest, []byte(payload))
			if wantErr == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(err).To(MatchError(ContainSubstring(wantErr)))
		},
		Entry("a dial", `{"id":"dial-8080","dialPort":8080}`, ""),
		Entry("a command", `{"id":"r1","argv":["true"]}`, ""),
		Entry("neither", `{"id":"r1"}`, "no command"),
		Entry("both", `{"id":"r1","argv":["true"],"dialPort":80}`, "not both"),
		Entry("port 65536", `{"id":"r1","dialPort":65536}`, "not in 1-65535"),
		Entry("port -1", `{"id":"r1","dialPort":-1}`, "not in 1-65535"),
	)
})
