// Package nodeapi is the manager's data plane: an HTTPS API on each node
// that runs commands in, moves files into and out of, and reads the logs of
// the Sandboxes on that node. It serves one client, the operator's
// aggregated API server (internal/aggregatedapi), over mutual TLS with the
// operator CA: the serving certificate names the node, the client
// certificate must be the aggregated server's, and the end user, already
// authenticated by kube-apiserver and authorised by the aggregated server,
// arrives in front-proxy headers. A node never sees a caller's credential.
package nodeapi
