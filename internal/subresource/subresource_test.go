/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

func TestParseRoute(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         Route
		code         int
		cause        metav1.CauseType
	}{
		{method: "POST", path: PathPrefix + "ns/sandboxes/box/exec", want: Route{"ns", "box", "exec", "exec", "create"}},
		{method: "POST", path: PathPrefix + "ns/sandboxes/box.v2/files", want: Route{"ns", "box.v2", "files", "files", "create"}},
		{method: "GET", path: PathPrefix + "ns/sandboxes/box/files", want: Route{"ns", "box", "files", "files", "get"}},
		{method: "GET", path: PathPrefix + "ns/sandboxes/box/log", want: Route{"ns", "box", "log", "log", "get"}},
		// history is authorised as log.
		{method: "GET", path: PathPrefix + "ns/sandboxes/box/history", want: Route{"ns", "box", "history", "log", "get"}},
		{method: "GET", path: "/apis/" + AggregatedGroup + "/" + AggregatedVersion + "/namespaces/ns/sandboxes/box/log", code: 404, cause: CauseNoSuchEndpoint},
		{method: "POST", path: PathPrefix + "ns/sandboxes/box/attach", code: 404, cause: CauseNoSuchEndpoint},
		{method: "POST", path: PathPrefix + "ns/pods/box/exec", code: 404, cause: CauseNoSuchEndpoint},
		{method: "POST", path: PathPrefix + "ns/sandboxes/box/exec/", code: 404, cause: CauseNoSuchEndpoint},
		{method: "POST", path: PathPrefix + "ns/sandboxes/box", code: 404, cause: CauseNoSuchEndpoint},
		{method: "POST", path: PathPrefix + "NS/sandboxes/box/exec", code: 400},
		{method: "POST", path: PathPrefix + "ns/sandboxes/-box/exec", code: 400},
		{method: "POST", path: PathPrefix + "ns/sandboxes/" + strings.Repeat("a", 254) + "/exec", code: 400},
		{method: "POST", path: PathPrefix + "/sandboxes/box/exec", code: 400},
		{method: "GET", path: PathPrefix + "ns/sandboxes/box/exec", code: 405},
		{method: "PUT", path: PathPrefix + "ns/sandboxes/box/files", code: 405},
		{method: "POST", path: PathPrefix + "ns/sandboxes/box/history", code: 405},
	} {
		r := httptest.NewRequest(tc.method, "https://node"+tc.path, nil)
		got, err := ParseRoute(PathPrefix, r)
		if tc.code == 0 {
			if err != nil || got != tc.want {
				t.Errorf("%s %s = %+v, %v; want %+v", tc.method, tc.path, got, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s %s = %+v, want HTTP %d", tc.method, tc.path, got, tc.code)
			continue
		}
		st := err.Status("")
		if err.Code != tc.code || int(st.Code) != tc.code {
			t.Errorf("%s %s: HTTP %d, want %d (%s)", tc.method, tc.path, err.Code, tc.code, err.Message)
		}
		wantReason := map[int]metav1.StatusReason{400: metav1.StatusReasonBadRequest, 404: metav1.StatusReasonNotFound, 405: metav1.StatusReasonMethodNotAllowed}[tc.code]
		if err.Reason != wantReason {
			t.Errorf("%s %s: reason %s, want %s", tc.method, tc.path, err.Reason, wantReason)
		}
		if (tc.cause != "") != HasCause(st, CauseNoSuchEndpoint) {
			t.Errorf("%s %s: causes %v, want %q", tc.method, tc.path, err.Causes, tc.cause)
		}
	}
}

func sandbox(mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "box", UID: "uid-1"},
		Status: sandboxv1alpha1.SandboxStatus{NodeName: "n1", NodeAPIEndpoint: "https://10.0.0.1:9443", Conditions: []metav1.Condition{{
			Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionTrue, Reason: "Running", Message: "runs",
		}}},
	}
	for _, m := range mutate {
		m(sbx)
	}
	return sbx
}

func notReady(reason, message string) func(*sandboxv1alpha1.Sandbox) {
	return func(s *sandboxv1alpha1.Sandbox) {
		s.Status.Conditions[0].Status, s.Status.Conditions[0].Reason, s.Status.Conditions[0].Message = metav1.ConditionFalse, reason, message
	}
}

var (
	unbound   = func(s *sandboxv1alpha1.Sandbox) { s.Status.NodeName = "" }
	deleting  = func(s *sandboxv1alpha1.Sandbox) { s.DeletionTimestamp = ptr.To(metav1.Now()) }
	noReady   = func(s *sandboxv1alpha1.Sandbox) { s.Status.Conditions = nil }
	noAPI     = func(s *sandboxv1alpha1.Sandbox) { s.Status.NodeAPIEndpoint = "" }
	poolOwned = func(s *sandboxv1alpha1.Sandbox) {
		s.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxWarmPool",
			Name: "pool", UID: "p", Controller: ptr.To(true)}}
	}
)

// The one readiness check, and what the aggregated API server adds to it.
func TestCheckReadyAndServed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sbx   *sandboxv1alpha1.Sandbox
		exec  metav1.CauseType // CheckServed(exec) and CheckReady; "" for none
		log   metav1.CauseType // CheckServed(log)
		says  string
		ready bool // CheckReady passes (CheckServed may still refuse)
	}{
		{name: "Ready", sbx: sandbox(), ready: true},
		{name: "unbound", sbx: sandbox(unbound), exec: CauseSandboxNotReady, log: CauseSandboxNotReady, says: "no node has claimed it yet"},
		{name: "no Ready condition", sbx: sandbox(noReady), exec: CauseSandboxNotReady, says: "no manager has reported on it yet"},
		{name: "not Ready", sbx: sandbox(notReady("ContainerExited", "exit 3")), exec: CauseSandboxNotReady, says: "sandbox ns/box is not Ready: ContainerExited: exit 3"},
		{name: "node lost", sbx: sandbox(notReady(sandboxv1alpha1.SandboxReasonNodeLost, "node n1 is lost")), exec: CauseSandboxNotReady,
			says: "sandbox ns/box is not Ready: NodeLost: node n1 is lost"},
		{name: "paused", sbx: sandbox(notReady(sandboxv1alpha1.SandboxReasonPaused, "spec.paused")), exec: CauseSandboxPaused, says: "sandbox ns/box is paused: spec.paused"},
		{name: "deleting", sbx: sandbox(deleting), exec: CauseSandboxTerminating, says: "being deleted"},
		// Being deleted is final: it wins over everything else.
		{name: "deleting and unbound", sbx: sandbox(deleting, unbound), exec: CauseSandboxTerminating, log: CauseSandboxNotReady, says: "being deleted"},
		{name: "warm pool member", sbx: sandbox(poolOwned), exec: CauseWarmPoolMember, says: "member of warm pool pool"},
		// A pool label without the pool's controller reference is no membership.
		{name: "label only", sbx: sandbox(func(s *sandboxv1alpha1.Sandbox) { s.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"} }), ready: true},
		{name: "no node API", sbx: sandbox(noAPI), exec: CauseNodeAPIUnavailable, log: CauseNodeAPIUnavailable, says: "node n1 has not published its node API", ready: true},
	} {
		err := CheckReady(tc.sbx)
		if (err == nil) != tc.ready {
			t.Errorf("%s: CheckReady = %v, want passing %v", tc.name, err, tc.ready)
		}
		if err != nil && (err.Code != http.StatusConflict || err.Reason != metav1.StatusReasonConflict || !HasCause(err.Status("box"), tc.exec)) {
			t.Errorf("%s: CheckReady = %d %s %v, want a Conflict because %s", tc.name, err.Code, err.Reason, err.Causes, tc.exec)
		}
		for sub, want := range map[string]metav1.CauseType{SubresourceExec: tc.exec, SubresourceFiles: tc.exec, SubresourceLog: tc.log, SubresourceHistory: tc.log} {
			got := CheckServed(tc.sbx, sub)
			switch {
			case want == "" && got != nil:
				t.Errorf("%s: CheckServed(%s) = %v, want nil", tc.name, sub, got)
			case want != "" && (got == nil || !HasCause(got.Status("box"), want)):
				t.Errorf("%s: CheckServed(%s) = %v, want the cause %s", tc.name, sub, got, want)
			case want != "" && want == tc.exec && !strings.Contains(got.Message, tc.says):
				t.Errorf("%s: CheckServed(%s) says %q, want %q", tc.name, sub, got.Message, tc.says)
			}
		}
	}
	if err := CheckServed(sandbox(noAPI), SubresourceLog); err == nil || err.Code != http.StatusServiceUnavailable || err.Reason != metav1.StatusReasonServiceUnavailable {
		t.Errorf("a Sandbox without a node API is %v, want 503 ServiceUnavailable", err)
	}
}

func TestGetSandbox(t *testing.T) {
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "ns", Name: "box"}
	gr := schema.GroupResource{Group: StatusGroup, Resource: StatusKind}
	missing := func(context.Context, types.NamespacedName, *sandboxv1alpha1.Sandbox) error {
		return apierrors.NewNotFound(gr, "box")
	}
	found := func(_ context.Context, k types.NamespacedName, sbx *sandboxv1alpha1.Sandbox) error {
		*sbx = *sandbox()
		return nil
	}
	broken := func(context.Context, types.NamespacedName, *sandboxv1alpha1.Sandbox) error {
		return fmt.Errorf("etcd is on fire")
	}

	if sbx, err := GetSandbox(ctx, found, nil, key); err != nil || sbx.Name != "box" {
		t.Errorf("from the cache: %v, %v", sbx, err)
	}
	// The cache may not have caught up with a Sandbox just created.
	if sbx, err := GetSandbox(ctx, missing, found, key); err != nil || sbx.Name != "box" {
		t.Errorf("from the API server after a cache miss: %v, %v", sbx, err)
	}
	for name, api := range map[string]GetFunc{"no API reader": nil, "missing there too": missing} {
		_, err := GetSandbox(ctx, missing, api, key)
		if e := AsError(err); e.Code != http.StatusNotFound || e.Reason != metav1.StatusReasonNotFound || e.Message != "sandbox ns/box not found" {
			t.Errorf("%s: %v (%d %s), want a 404 naming the Sandbox", name, err, e.Code, e.Reason)
		}
	}
	_, err := GetSandbox(ctx, broken, found, key)
	if e := AsError(err); err == nil || e.Code != http.StatusInternalServerError || !strings.Contains(e.Message, "etcd is on fire") {
		t.Errorf("a failing read is %v (%d), want a 500 that keeps its text", err, e.Code)
	}
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Trailer", "Sandbox-Transfer-Error")
	e := NewError(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "busy: %d running", 4).Because(CauseExecLimit, "")
	e.RetryAfter = 1500 * time.Millisecond
	WriteError(NameSandbox(rec, "box"), fmt.Errorf("wrapped: %w", e))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Trailer") != "" ||
		rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("HTTP %d, headers %v", rec.Code, rec.Header())
	}
	var st metav1.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Message != "busy: 4 running" || st.Details == nil || st.Details.Name != "box" || st.Details.Group != StatusGroup ||
		st.Details.Kind != StatusKind || st.Details.RetryAfterSeconds != 2 || !HasCause(&st, CauseExecLimit) {
		t.Errorf("the Status is %+v %+v", st, st.Details)
	}
	// apimachinery's helpers read it like the API server's own answers.
	if se := apierrors.FromObject(&st); !apierrors.IsTooManyRequests(se) {
		t.Errorf("apierrors sees %v", se)
	}

	// Without NameSandbox the Status names no Sandbox.
	rec = httptest.NewRecorder()
	WriteError(rec, context.Canceled)
	var canceled metav1.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &canceled); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusRequestTimeout || canceled.Reason != metav1.StatusReasonTimeout || canceled.Details.Name != "" || len(canceled.Details.Causes) != 0 {
		t.Errorf("a canceled request: HTTP %d %s %+v", rec.Code, canceled.Reason, canceled.Details)
	}
}

func TestAsError(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   int
		reason metav1.StatusReason
	}{
		{fmt.Errorf("reading: %w", context.Canceled), http.StatusRequestTimeout, metav1.StatusReasonTimeout},
		{fmt.Errorf("reading: %w", context.DeadlineExceeded), http.StatusGatewayTimeout, metav1.StatusReasonTimeout},
		{fmt.Errorf("body: %w", &http.MaxBytesError{Limit: 10}), http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge},
		{fmt.Errorf("anything else"), http.StatusInternalServerError, metav1.StatusReasonInternalError},
		{fmt.Errorf("x: %w", Conflict(CauseSandboxPaused, "paused")), http.StatusConflict, metav1.StatusReasonConflict},
	} {
		if e := AsError(tc.err); e.Code != tc.code || e.Reason != tc.reason {
			t.Errorf("AsError(%v) = %d %s, want %d %s", tc.err, e.Code, e.Reason, tc.code, tc.reason)
		}
	}
}
