package sandboxclient

import "github.com/code-sandbox/code-sandbox-operator/internal/execio"

// The node API's wire contract, mirrored from internal/nodeapi (wire.go).
// The client keeps its own copy so that it, and the kubectl plugin, do not
// link the server (k8s.io/apiserver, the Docker client); wire_test.go fails
// when the two drift apart.
const (
	pathPrefix           = "/v1/namespaces/"
	subresourceExec      = "exec"
	subresourceFiles     = "files"
	subresourceLog       = "log"
	subresourceHistory   = "history"
	contentTypeNDJSON    = "application/x-ndjson"
	contentTypeTar       = "application/x-tar"
	contentTypeBinary    = "application/octet-stream"
	trailerTransferError = "Sandbox-Transfer-Error"
	streamStdout         = "stdout"
	streamStderr         = "stderr"
)

// frame is one line of an exec response (nodeapi.Frame).
type frame struct {
	Stream string         `json:"stream,omitempty"`
	Data   []byte         `json:"data,omitempty"`
	Result *execio.Result `json:"result,omitempty"`
	Error  string         `json:"error,omitempty"`
}
