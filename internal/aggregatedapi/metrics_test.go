/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package aggregatedapi

import (
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// sandboxes/metrics is authorised as get on its own subresource, so that
// RBAC decides who sees a Sandbox's figures.
func TestMetricsNeedsGetOnSandboxesMetrics(t *testing.T) {
	h := newHarness(t, testNode, readySandbox("box"), testNodeObject(loopback))
	h.deny = "no RBAC policy matched"
	resp, body := h.do(http.MethodGet, sandboxPath("box", subresource.SubresourceMetrics), "mallory", nil, "")
	st := expectStatus(t, resp, body, http.StatusForbidden, metav1.StatusReasonForbidden, "")
	if !strings.Contains(st.Message, `"sandboxes/metrics"`) || !strings.Contains(st.Message, "cannot get") {
		t.Errorf("the refusal %q does not name get sandboxes/metrics", st.Message)
	}
	if reqs := h.nodeRequests(); len(reqs) != 0 {
		t.Errorf("a refused request reached the node API: %+v", reqs)
	}
	authz := h.authorizations()
	if len(authz) != 1 {
		t.Fatalf("%d authorisation checks, want 1", len(authz))
	}
	if a := authz[0]; a.GetVerb() != "get" || a.GetResource() != "sandboxes" || a.GetSubresource() != "metrics" || a.GetAPIGroup() != "sandbox.code-sandbox.dev" {
		t.Errorf("the access review asked %s %s/%s/%s", a.GetVerb(), a.GetAPIGroup(), a.GetResource(), a.GetSubresource())
	}
	// Only GET: there is nothing to create.
	resp, body = h.do(http.MethodPost, sandboxPath("box", subresource.SubresourceMetrics), "alice", nil, "")
	expectStatus(t, resp, body, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "")
}

// A paused Sandbox is not Ready, and its metrics are still served: reading
// them is how one sees what it holds while it sleeps.
func TestMetricsServedForAPausedSandbox(t *testing.T) {
	paused := readySandbox("paused")
	paused.Status.Conditions = readyCondition(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused, "spec.paused is true")
	h := newHarness(t, testNode, paused, testNodeObject(loopback))
	resp, body := h.do(http.MethodGet, sandboxPath("paused", subresource.SubresourceMetrics), "alice", nil, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET metrics of a paused Sandbox: HTTP %d: %s", resp.StatusCode, body)
	}
	reqs := h.nodeRequests()
	if len(reqs) != 1 || reqs[0].method != http.MethodGet || reqs[0].path != subresource.PathPrefix+testNS+"/sandboxes/paused/metrics" {
		t.Fatalf("the node got %+v", reqs)
	}
}
