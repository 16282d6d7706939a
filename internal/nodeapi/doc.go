// Package nodeapi is the manager's data plane: an HTTPS API on each node
// that runs commands in, moves files into and out of, and reads the logs of
// the Sandboxes on that node. It authenticates callers as kubelet does
// (TokenReview, or a client certificate from the cluster's client CA) and
// authorises every request with a SubjectAccessReview on the Sandbox's
// subresource, so RBAC decides who may exec.
package nodeapi
