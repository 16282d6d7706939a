package sandboxclient_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// The client mirrors the wire contract instead of importing the server;
// these specs fail as soon as the two disagree.
var _ = Describe("The client's copy of the node API wire contract", Label("unit"), func() {
	It("has the server's constants", func() {
		Expect(sandboxclient.WireContract).To(Equal(map[string]string{
			"PathPrefix":           nodeapi.PathPrefix,
			"SubresourceExec":      nodeapi.SubresourceExec,
			"SubresourceFiles":     nodeapi.SubresourceFiles,
			"SubresourceLog":       nodeapi.SubresourceLog,
			"SubresourceHistory":   nodeapi.SubresourceHistory,
			"ContentTypeNDJSON":    nodeapi.ContentTypeNDJSON,
			"ContentTypeTar":       nodeapi.ContentTypeTar,
			"ContentTypeBinary":    nodeapi.ContentTypeBinary,
			"TrailerTransferError": nodeapi.TrailerTransferError,
			"StreamStdout":         nodeapi.StreamStdout,
			"StreamStderr":         nodeapi.StreamStderr,
		}))
	})

	It("encodes frames exactly as the server does", func() {
		frames := []nodeapi.Frame{
			{Stream: nodeapi.StreamStdout, Data: []byte("out\x00\xff")},
			{Result: &execio.Result{ExitCode: 3, DurationMillis: 12, TimedOut: true, StdoutTruncated: true, StdoutBytes: 7}},
			{Error: "docker went away"},
		}
		for _, f := range frames {
			server, err := json.Marshal(f)
			Expect(err).NotTo(HaveOccurred())
			var mine sandboxclient.Frame
			Expect(json.Unmarshal(server, &mine)).To(Succeed())
			back, err := json.Marshal(mine)
			Expect(err).NotTo(HaveOccurred())
			Expect(back).To(MatchJSON(server))
		}
	})
})
