/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// Every node name starts with this, so that AfterSuite can remove whatever
// a failed test left behind.
const testNodePrefix = "napi-test-"

// testTransferLimit is the test server's --file-transfer-limit: small, so
// that the caps are cheap to hit.
const testTransferLimit = 8 << 20

var (
	cp        *testenv.ControlPlane
	k8sClient client.Client
	rawDocker *dockerclient.Client

	busyboxImage = testenv.BusyboxImage

	// ca is the operator CA, kept in its Secret by a real Authority; it
	// issues the node APIs' serving certificates and the client
	// certificates of the specs.
	ca *operatorca.CA
	// aggregatorCert is the operator's aggregated API server's client
	// certificate: the only client the node APIs serve.
	aggregatorCert *tls.Certificate

	// nodeName is the node of the manager and the main node API server.
	nodeName = fmt.Sprintf("%s%d-%x", testNodePrefix, GinkgoParallelProcess(), time.Now().UnixNano()&0xffff)
	// node is the manager for nodeName; api is its node API server, whose
	// endpoint the reconciler publishes.
	node *testnode.Node
	api  *testServer
	// hist is the history store shared by the main server and the
	// reconciler (which deletes a Sandbox's history on finalize).
	hist *history.Store
	// docker is the manager's runtime client.
	docker *dockerruntime.Client
)

func TestNodeAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Node API suite (envtest + Docker)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	rawDocker = testenv.RequireDocker(busyboxImage)
	cp = testenv.StartControlPlane()
	k8sClient = cp.Client

	// The operator CA as the control plane keeps it. The node API needs
	// only the CA, not the aggregated API server (whose own suite covers
	// authorisation), so the Operator carries just the Authority.
	ctx := context.Background()
	err := k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testnode.OperatorNamespace}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	authority, err := operatorca.NewAuthority(k8sClient, operatorca.AuthorityOptions{Namespace: testnode.OperatorNamespace})
	Expect(err).NotTo(HaveOccurred())
	Expect(authority.Ensure(ctx)).To(Succeed())
	ca = authority.Current()
	aggregatorCert = issueClient(ca, operatorca.AggregatorCommonName)

	node = testnode.Start(cp, &testnode.Operator{Authority: authority},
		testnode.NodeOptions{Name: nodeName, FileTransferLimit: testTransferLimit})
	api = wrapServer(node.API, nodeName)
	hist, docker = node.History, node.Docker
})

var _ = AfterSuite(func() {
	node.Stop()
	if rawDocker != nil {
		testenv.RemoveNodeContainers(rawDocker, testNodePrefix)
	}
	cp.Stop()
})

// caller is an end user as the aggregated API server vouches for them, in
// the front-proxy headers.
type caller struct {
	user, uid string
	groups    []string
	extra     map[string][]string
}

// runner is the user of every spec that is not about identity.
var runner = &caller{
	user:   "system:serviceaccount:napi-callers:runner",
	uid:    "0b8c6a1e-runner",
	groups: []string{"system:serviceaccounts", "system:serviceaccounts:napi-callers", "system:authenticated"},
}

// anonymous sends no identity headers at all.
var anonymous = &caller{}

// setHeaders writes c as the aggregated API server does.
func (c *caller) setHeaders(h http.Header) {
	if c.user != "" {
		h.Set(subresource.HeaderRemoteUser, c.user)
	}
	if c.uid != "" {
		h.Set(subresource.HeaderRemoteUID, c.uid)
	}
	for _, g := range c.groups {
		h.Add(subresource.HeaderRemoteGroup, g)
	}
	for k, vs := range c.extra {
		for _, v := range vs {
			h.Add(subresource.HeaderRemoteExtraPrefix+k, v)
		}
	}
}

// testServer is one node API server on loopback and a client that calls
// it as the aggregated API server does: mutual TLS with the aggregator's
// client certificate, trusting only the operator CA's certificate for the
// server's node.
type testServer struct {
	*testnode.NodeAPI
	node   string
	client *http.Client
	// seen is the log of requests that reached HTTP, for servers built
	// with serverOptions.recordRequests.
	seen *requestLog
}

func wrapServer(a *testnode.NodeAPI, node string) *testServer {
	return &testServer{NodeAPI: a, node: node, client: nodeClient(node, aggregatorCert)}
}

// as is a copy of ts whose client presents cert (nil: none) instead of the
// aggregator's.
func (ts *testServer) as(cert *tls.Certificate) *testServer {
	cp := *ts
	cp.client = nodeClient(ts.node, cert)
	return &cp
}

type serverOptions struct {
	node               string
	runtime            nodeapi.Runtime
	reader             client.Reader
	maxExecsPerSandbox int
	execBodyBudget     int64
	maxFollowersPer    int
	maxFollowers       int
	// recordRequests logs every request that reaches the HTTP layer.
	recordRequests bool
	// egressEvents is nodeapi.Config.EgressEvents.
	egressEvents func(string) []subresource.EgressEvent
}

// newTestServer builds another server with the operator CA, sharing the
// main server's history; start runs it.
func newTestServer(o serverOptions) *testServer {
	GinkgoHelper()
	opts := testnode.NodeAPIOptions{
		Node: o.node, Runtime: o.runtime, Reader: o.reader, History: hist,
		FileTransferLimit: testTransferLimit, MaxExecsPerSandbox: o.maxExecsPerSandbox, DockerCheckTimeout: 3 * time.Second,
		ExecBodyBudget: o.execBodyBudget, MaxFollowersPerSandbox: o.maxFollowersPer, MaxFollowers: o.maxFollowers,
		EgressEvents: o.egressEvents,
	}
	var seen *requestLog
	if o.recordRequests {
		seen = &requestLog{}
		opts.Middleware = seen.wrap
	}
	ts := wrapServer(testnode.NewNodeAPI(ca, opts), o.node)
	ts.seen = seen
	return ts
}

// start runs a server outside the manager until the test ends.
func (ts *testServer) start() *testServer {
	ts.Start()
	return ts
}

// nodeTLSConfig is the aggregated API server's client TLS configuration
// for node: the server must prove it is that node with a certificate from
// the operator CA; the client presents cert unless it is nil.
func nodeTLSConfig(node string, cert *tls.Certificate) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// VerifyNode checks the chain and the node name in place of Go's
		// host name check (node certificates name no host).
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection:   operatorca.VerifyNode(ca.Pool, node),
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

func nodeClient(node string, cert *tls.Certificate) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     nodeTLSConfig(node, cert),
		MaxIdleConnsPerHost: 100,
	}}
}

// issueClient issues a client certificate from issuer for commonName.
func issueClient(issuer *operatorca.CA, commonName string) *tls.Certificate {
	GinkgoHelper()
	c, err := issuer.IssueClient(commonName, nil, time.Hour)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// selfSignedClient is a self-signed client-auth certificate for
// commonName: no CA vouches for it.
func selfSignedClient(commonName string) *tls.Certificate {
	GinkgoHelper()
	c, err := operatorca.SelfSigned(commonName, nil, x509.ExtKeyUsageClientAuth, time.Hour)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// seenRequest is a request that reached the server's HTTP layer.
// Its fields are exported for Gomega's HaveField.
type seenRequest struct {
	Method, Path string
	// ClientCN is the common name of the client certificate.
	ClientCN string
	// AuthBefore is the Authorization header as it arrived; AuthAfter is
	// what the server left in the request once it had served it (it
	// shares the header map with the request the handlers saw).
	AuthBefore, AuthAfter string
	// Done: the server has finished with the request.
	Done bool
}

// requestLog records the requests a server's HTTP layer received.
type requestLog struct {
	mu   sync.Mutex
	reqs []*seenRequest
}

func (l *requestLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := &seenRequest{Method: r.Method, Path: r.URL.Path, AuthBefore: r.Header.Get("Authorization")}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			s.ClientCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		l.mu.Lock()
		l.reqs = append(l.reqs, s)
		l.mu.Unlock()
		next.ServeHTTP(w, r)
		l.mu.Lock()
		s.AuthAfter, s.Done = r.Header.Get("Authorization"), true
		l.mu.Unlock()
	})
}

// requests returns copies of the requests seen so far.
func (l *requestLog) requests() []seenRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]seenRequest, len(l.reqs))
	for i, r := range l.reqs {
		out[i] = *r
	}
	return out
}

// request is one call to the node API.
type request struct {
	method, namespace, name, subresource string
	query                                string
	// as is the end user in the front-proxy headers; nil means runner.
	as            *caller
	header        http.Header
	body          io.Reader
	contentLength int64
	ctx           context.Context
}

func (ts *testServer) do(r request) *http.Response {
	GinkgoHelper()
	resp, err := ts.try(r)
	Expect(err).NotTo(HaveOccurred())
	return resp
}

func (ts *testServer) try(r request) (*http.Response, error) {
	url := fmt.Sprintf("%s%s%s/sandboxes/%s/%s", ts.Endpoint, subresource.PathPrefix, r.namespace, r.name, r.subresource)
	if r.query != "" {
		url += "?" + r.query
	}
	ctx := r.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, url, r.body)
	if err != nil {
		return nil, err
	}
	if r.contentLength > 0 {
		req.ContentLength = r.contentLength
	}
	as := r.as
	if as == nil {
		as = runner
	}
	as.setHeaders(req.Header)
	for k, v := range r.header {
		req.Header[k] = v
	}
	return ts.client.Do(req)
}

// execResult is a whole exec response.
type execResult struct {
	status         int
	stdout, stderr bytes.Buffer
	result         *execio.Result
	errorFrame     string
	frames         int
	// firstFrame is when the first output frame arrived, from the request.
	firstFrame time.Duration
	total      time.Duration
}

// exec runs req as runner.
func (ts *testServer) exec(ns, name string, req execio.Request) *execResult {
	GinkgoHelper()
	return ts.execAs(runner, ns, name, req)
}

func (ts *testServer) execAs(as *caller, ns, name string, req execio.Request) *execResult {
	GinkgoHelper()
	body, err := json.Marshal(req)
	Expect(err).NotTo(HaveOccurred())
	start := time.Now()
	resp := ts.do(request{method: http.MethodPost, namespace: ns, name: name, subresource: subresource.SubresourceExec, as: as, body: bytes.NewReader(body)})
	defer resp.Body.Close()
	out := &execResult{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(&out.stdout, resp.Body)
		return out
	}
	Expect(resp.Header.Get("Content-Type")).To(Equal(subresource.ContentTypeNDJSON))
	readFrames(resp.Body, func(f subresource.Frame) {
		out.frames++
		switch {
		case f.Stream == subresource.StreamStdout:
			if out.firstFrame == 0 {
				out.firstFrame = time.Since(start)
			}
			out.stdout.Write(f.Data)
		case f.Stream == subresource.StreamStderr:
			if out.firstFrame == 0 {
				out.firstFrame = time.Since(start)
			}
			out.stderr.Write(f.Data)
		case f.Result != nil:
			out.result = f.Result
		case f.Error != "":
			out.errorFrame = f.Error
		}
	})
	out.total = time.Since(start)
	return out
}

// readFrames decodes an NDJSON exec response frame by frame.
func readFrames(r io.Reader, fn func(subresource.Frame)) {
	GinkgoHelper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var f subresource.Frame
		Expect(json.Unmarshal(sc.Bytes(), &f)).To(Succeed(), "frame %q", sc.Text())
		fn(f)
	}
}

// expectStatus decodes the metav1.Status of an exec that was refused, and
// checks its reason and that it names the Sandbox's resource.
func expectStatus(res *execResult, reason metav1.StatusReason) *metav1.Status {
	GinkgoHelper()
	st := &metav1.Status{}
	Expect(json.Unmarshal(res.stdout.Bytes(), st)).To(Succeed(), "body %q", res.stdout.String())
	Expect(st.Kind).To(Equal("Status"))
	Expect(int(st.Code)).To(Equal(res.status))
	Expect(st.Reason).To(Equal(reason), "%+v", st)
	Expect(st.Details).NotTo(BeNil(), "%+v", st)
	Expect(st.Details.Group).To(Equal(subresource.StatusGroup))
	Expect(st.Details.Kind).To(Equal(subresource.StatusKind))
	return st
}

// statusOf decodes a metav1.Status error answer.
func statusOf(resp *http.Response) metav1.Status {
	GinkgoHelper()
	defer resp.Body.Close()
	var st metav1.Status
	data, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	Expect(json.Unmarshal(data, &st)).To(Succeed(), "body %q", data)
	Expect(st.Kind).To(Equal("Status"))
	Expect(int(st.Code)).To(Equal(resp.StatusCode))
	return st
}

var nameCounter int

func uniqueName(prefix string) string {
	nameCounter++
	return fmt.Sprintf("%s-%d-%d", prefix, GinkgoParallelProcess(), nameCounter)
}

func newNamespace() string { return cp.NewNamespace("napi-") }

// createSandbox creates a Sandbox on nodeName and removes it after the test.
func createSandbox(ns, name string, mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: busyboxImage, NodeName: nodeName},
	}
	for _, m := range mutate {
		m(sbx)
	}
	Expect(k8sClient.Create(context.Background(), sbx)).To(Succeed())
	DeferCleanup(func() {
		ctx := context.Background()
		latest := &sandboxv1alpha1.Sandbox{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(sbx), latest); err != nil {
			return
		}
		_ = k8sClient.Delete(ctx, latest)
	})
	return sbx
}

func getSandbox(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	latest := &sandboxv1alpha1.Sandbox{}
	Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(sbx), latest)).To(Succeed())
	return latest
}

// readyReason polls the Ready condition as "Status/Reason" (testenv.ReadyReason).
func readyReason(sbx *sandboxv1alpha1.Sandbox) func() string {
	return testenv.ReadyReason(k8sClient, client.ObjectKeyFromObject(sbx))
}

func waitReady(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	return testenv.WaitReady(k8sClient, sbx)
}
