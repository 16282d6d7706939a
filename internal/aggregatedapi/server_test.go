/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package aggregatedapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// The aggregated API server over real HTTP: kube-apiserver's side is an
// httptest server in front of Server, the node's side is a TLS server with
// a node certificate from a real operator CA. Only what kube-apiserver
// would have done (authenticate, authorise) is a function here; every
// refusal, the Node-address check and the forwarding are the server's own.

const (
	testNS   = "team-a"
	testNode = "node-a"
	// testUserHeader names the user the test authenticator admits; a
	// request without it is unauthenticated.
	testUserHeader = "X-Test-User"
)

// nodeRequest is what reached the fake node API.
type nodeRequest struct {
	method, path, rawQuery string
	header                 http.Header
	body                   string
	clientCN               string
}

type harness struct {
	t   *testing.T
	api *httptest.Server
	ca  *operatorca.CA

	mu       sync.Mutex
	nodeReqs []nodeRequest
	authz    []authorizer.Attributes
	// deny, when set, is the authorizer's answer to every request.
	deny string
}

// newHarness starts the aggregated API server over the given objects. The
// objects may name "NODEURL" in a Sandbox's status.nodeAPIEndpoint; it is
// replaced by the URL of a node API served for nodeCertName (testNode
// unless the test forges another).
func newHarness(t *testing.T, nodeCertName string, objs ...client.Object) *harness {
	t.Helper()
	h := &harness{t: t}
	ca, err := operatorca.NewCA("test-operator-ca", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	h.ca = ca
	nodeCert, err := ca.IssueNode(nodeCertName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := nodeRequest{method: r.Method, path: r.URL.Path, rawQuery: r.URL.RawQuery, header: r.Header.Clone(), body: string(body)}
		if len(r.TLS.PeerCertificates) > 0 {
			rec.clientCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		h.mu.Lock()
		h.nodeReqs = append(h.nodeReqs, rec)
		h.mu.Unlock()
		w.Header().Set("Content-Type", subresource.ContentTypeNDJSON)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"stream":"stdout","data":"aGk="}`+"\n")
	}))
	node.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*nodeCert}, ClientAuth: tls.RequireAnyClientCert}
	node.StartTLS()
	t.Cleanup(node.Close)

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if sbx, ok := o.(*sandboxv1alpha1.Sandbox); ok && sbx.Status.NodeAPIEndpoint == "NODEURL" {
			sbx.Status.NodeAPIEndpoint = node.URL
		}
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	clientCert, err := ca.IssueClient(operatorca.AggregatorCommonName, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{
		Sandboxes: reader,
		APIReader: reader,
		Nodes:     reader,
		Authenticator: authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
			name := r.Header.Get(testUserHeader)
			if name == "" {
				return nil, false, nil
			}
			return &authenticator.Response{User: &user.DefaultInfo{Name: name, UID: "uid-" + name,
				Groups: []string{"team-a-devs", "system:authenticated"}, Extra: map[string][]string{"scopes.example/x": {"one"}}}}, true, nil
		}),
		Authorizer: authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.authz = append(h.authz, a)
			if h.deny != "" {
				return authorizer.DecisionDeny, h.deny, nil
			}
			return authorizer.DecisionAllow, "", nil
		}),
		ClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return clientCert, nil },
		NodeCAs:           ca.Pool,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	h.api = httptest.NewServer(srv)
	t.Cleanup(h.api.Close)
	return h
}

// do sends method path as user ("" for nobody) with extra headers.
func (h *harness) do(method, path, user string, header http.Header, body string) (*http.Response, string) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.api.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if user != "" {
		req.Header.Set(testUserHeader, user)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, string(data)
}

func (h *harness) nodeRequests() []nodeRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]nodeRequest(nil), h.nodeReqs...)
}

func (h *harness) authorizations() []authorizer.Attributes {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]authorizer.Attributes(nil), h.authz...)
}

// expectStatus decodes a metav1.Status answer and checks its code, reason
// and (when not empty) cause.
func expectStatus(t *testing.T, resp *http.Response, body string, code int, reason metav1.StatusReason, cause metav1.CauseType) *metav1.Status {
	t.Helper()
	if resp.StatusCode != code {
		t.Fatalf("HTTP %d, want %d: %s", resp.StatusCode, code, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json: %s", ct, body)
	}
	var st metav1.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("the answer is no Status: %v: %s", err, body)
	}
	if st.Kind != "Status" || st.Status != metav1.StatusFailure || st.Code != int32(code) || st.Reason != reason {
		t.Fatalf("Status %s/%s %d %s, want Failure %d %s: %s", st.Kind, st.Status, st.Code, st.Reason, code, reason, body)
	}
	if cause != "" && !subresource.HasCause(&st, cause) {
		t.Fatalf("Status without the cause %s: %s", cause, body)
	}
	return &st
}

func sandboxPath(name, sub string) string {
	return subresource.AggregatedPathPrefix + testNS + "/sandboxes/" + name + "/" + sub
}

func readyCondition(status metav1.ConditionStatus, reason, message string) []metav1.Condition {
	return []metav1.Condition{{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: status, Reason: reason, Message: message,
		LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}}
}

// readySandbox is a Ready Sandbox on testNode served by the harness's node.
func readySandbox(name string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: types.UID("uid-" + name)},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: "busybox"},
		Status: sandboxv1alpha1.SandboxStatus{NodeName: testNode, NodeAPIEndpoint: "NODEURL", ContainerID: "c0ffee",
			Conditions: readyCondition(metav1.ConditionTrue, "Running", "the container runs")},
	}
}

// testNodeObject is the Node testNode, whose kubelet reports addresses.
func testNodeObject(addresses ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}, Status: corev1.NodeStatus{Addresses: addresses}}
}

var loopback = corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}

func TestDiscoveryAndHealth(t *testing.T) {
	h := newHarness(t, testNode)
	for _, p := range []string{"/healthz", "/livez", "/readyz/"} {
		resp, body := h.do(http.MethodGet, p, "", nil, "")
		if resp.StatusCode != http.StatusOK || body != "ok" {
			t.Errorf("GET %s: HTTP %d %q, want 200 ok", p, resp.StatusCode, body)
		}
	}
	gv := subresource.AggregatedGroup + "/" + subresource.AggregatedVersion
	var groups metav1.APIGroupList
	decodeJSON(t, h, "/apis", &groups)
	if len(groups.Groups) != 1 || groups.Groups[0].Name != subresource.AggregatedGroup || groups.Groups[0].PreferredVersion.GroupVersion != gv {
		t.Errorf("/apis lists %+v, want the one group %s", groups.Groups, gv)
	}
	var group metav1.APIGroup
	decodeJSON(t, h, "/apis/"+subresource.AggregatedGroup, &group)
	if group.Kind != "APIGroup" || group.Name != subresource.AggregatedGroup {
		t.Errorf("the group document is %+v", group)
	}
	var resources metav1.APIResourceList
	decodeJSON(t, h, "/apis/"+gv, &resources)
	verbs := map[string]string{}
	for _, r := range resources.APIResources {
		if !r.Namespaced || r.Kind != "Sandbox" {
			t.Errorf("%s is not a namespaced Sandbox subresource: %+v", r.Name, r)
		}
		verbs[r.Name] = strings.Join(r.Verbs, ",")
	}
	want := map[string]string{"sandboxes/exec": "create", "sandboxes/processes": "create", "sandboxes/files": "create,get", "sandboxes/log": "get", "sandboxes/history": "get", "sandboxes/metrics": "get"}
	if len(verbs) != len(want) {
		t.Errorf("the resource list is %v, want %v", verbs, want)
	}
	for name, v := range want {
		if verbs[name] != v {
			t.Errorf("%s has verbs %q, want %q", name, verbs[name], v)
		}
	}
}

func decodeJSON(t *testing.T, h *harness, path string, into any) {
	t.Helper()
	resp, body := h.do(http.MethodGet, path, "", nil, "")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: HTTP %d %s: %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET %s: Cache-Control %q, want no-store", path, resp.Header.Get("Cache-Control"))
	}
	if err := json.Unmarshal([]byte(body), into); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, body)
	}
}

// Paths and methods that name no subresource are refused before anyone is
// asked anything: no authorisation, no read, no node.
func TestRefusesBadRoutes(t *testing.T) {
	h := newHarness(t, testNode, readySandbox("box"), testNodeObject(loopback))
	prefix := subresource.AggregatedPathPrefix
	for _, tc := range []struct {
		method, path string
		code         int
		reason       metav1.StatusReason
		cause        metav1.CauseType
		says         string
	}{
		{http.MethodPost, sandboxPath("box", "shell"), 404, metav1.StatusReasonNotFound, subresource.CauseNoSuchEndpoint, `no such subresource "shell"`},
		{http.MethodPost, prefix + testNS + "/pods/box/exec", 404, metav1.StatusReasonNotFound, subresource.CauseNoSuchEndpoint, "no such endpoint"},
		{http.MethodPost, sandboxPath("box", "exec") + "/more", 404, metav1.StatusReasonNotFound, subresource.CauseNoSuchEndpoint, "no such endpoint"},
		{http.MethodGet, prefix + testNS + "/sandboxes/box", 404, metav1.StatusReasonNotFound, subresource.CauseNoSuchEndpoint, "no such endpoint"},
		{http.MethodGet, "/apis/sandbox.code-sandbox.dev/v1alpha1/namespaces/team-a/sandboxes/box/log", 404, metav1.StatusReasonNotFound, subresource.CauseNoSuchEndpoint, "no such endpoint"},
		{http.MethodPost, prefix + "Team_A/sandboxes/box/exec", 400, metav1.StatusReasonBadRequest, "", `invalid namespace "Team_A"`},
		{http.MethodPost, prefix + testNS + "/sandboxes/Box!/exec", 400, metav1.StatusReasonBadRequest, "", `invalid sandbox name "Box!"`},
		{http.MethodGet, sandboxPath("box", "exec"), 405, metav1.StatusReasonMethodNotAllowed, "", "GET is not allowed on sandboxes/exec; use POST"},
		{http.MethodDelete, sandboxPath("box", "files"), 405, metav1.StatusReasonMethodNotAllowed, "", "use POST or GET"},
		{http.MethodPost, sandboxPath("box", "log"), 405, metav1.StatusReasonMethodNotAllowed, "", "use GET"},
		{http.MethodPut, sandboxPath("box", "history"), 405, metav1.StatusReasonMethodNotAllowed, "", "use GET"},
	} {
		resp, body := h.do(tc.method, tc.path, "alice", nil, "")
		st := expectStatus(t, resp, body, tc.code, tc.reason, tc.cause)
		if !strings.Contains(st.Message, tc.says) {
			t.Errorf("%s %s: message %q does not say %q", tc.method, tc.path, st.Message, tc.says)
		}
	}
	if n := len(h.authorizations()); n != 0 {
		t.Errorf("%d authorisation checks for requests that name no subresource", n)
	}
	if reqs := h.nodeRequests(); len(reqs) != 0 {
		t.Errorf("the node API was called: %+v", reqs)
	}
}

func TestRefusesUnauthenticated(t *testing.T) {
	h := newHarness(t, testNode, readySandbox("box"), testNodeObject(loopback))
	// The caller's own identity headers authenticate no one: only the
	// authenticator (kube-apiserver's front proxy) does.
	resp, body := h.do(http.MethodPost, sandboxPath("box", "exec"), "",
		http.Header{"X-Remote-User": {"admin"}, "Authorization": {"Bearer admin-token"}}, `{"command":["id"]}`)
	expectStatus(t, resp, body, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "")
	if n := len(h.authorizations()); n != 0 {
		t.Errorf("%d authorisation checks for an unauthenticated request", n)
	}
	if reqs := h.nodeRequests(); len(reqs) != 0 {
		t.Errorf("the node API was called: %+v", reqs)
	}
}

// The caller is authorised on the same subresource of sandbox.code-sandbox.dev
// (history as log); a refusal is a Forbidden about the Sandbox.
func TestAuthorisesOnTheSandboxGroup(t *testing.T) {
	h := newHarness(t, testNode, readySandbox("box"), testNodeObject(loopback))
	h.deny = "no RBAC policy matched"
	resp, body := h.do(http.MethodGet, sandboxPath("box", "history"), "mallory", nil, "")
	st := expectStatus(t, resp, body, http.StatusForbidden, metav1.StatusReasonForbidden, "")
	for _, s := range []string{`"mallory"`, `"sandboxes/log"`, "sandbox.code-sandbox.dev", testNS, "no RBAC policy matched"} {
		if !strings.Contains(st.Message, s) {
			t.Errorf("the refusal %q does not say %s", st.Message, s)
		}
	}
	if st.Details == nil || st.Details.Name != "box" || st.Details.Group != subresource.StatusGroup || st.Details.Kind != subresource.StatusKind {
		t.Errorf("the refusal does not name the Sandbox: %+v", st.Details)
	}
	if reqs := h.nodeRequests(); len(reqs) != 0 {
		t.Errorf("a refused request reached the node API: %+v", reqs)
	}
	authz := h.authorizations()
	if len(authz) != 1 {
		t.Fatalf("%d authorisation checks, want 1", len(authz))
	}
	a := authz[0]
	if a.GetVerb() != "get" || a.GetNamespace() != testNS || a.GetName() != "box" || a.GetAPIGroup() != "sandbox.code-sandbox.dev" ||
		a.GetResource() != "sandboxes" || a.GetSubresource() != "log" || !a.IsResourceRequest() || a.GetUser().GetName() != "mallory" {
		t.Errorf("the access review asked %s %s/%s %s/%s in %s for %s", a.GetVerb(), a.GetAPIGroup(), a.GetResource(),
			a.GetName(), a.GetSubresource(), a.GetNamespace(), a.GetUser().GetName())
	}
}

// What the aggregated API server requires of the Sandbox before it calls
// a node (subresource.CheckServed), as the caller sees it.
func TestRefusesSandboxesItCannotServe(t *testing.T) {
	unbound := readySandbox("unbound")
	unbound.Status.NodeName, unbound.Status.Conditions = "", nil
	broken := readySandbox("broken")
	broken.Status.Conditions = readyCondition(metav1.ConditionFalse, "ImageNotFound", "no such image")
	paused := readySandbox("paused")
	paused.Status.Conditions = readyCondition(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused, "spec.paused is true")
	unreported := readySandbox("unreported")
	unreported.Status.Conditions = nil
	deleting := readySandbox("deleting")
	deleting.Finalizers = []string{"sandbox.code-sandbox.dev/cleanup"}
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	member := readySandbox("member")
	member.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
	member.OwnerReferences = []metav1.OwnerReference{{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxWarmPool",
		Name: "pool", UID: "pool-uid", Controller: ptr.To(true)}}
	unpublished := readySandbox("unpublished")
	unpublished.Status.NodeAPIEndpoint = ""
	h := newHarness(t, testNode, unbound, broken, paused, unreported, deleting, member, unpublished, testNodeObject(loopback))

	for _, tc := range []struct {
		method, name, sub string
		code              int
		reason            metav1.StatusReason
		cause             metav1.CauseType
		says              string
	}{
		{http.MethodPost, "nope", subresource.SubresourceExec, 404, metav1.StatusReasonNotFound, "", "sandbox team-a/nope not found"},
		{http.MethodGet, "unbound", subresource.SubresourceLog, 409, metav1.StatusReasonConflict, subresource.CauseSandboxNotReady, "no node has claimed it yet"},
		{http.MethodPost, "unbound", subresource.SubresourceExec, 409, metav1.StatusReasonConflict, subresource.CauseSandboxNotReady, "no node has claimed it yet"},
		{http.MethodPost, "broken", subresource.SubresourceExec, 409, metav1.StatusReasonConflict, subresource.CauseSandboxNotReady, "is not Ready: ImageNotFound: no such image"},
		{http.MethodGet, "broken", subresource.SubresourceFiles, 409, metav1.StatusReasonConflict, subresource.CauseSandboxNotReady, "ImageNotFound"},
		{http.MethodPost, "unreported", subresource.SubresourceExec, 409, metav1.StatusReasonConflict, subresource.CauseSandboxNotReady, "no manager has reported on it yet"},
		{http.MethodPost, "paused", subresource.SubresourceExec, 409, metav1.StatusReasonConflict, subresource.CauseSandboxPaused, "is paused: spec.paused is true"},
		{http.MethodPost, "deleting", subresource.SubresourceFiles, 409, metav1.StatusReasonConflict, subresource.CauseSandboxTerminating, "being deleted"},
		{http.MethodPost, "member", subresource.SubresourceExec, 409, metav1.StatusReasonConflict, subresource.CauseWarmPoolMember, "spec.warmPoolRef.name pool"},
		{http.MethodGet, "unpublished", subresource.SubresourceLog, 503, metav1.StatusReasonServiceUnavailable, subresource.CauseNodeAPIUnavailable, "has not published its node API"},
	} {
		resp, body := h.do(tc.method, sandboxPath(tc.name, tc.sub), "alice", nil, "")
		st := expectStatus(t, resp, body, tc.code, tc.reason, tc.cause)
		if !strings.Contains(st.Message, tc.says) {
			t.Errorf("%s %s/%s: message %q does not say %q", tc.method, tc.name, tc.sub, st.Message, tc.says)
		}
		if st.Details == nil || st.Details.Name != tc.name {
			t.Errorf("%s %s/%s: the Status does not name the Sandbox: %+v", tc.method, tc.name, tc.sub, st.Details)
		}
	}
	if reqs := h.nodeRequests(); len(reqs) != 0 {
		t.Errorf("a refused request reached the node API: %+v", reqs)
	}

	// Logs and history are served for a Sandbox that is not Ready, to show
	// why it died.
	for _, sub := range []string{subresource.SubresourceLog, subresource.SubresourceHistory} {
		if resp, body := h.do(http.MethodGet, sandboxPath("broken", sub), "alice", nil, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s of a Sandbox that is not Ready: HTTP %d: %s", sub, resp.StatusCode, body)
		}
	}
	if n := len(h.nodeRequests()); n != 2 {
		t.Errorf("%d requests reached the node API, want the 2 reads", n)
	}
}

// The forwarded request carries the identity this server authenticated and
// nothing the caller said about identity; the node sees the operator's
// client certificate, and the answer streams back as the node gave it.
func TestForwardsAsTheAuthenticatedUser(t *testing.T) {
	h := newHarness(t, testNode, readySandbox("box"), testNodeObject(loopback))
	forged := http.Header{
		"Authorization":          {"Bearer caller-token"},
		"Impersonate-User":       {"system:admin"},
		"Impersonate-Group":      {"system:masters"},
		"X-Remote-User":          {"system:admin"},
		"X-Remote-Group":         {"system:masters"},
		"X-Remote-Extra-Forged":  {"yes"},
		"Content-Type":           {"application/json"},
		"X-Unrelated-For-Server": {"kept"},
	}
	resp, body := h.do(http.MethodPost, sandboxPath("box", "exec")+"?timeout=5s", "alice", forged, `{"command":["id"]}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != subresource.ContentTypeNDJSON || !strings.Contains(body, `"stream":"stdout"`) {
		t.Fatalf("exec answered HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	reqs := h.nodeRequests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests reached the node API, want 1", len(reqs))
	}
	got := reqs[0]
	if got.method != http.MethodPost || got.path != subresource.PathPrefix+testNS+"/sandboxes/box/exec" || got.rawQuery != "timeout=5s" || got.body != `{"command":["id"]}` {
		t.Errorf("the node got %s %s?%s %q", got.method, got.path, got.rawQuery, got.body)
	}
	if got.clientCN != operatorca.AggregatorCommonName {
		t.Errorf("the node saw the client certificate %q, want %q", got.clientCN, operatorca.AggregatorCommonName)
	}
	hd := got.header
	for _, k := range []string{"Authorization", "Impersonate-User", "Impersonate-Group", "X-Remote-Extra-Forged"} {
		if v := hd.Values(k); len(v) != 0 {
			t.Errorf("the caller's %s %q reached the node", k, v)
		}
	}
	if v := hd.Values(subresource.HeaderRemoteUser); len(v) != 1 || v[0] != "alice" {
		t.Errorf("the node got %s %q, want alice alone", subresource.HeaderRemoteUser, v)
	}
	if v := hd.Get(subresource.HeaderRemoteUID); v != "uid-alice" {
		t.Errorf("the node got %s %q", subresource.HeaderRemoteUID, v)
	}
	if v := strings.Join(hd.Values(subresource.HeaderRemoteGroup), ","); v != "team-a-devs,system:authenticated" {
		t.Errorf("the node got the groups %q", v)
	}
	if v := hd.Get(subresource.HeaderRemoteExtraPrefix + "scopes.example%2Fx"); v != "one" {
		t.Errorf("the node got the extra %q; headers %v", v, hd)
	}
	if hd.Get("X-Unrelated-For-Server") != "kept" || hd.Get("Content-Type") != "application/json" {
		t.Errorf("ordinary headers were dropped: %v", hd)
	}
}

// status.nodeAPIEndpoint is written by a node's manager: the server dials
// it only when its host is one of the Node's status.addresses, and every
// way it is unusable gets one answer that says nothing of what was found.
func TestDialsOnlyTheNodesOwnAddress(t *testing.T) {
	for _, tc := range []struct {
		name     string
		node     *corev1.Node
		endpoint string
		certFor  string
	}{
		{name: "no Node", endpoint: "NODEURL", certFor: testNode},
		{name: "another address", node: testNodeObject(corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}), endpoint: "NODEURL", certFor: testNode},
		{name: "an address only in metadata", endpoint: "NODEURL", certFor: testNode, node: &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: testNode, Annotations: map[string]string{"address": "127.0.0.1"}, Labels: map[string]string{"address": "127.0.0.1"}},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalDNS, Address: "127.0.0.1"}}}}},
		{name: "http", node: testNodeObject(loopback), endpoint: "http://127.0.0.1:1", certFor: testNode},
		{name: "with a path", node: testNodeObject(loopback), endpoint: "https://127.0.0.1:1/admin", certFor: testNode},
		{name: "with credentials", node: testNodeObject(loopback), endpoint: "https://u:p@127.0.0.1:1", certFor: testNode},
		{name: "without a port", node: testNodeObject(loopback), endpoint: "https://127.0.0.1", certFor: testNode},
		{name: "nothing listens", node: testNodeObject(loopback), endpoint: "https://127.0.0.1:1", certFor: testNode},
		{name: "another node's certificate", node: testNodeObject(loopback), endpoint: "NODEURL", certFor: "node-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sbx := readySandbox("box")
			sbx.Status.NodeAPIEndpoint = tc.endpoint
			objs := []client.Object{sbx}
			if tc.node != nil {
				objs = append(objs, tc.node)
			}
			h := newHarness(t, tc.certFor, objs...)
			resp, body := h.do(http.MethodPost, sandboxPath("box", "exec"), "alice", nil, `{"command":["id"]}`)
			st := expectStatus(t, resp, body, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, subresource.CauseNodeAPIUnavailable)
			if want := "sandbox team-a/box: the node API of node node-a is unavailable"; st.Message != want {
				t.Errorf("the answer says %q, want only %q", st.Message, want)
			}
			if reqs := h.nodeRequests(); len(reqs) != 0 {
				t.Errorf("the request reached a node API it should not have: %+v", reqs)
			}
		})
	}
}

func TestNodeAddress(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
		{Type: corev1.NodeExternalIP, Address: "2001:db8::5"},
		{Type: corev1.NodeHostName, Address: "Node-A.example"},
		{Type: corev1.NodeInternalDNS, Address: "node-a.internal"},
		{Type: corev1.NodeExternalDNS, Address: "node-a.example.com"},
	}}}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: Config{Nodes: fake.NewClientBuilder().WithScheme(scheme).WithObjects(node).Build()}}
	ctx := context.Background()
	for host, ok := range map[string]bool{
		"10.0.0.5":           true,
		"2001:db8:0::5":      true, // the same IPv6 address, written differently
		"node-a.example":     true, // host names compare without case
		"10.0.0.6":           false,
		"2001:db8::6":        false,
		"node-a.internal":    false, // DNS names are not the kubelet's word
		"node-a.example.com": false,
		"":                   false,
	} {
		if err := s.nodeAddress(ctx, testNode, host); (err == nil) != ok {
			t.Errorf("nodeAddress(%q) = %v, want accepted %v", host, err, ok)
		}
	}
	if err := s.nodeAddress(ctx, "node-b", "10.0.0.5"); err == nil {
		t.Error("an address of another Node was accepted for a Node that does not exist")
	}
}

// countingReader counts the Node reads that reach the API.
type countingReader struct {
	client.Reader
	gets atomic.Int32
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

// A confirmed node address is trusted for nodeAddressTTL without reading
// the Node again, and no longer: an address the Node lost is refused once
// the TTL has passed, and a refusal is never remembered as a success.
func TestNodeAddressCache(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
	}}}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node).Build()
	reader := &countingReader{Reader: c}
	now := time.Unix(1000, 0)
	s := &Server{cfg: Config{Nodes: reader}, now: func() time.Time { return now }}
	ctx := context.Background()
	for i := range 3 {
		if err := s.nodeAddress(ctx, testNode, "10.0.0.5"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := reader.gets.Load(); n != 1 {
		t.Errorf("3 calls within the TTL read the Node %d times, want 1", n)
	}
	for i := range 2 {
		if err := s.nodeAddress(ctx, testNode, "10.0.0.6"); err == nil {
			t.Fatal("an address the Node does not have was accepted")
		}
		if n := reader.gets.Load(); n != int32(2+i) {
			t.Errorf("a refused address was answered from the cache (%d reads)", n)
		}
	}
	// The kubelet moves the Node to another address.
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.9"}}
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	now = now.Add(nodeAddressTTL)
	if err := s.nodeAddress(ctx, testNode, "10.0.0.5"); err == nil {
		t.Error("an address the Node lost was still accepted after the TTL")
	}
	if err := s.nodeAddress(ctx, testNode, "10.0.0.9"); err != nil {
		t.Errorf("the Node's new address: %v", err)
	}
}

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"https://10.0.0.5:9443":  "https://10.0.0.5:9443",
		"https://10.0.0.5:9443/": "https://10.0.0.5:9443",
		"https://[::1]:9443":     "https://[::1]:9443",
		"https://node-a:9443":    "https://node-a:9443",
		"http://10.0.0.5:9443":   "",
		"https://10.0.0.5":       "",
		"https://10.0.0.5:":      "",
		"https://u@10.0.0.5:1":   "",
		"https://10.0.0.5:1/x":   "",
		"https://10.0.0.5:1?a=b": "",
		"https://10.0.0.5:1#f":   "",
		"10.0.0.5:9443":          "",
		"":                       "",
		"https://%zz:1":          "",
	} {
		u, err := parseEndpoint(in)
		switch {
		case want == "" && err == nil:
			t.Errorf("parseEndpoint(%q) = %s, want an error", in, u)
		case want != "" && err != nil:
			t.Errorf("parseEndpoint(%q): %v, want %s", in, err, want)
		case want != "" && u.String() != want:
			t.Errorf("parseEndpoint(%q) = %s, want %s", in, u, want)
		}
	}
}

func TestNewRequiresItsParts(t *testing.T) {
	full := Config{
		Sandboxes: fake.NewClientBuilder().Build(), Nodes: fake.NewClientBuilder().Build(),
		Authenticator: authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) { return nil, false, nil }),
		Authorizer: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
			return authorizer.DecisionDeny, "", nil
		}),
		ClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return nil, nil },
		NodeCAs:           func() *x509.CertPool { return nil },
	}
	if _, err := New(full); err != nil {
		t.Fatalf("a complete Config is refused: %v", err)
	}
	for name, drop := range map[string]func(*Config){
		"Sandboxes":         func(c *Config) { c.Sandboxes = nil },
		"Nodes":             func(c *Config) { c.Nodes = nil },
		"Authenticator":     func(c *Config) { c.Authenticator = nil },
		"Authorizer":        func(c *Config) { c.Authorizer = nil },
		"ClientCertificate": func(c *Config) { c.ClientCertificate = nil },
		"NodeCAs":           func(c *Config) { c.NodeCAs = nil },
	} {
		c := full
		drop(&c)
		if _, err := New(c); err == nil {
			t.Errorf("a Config without %s is accepted", name)
		}
	}
}
