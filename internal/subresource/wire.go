/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// URL layout. On a node API every path is below
// /v1/namespaces/{namespace}/sandboxes/{name}/; through the API server (the
// operator's aggregated API) the same subresources are below
// AggregatedPathPrefix{namespace}/sandboxes/{name}/.
const (
	PathPrefix = "/v1/namespaces/"

	// AggregatedGroup and AggregatedVersion are the aggregated API that
	// kube-apiserver proxies to the operator. Callers need RBAC on both this
	// group (kube-apiserver checks it) and sandbox.code-sandbox.dev (the
	// aggregated server checks the same subresource there).
	AggregatedGroup      = "subresources.sandbox.code-sandbox.dev"
	AggregatedVersion    = "v1alpha1"
	AggregatedPathPrefix = "/apis/" + AggregatedGroup + "/" + AggregatedVersion + "/namespaces/"

	// Front-proxy headers: the identity that the aggregated API server
	// authenticated and authorised, as kube-apiserver passes it on.
	HeaderRemoteUser        = "X-Remote-User"
	HeaderRemoteUID         = "X-Remote-Uid"
	HeaderRemoteGroup       = "X-Remote-Group"
	HeaderRemoteExtraPrefix = "X-Remote-Extra-"

	// POST, body execio.Request (JSON); response application/x-ndjson Frames.
	// RBAC: create sandboxes/exec.
	SubresourceExec = "exec"
	// POST ?path=P: body application/x-tar extracts a tree into directory P;
	// body application/octet-stream writes one file at P (?mode=0644).
	// Response: execio.TransferStats (JSON). RBAC: create sandboxes/files.
	// GET ?path=P: response application/x-tar of the file or tree at P, its
	// entries named below P's base name. RBAC: get sandboxes/files.
	SubresourceFiles = "files"
	// POST, body execio.ProcessRequest (JSON): start, list, poll, wait,
	// kill a background process or write its stdin; response
	// execio.ProcessResponse (JSON). RBAC: create sandboxes/processes (for
	// every action: a poll reads a command's output, as exec does).
	SubresourceProcesses = "processes"
	// GET ?tail=N&follow=true: the container's output, text/plain.
	// RBAC: get sandboxes/log.
	SubresourceLog = "log"
	// GET ?tail=N&follow=true: the exec history, application/x-ndjson of
	// history.Record. RBAC: get sandboxes/log.
	SubresourceHistory = "history"

	ContentTypeNDJSON = "application/x-ndjson"
	ContentTypeTar    = "application/x-tar"
	ContentTypeBinary = "application/octet-stream"

	// TrailerTransferError carries an error that happened after a download
	// began streaming (for example the size cap); a client must treat a
	// download with this trailer set as failed.
	TrailerTransferError = "Sandbox-Transfer-Error"
	// TrailerTransferErrorReason is the metav1.StatusReason of the failure
	// in TrailerTransferError (RequestEntityTooLarge for the size cap,
	// ServiceUnavailable, …). Log streams (GET log) that end early carry
	// both trailers too.
	TrailerTransferErrorReason = "Sandbox-Transfer-Error-Reason"
)

// Frame is one line of an exec response. Output frames carry Stream and
// Data; the last frame carries Result, or Error when the command could not
// be run to completion.
type Frame struct {
	// Stream is "stdout" or "stderr".
	Stream string `json:"stream,omitempty"`
	Data   []byte `json:"data,omitempty"`
	// Result ends a successful exec (whatever the command's exit code).
	Result *execio.Result `json:"result,omitempty"`
	// Error ends an exec that failed (Docker unavailable mid-way, …);
	// Status says the same as a typed metav1.Status (its reason, and the
	// cause CauseStreamFailed).
	Error  string         `json:"error,omitempty"`
	Status *metav1.Status `json:"status,omitempty"`
}

// Stream names in frames.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)
