/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"encoding/json"
	"net/http"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// EgressEventsOf adapts the node's egress proxy to Config.EgressEvents. The
// proxy's events carry no secret (egressproxy.Event); this copies the
// fields one by one, so a field added there later is not served until it
// is added here.
func EgressEventsOf(p interface {
	Recent(sandbox string) []egressproxy.Event
}) func(string) []subresource.EgressEvent {
	return func(sandbox string) []subresource.EgressEvent {
		evs := p.Recent(sandbox)
		out := make([]subresource.EgressEvent, len(evs))
		for i, e := range evs {
			out[i] = subresource.EgressEvent{Time: e.Time, Host: e.Host, Port: e.Port, Method: e.Method, Path: e.Path,
				Decision: e.Decision, Reason: e.Reason}
		}
		return out
	}
}

// serveEgressLog serves log?egress: the proxy's recent decisions about the
// Sandbox, NDJSON of subresource.EgressEvent, oldest first (?tail=N: the
// last N).
func (s *Server) serveEgressLog(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox) {
	tail, follow, perr := tailFollow(r)
	if perr != nil {
		writeError(w, perr)
		return
	}
	if follow {
		writeError(w, badRequest("follow is not supported with egress: the proxy keeps the recent decisions only"))
		return
	}
	if s.cfg.EgressEvents == nil {
		writeError(w, notFound("node %s runs no egress proxy, so it has no egress decisions of sandbox %s/%s", s.cfg.NodeName, sbx.Namespace, sbx.Name))
		return
	}
	evs := s.cfg.EgressEvents(sbx.Namespace + "/" + sbx.Name)
	if tail > 0 && len(evs) > tail {
		evs = evs[len(evs)-tail:]
	}
	w.Header().Set("Content-Type", subresource.ContentTypeNDJSON)
	enc := json.NewEncoder(w)
	for i := range evs {
		if err := enc.Encode(&evs[i]); err != nil {
			return
		}
	}
}
