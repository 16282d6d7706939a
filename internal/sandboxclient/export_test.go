package sandboxclient

// WireContract exposes the client's copy of the node API's wire constants,
// so that wire_test.go can compare it with internal/nodeapi's.
var WireContract = map[string]string{
	"PathPrefix":           pathPrefix,
	"SubresourceExec":      subresourceExec,
	"SubresourceFiles":     subresourceFiles,
	"SubresourceLog":       subresourceLog,
	"SubresourceHistory":   subresourceHistory,
	"ContentTypeNDJSON":    contentTypeNDJSON,
	"ContentTypeTar":       contentTypeTar,
	"ContentTypeBinary":    contentTypeBinary,
	"TrailerTransferError": trailerTransferError,
	"StreamStdout":         streamStdout,
	"StreamStderr":         streamStderr,
}

// Frame is the client's copy of nodeapi.Frame.
type Frame = frame
