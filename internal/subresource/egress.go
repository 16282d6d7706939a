/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import "time"

// QueryEgress on SubresourceLog (GET ?egress=true&tail=N) asks for the node
// egress proxy's recent decisions about the sandbox instead of its output:
// application/x-ndjson of EgressEvent, oldest first. RBAC: get
// sandboxes/log, as for the output. follow is not supported.
const QueryEgress = "egress"

// EgressEvent is one decision of the node's egress proxy: a request it
// added a credential to, or a connection, query or request it refused. It
// never carries a credential; Host and Path are what the sandbox sent and
// are hostile text to whoever prints them.
type EgressEvent struct {
	Time     time.Time `json:"time"`
	Host     string    `json:"host,omitempty"`
	Port     uint16    `json:"port,omitempty"`
	Method   string    `json:"method,omitempty"`
	Path     string    `json:"path,omitempty"`
	Decision string    `json:"decision"`
	Reason   string    `json:"reason"`
}
