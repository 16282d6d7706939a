/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package aggregatedapi

import (
	"crypto/tls"
	"net/http"
	"strings"
)

// isUpgrade reports whether r asks for an HTTP/1.1 upgrade (portforward).
func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// upgradeTransport is the node's transport (same client certificate, same
// verification of the node) restricted to HTTP/1.1, which an upgrade
// needs, for the one connection the upgrade takes over: not pooled.
func (s *Server) upgradeTransport(node, host string) *http.Transport {
	t := s.transport(node, host).Clone()
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	t.TLSClientConfig.NextProtos = []string{"http/1.1"}
	t.DisableKeepAlives = true
	return t
}
