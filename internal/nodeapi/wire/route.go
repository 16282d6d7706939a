/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package wire

import (
	"fmt"
	"net/http"
	"strings"

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

// RouteError is a request that names no valid route: Code is 400, 404 or
// 405, and Message says what is wrong.
type RouteError struct {
	Code    int
	Message string
}

func (e *RouteError) Error() string { return e.Message }

// ParseRoute reads prefix{namespace}/sandboxes/{name}/{subresource} from
// the request's path and checks the method.
func ParseRoute(prefix string, r *http.Request) (Route, *RouteError) {
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 4 || parts[1] != "sandboxes" {
		return Route{}, &RouteError{http.StatusNotFound, fmt.Sprintf("no such endpoint %q; this API serves %s{namespace}/sandboxes/{name}/{exec|files|log|history}", r.URL.Path, prefix)}
	}
	rt := Route{Namespace: parts[0], Name: parts[2], Subresource: parts[3]}
	if errs := validation.IsDNS1123Label(rt.Namespace); len(errs) > 0 {
		return Route{}, &RouteError{http.StatusBadRequest, fmt.Sprintf("invalid namespace %q: %s", rt.Namespace, strings.Join(errs, "; "))}
	}
	if errs := validation.IsDNS1123Subdomain(rt.Name); len(errs) > 0 {
		return Route{}, &RouteError{http.StatusBadRequest, fmt.Sprintf("invalid sandbox name %q: %s", rt.Name, strings.Join(errs, "; "))}
	}
	var allowed []string
	switch rt.Subresource {
	case SubresourceExec:
		allowed = []string{http.MethodPost}
		rt.RBACSubresource = SubresourceExec
	case SubresourceFiles:
		allowed = []string{http.MethodPost, http.MethodGet}
		rt.RBACSubresource = SubresourceFiles
	case SubresourceLog, SubresourceHistory:
		allowed = []string{http.MethodGet}
		rt.RBACSubresource = SubresourceLog
	default:
		return Route{}, &RouteError{http.StatusNotFound, fmt.Sprintf("no such subresource %q; this API serves exec, files, log and history", rt.Subresource)}
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
	return Route{}, &RouteError{http.StatusMethodNotAllowed, fmt.Sprintf("%s is not allowed on sandboxes/%s; use %s", r.Method, rt.Subresource, strings.Join(allowed, " or "))}
}
