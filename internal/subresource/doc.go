/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package subresource is the one home of the Sandbox subresource API
// (exec, files, log, history): its URL layout, content types and exec
// frames, its route parsing, its metav1.Status and cause vocabulary, and
// the one check of whether a Sandbox can take commands and files.
//
// The two servers import it as siblings: the aggregated API server
// (internal/aggregatedapi, control plane) and the node API
// (internal/nodeapi, on every node), neither importing the other, as
// KubeVirt's virt-api imports nothing from virt-handler. Its clients
// (internal/sandboxclient, the kubectl plugin, the MCP server) and the
// tests' fake API server (sandboxclienttest) import it too. So it imports
// only api/v1alpha1, the leaf packages it describes (execio, warmpool's
// membership test) and apimachinery: no server, no controller-runtime
// client, nothing that talks to Docker.
package subresource
