/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Route is a parsed subresource request: which Sandbox, which subresource,
// and the RBAC check it needs on sandbox.code-sandbox.dev. The node API and
// the aggregated API server parse paths with it, so both agree on names,
// methods and permissions.
type Route struct {
	Namespace, Name string
	Subresource     string
	// RBACSubresource is the subresource authorised; history is authorised
	// as log.
	RBACSubresource string
	// Verb is the RBAC verb: create for POST, get for GET.
	Verb string
}

// ParseRoute reads prefix{namespace}/sandboxes/{name}/{subresource} from
// the request's path and checks the method. A request that names no valid
// route is a BadRequest (bad names), a NotFound with the cause
// CauseNoSuchEndpoint (no such path or subresource), or a
// MethodNotAllowed; the error says what is wrong.
func ParseRoute(prefix string, r *http.Request) (Route, *Error) {
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 4 || parts[1] != "sandboxes" {
		return Route{}, noSuchEndpoint("no such endpoint %q; this API serves %s{namespace}/sandboxes/{name}/{exec|processes|files|log|history|portforward}", r.URL.Path, prefix)
	}
	rt := Route{Namespace: parts[0], Name: parts[2], Subresource: parts[3]}
	if errs := validation.IsDNS1123Label(rt.Namespace); len(errs) > 0 {
		return Route{}, badRequest("invalid namespace %q: %s", rt.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(rt.Name); len(errs) > 0 {
		return Route{}, badRequest("invalid sandbox name %q: %s", rt.Name, strings.Join(errs, "; "))
	}
	var allowed []string
	switch rt.Subresource {
	case SubresourceExec:
		allowed = []string{http.MethodPost}
		rt.RBACSubresource = SubresourceExec
	case SubresourceProcesses:
		allowed = []string{http.MethodPost}
		rt.RBACSubresource = SubresourceProcesses
	case SubresourceFiles:
		allowed = []string{http.MethodPost, http.MethodGet}
		rt.RBACSubresource = SubresourceFiles
	case SubresourcePortForward:
		allowed = []string{http.MethodPost}
		rt.RBACSubresource = SubresourcePortForward
	case SubresourceMetrics:
		allowed, rt.RBACSubresource = []string{http.MethodGet}, SubresourceMetrics
	case SubresourceLog, SubresourceHistory:
		allowed = []string{http.MethodGet}
		rt.RBACSubresource = SubresourceLog
	default:
		return Route{}, noSuchEndpoint("no such subresource %q; this API serves exec, processes, files, log, history, portforward and metrics", rt.Subresource)
	}
	switch r.Method {
	case http.MethodPost:
		rt.Verb = "create"
	case http.MethodGet:
		rt.Verb = "get"
	}
	for _, m := range allowed {
		if r.Method == m {
			return rt, nil
		}
	}
	return Route{}, methodNotAllowed("%s is not allowed on sandboxes/%s; use %s", r.Method, rt.Subresource, strings.Join(allowed, " or "))
}

// NeedsReady reports whether the subresource acts on the container, and so
// needs a Ready Sandbox (CheckReady): exec, processes and files. Logs and history are
// served for a Sandbox that is not Ready too, to show why it died.
func NeedsReady(subresource string) bool {
	return subresource == SubresourceExec || subresource == SubresourceProcesses || subresource == SubresourceFiles || subresource == SubresourcePortForward
}

func noSuchEndpoint(format string, args ...any) *Error {
	return NewError(http.StatusNotFound, metav1.StatusReasonNotFound, format, args...).Because(CauseNoSuchEndpoint, "")
}

func badRequest(format string, args ...any) *Error {
	return NewError(http.StatusBadRequest, metav1.StatusReasonBadRequest, format, args...)
}

func methodNotAllowed(format string, args ...any) *Error {
	return NewError(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, format, args...)
}
