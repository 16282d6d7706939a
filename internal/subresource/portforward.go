/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	"net/http"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The portforward subresource: POST
// .../sandboxes/{name}/portforward?port=N with "Connection: Upgrade" and
// "Upgrade: PortForwardProtocol". The node answers 101 Switching Protocols
// and the connection then carries the bytes of one TCP connection to
// 127.0.0.1:N inside the sandbox, both ways, until either end closes (a
// half-close is passed on). One forwarded connection is one request, as
// with an HTTP/1.1 upgrade through kube-apiserver's aggregator and the
// aggregated API server's proxy, which pass upgraded connections on as
// they pass exec streams. It is authorised as create on
// sandboxes/portforward, like pods/portforward.
const (
	SubresourcePortForward = "portforward"
	// PortForwardProtocol is the Upgrade token.
	PortForwardProtocol = "code-sandbox-portforward.v1"
	// QueryPort names the port.
	QueryPort = "port"
)

// Causes of a refused portforward.
const (
	// CauseInvalidPortForward: not an upgrade to PortForwardProtocol, or
	// no port in 1-65535 (the cause's field says which).
	CauseInvalidPortForward metav1.CauseType = "InvalidPortForward"
	// CausePortClosed: nothing listens on the port inside the sandbox.
	CausePortClosed metav1.CauseType = "PortClosed"
)

// ParsePortForward checks that r asks for an upgrade to
// PortForwardProtocol and returns its port (1-65535).
func ParsePortForward(r *http.Request) (int, *Error) {
	if !headerHasToken(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), PortForwardProtocol) {
		return 0, badRequest("portforward needs an HTTP/1.1 upgrade: Connection: Upgrade and Upgrade: %s", PortForwardProtocol).Because(CauseInvalidPortForward, "Upgrade")
	}
	v := r.URL.Query().Get(QueryPort)
	port, err := strconv.Atoi(v)
	if err != nil || port < 1 || port > 65535 {
		return 0, badRequest("portforward needs ?%s= a TCP port from 1 to 65535, got %q", QueryPort, v).Because(CauseInvalidPortForward, QueryPort)
	}
	return port, nil
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
