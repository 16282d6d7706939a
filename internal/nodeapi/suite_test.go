/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"

	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi/wire"

	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
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

	// nodeName is the node of the manager and the main node API server.
	nodeName = fmt.Sprintf("%s%d-%x", testNodePrefix, GinkgoParallelProcess(), time.Now().UnixNano()&0xffff)
	// node is the manager for nodeName; api is its node API server, whose
	// endpoint and pin the reconciler publishes.
	node *testnode.Node
	api  *testServer
	// hist is the history store shared by the main server and the
	// reconciler (which deletes a Sandbox's history on finalize).
	hist *history.Store
	// docker is the manager's runtime client.
	docker *dockerruntime.Client
	// clientCA signs client certificates the main server accepts.
	clientCA *testCA
)

func TestNodeAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Node API suite (envtest + Docker)")
}

var _ = BeforeSuite(func() {
	rawDocker = testenv.RequireDocker(busyboxImage)
	cp = testenv.StartControlPlane()
	k8sClient = cp.Client

	// The ClusterRoles as shipped, so that the tests prove them.
	cp.CreateShippedClusterRole("sandbox_exec_role.yaml")
	cp.CreateShippedClusterRole("sandbox_editor_role.yaml")
	cp.CreateClusterRole("sandbox-log-only",
		rbacv1.PolicyRule{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes/log"}, Verbs: []string{"get"}})
	cp.CreateClusterRole("impersonate-users",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}})

	clientCA = newTestCA("node-api-test-client-ca")
	caFile := filepath.Join(GinkgoT().TempDir(), "client-ca.crt")
	Expect(os.WriteFile(caFile, clientCA.certPEM, 0o600)).To(Succeed())

	node = testnode.Start(cp, testnode.NodeOptions{Name: nodeName, ClientCAFile: caFile, FileTransferLimit: testTransferLimit})
	api = wrapServer(node.API)
	hist, docker = node.History, node.Docker
})

var _ = AfterSuite(func() {
	node.Stop()
	if rawDocker != nil {
		testenv.RemoveNodeContainers(rawDocker, testNodePrefix)
	}
	cp.Stop()
})

// testServer is one node API server on loopback with a client that pins
// its certificate.
type testServer struct {
	*testnode.NodeAPI
	client *http.Client
}

func wrapServer(a *testnode.NodeAPI) *testServer {
	return &testServer{NodeAPI: a, client: pinnedClient(a.Cert.SHA256, nil)}
}

type serverOptions struct {
	node               string
	runtime            nodeapi.Runtime
	reader             client.Reader
	maxExecsPerSandbox int
}

// newTestServer builds another server for this control plane, sharing the
// main server's history; start runs it.
func newTestServer(o serverOptions) *testServer {
	GinkgoHelper()
	return wrapServer(testnode.NewNodeAPI(cp, testnode.NodeAPIOptions{
		Node: o.node, Runtime: o.runtime, Reader: o.reader, History: hist,
		FileTransferLimit: testTransferLimit, MaxExecsPerSandbox: o.maxExecsPerSandbox, DockerCheckTimeout: 3 * time.Second,
	}))
}

// start runs a server outside the manager until the test ends.
func (ts *testServer) start() *testServer {
	ts.Start()
	return ts
}

// pinnedClient is a plain HTTP client that trusts exactly the certificate
// with SHA-256 pin, optionally presenting a client certificate.
func pinnedClient(pin string, clientCert *tls.Certificate) *http.Client {
	tlsConfig := nodeapi.PinnedTLSConfig(pin)
	if clientCert != nil {
		tlsConfig.Certificates = []tls.Certificate{*clientCert}
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     tlsConfig,
		MaxIdleConnsPerHost: 100,
	}}
}

// request is one call to the node API.
type request struct {
	method, namespace, name, subresource string
	query                                string
	token                                string
	header                               http.Header
	body                                 io.Reader
	contentLength                        int64
	ctx                                  context.Context
}

func (ts *testServer) do(r request) *http.Response {
	GinkgoHelper()
	resp, err := ts.try(r)
	Expect(err).NotTo(HaveOccurred())
	return resp
}

func (ts *testServer) try(r request) (*http.Response, error) {
	url := fmt.Sprintf("%s/v1/namespaces/%s/sandboxes/%s/%s", ts.Endpoint, r.namespace, r.name, r.subresource)
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
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
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

func (ts *testServer) exec(ns, name, token string, req execio.Request) *execResult {
	GinkgoHelper()
	body, err := json.Marshal(req)
	Expect(err).NotTo(HaveOccurred())
	start := time.Now()
	resp := ts.do(request{method: http.MethodPost, namespace: ns, name: name, subresource: wire.SubresourceExec, token: token, body: bytes.NewReader(body)})
	defer resp.Body.Close()
	out := &execResult{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(&out.stdout, resp.Body)
		return out
	}
	Expect(resp.Header.Get("Content-Type")).To(Equal(wire.ContentTypeNDJSON))
	readFrames(resp.Body, func(f wire.Frame) {
		out.frames++
		switch {
		case f.Stream == wire.StreamStdout:
			if out.firstFrame == 0 {
				out.firstFrame = time.Since(start)
			}
			out.stdout.Write(f.Data)
		case f.Stream == wire.StreamStderr:
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
func readFrames(r io.Reader, fn func(wire.Frame)) {
	GinkgoHelper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var f wire.Frame
		Expect(json.Unmarshal(sc.Bytes(), &f)).To(Succeed(), "frame %q", sc.Text())
		fn(f)
	}
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

// serviceAccountToken creates a ServiceAccount and returns a token for it.
func serviceAccountToken(ns, name string) string { return cp.ServiceAccountToken(ns, name) }

// bind grants a ClusterRole to subject in ns.
func bind(ns, clusterRole string, subject rbacv1.Subject) { cp.Bind(ns, clusterRole, subject) }

func saSubject(ns, name string) rbacv1.Subject { return testenv.ServiceAccountSubject(ns, name) }

func userSubject(name string) rbacv1.Subject { return testenv.UserSubject(name) }

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

func readyReason(sbx *sandboxv1alpha1.Sandbox) func() string {
	return func() string {
		latest := &sandboxv1alpha1.Sandbox{}
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(sbx), latest); err != nil {
			return "error: " + err.Error()
		}
		c := meta.FindStatusCondition(latest.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
}

func waitReady(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	Eventually(readyReason(sbx), 90*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
	return getSandbox(sbx)
}

// testCA issues client certificates.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newTestCA(cn string) *testCA {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Expect(err).NotTo(HaveOccurred())
	cert, err := x509.ParseCertificate(der)
	Expect(err).NotTo(HaveOccurred())
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// clientCert issues a client certificate for user (CommonName) in groups
// (Organization).
func (ca *testCA) clientCert(user string, groups ...string) *tls.Certificate {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: user, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	Expect(err).NotTo(HaveOccurred())
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
