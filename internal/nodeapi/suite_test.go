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
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi/wire"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/controllers"
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
	cfg       *rest.Config
	testEnv   *envtest.Environment
	k8sClient client.Client
	clientset kubernetes.Interface
	scheme    = runtime.NewScheme()
	rawDocker *dockerclient.Client

	busyboxImage = envOr("BUSYBOX_IMAGE", "code-sandbox-test/busybox:1")

	// nodeName is the node of the manager and the main node API server.
	nodeName = fmt.Sprintf("%s%d-%x", testNodePrefix, GinkgoParallelProcess(), time.Now().UnixNano()&0xffff)
	// api is the main node API server; its reconciler publishes its
	// endpoint and pin.
	api *testServer
	// hist is the history store shared by the main server and the
	// reconciler (which deletes a Sandbox's history on finalize).
	hist *history.Store
	// docker is the manager's runtime client.
	docker *dockerruntime.Client
	// clientCA signs client certificates the main server accepts.
	clientCA *testCA

	stopManager context.CancelFunc
	managerDone chan struct{}
)

func TestNodeAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Node API suite (envtest + Docker)")
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the suite with `make test`, which provides kube-apiserver and etcd")

	var err error
	rawDocker, err = dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = rawDocker.Ping(ctx)
	Expect(err).NotTo(HaveOccurred(), "Docker Engine is not answering: run `make docker-up`")
	_, err = rawDocker.ImageInspect(ctx, busyboxImage)
	Expect(err).NotTo(HaveOccurred(), "test image %s is missing: run `make test-images`", busyboxImage)

	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(sandboxv1alpha1.AddToScheme(scheme)).To(Succeed())
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())

	// The ClusterRoles as shipped, so that the tests prove them.
	for _, f := range []string{"sandbox_exec_role.yaml", "sandbox_editor_role.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", f))
		Expect(err).NotTo(HaveOccurred())
		role := &rbacv1.ClusterRole{}
		Expect(yaml.Unmarshal(data, role)).To(Succeed())
		Expect(k8sClient.Create(ctx, role)).To(Succeed())
	}
	Expect(k8sClient.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-log-only"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes/log"}, Verbs: []string{"get"}}},
	})).To(Succeed())
	Expect(k8sClient.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "impersonate-users"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}},
	})).To(Succeed())

	clientCA = newTestCA("node-api-test-client-ca")
	caFile := filepath.Join(GinkgoT().TempDir(), "client-ca.crt")
	Expect(os.WriteFile(caFile, clientCA.certPEM, 0o600)).To(Succeed())

	hist, err = history.New(filepath.Join(GinkgoT().TempDir(), "history"), 0)
	Expect(err).NotTo(HaveOccurred())
	docker, err = dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second})
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	api = newTestServer(serverOptions{node: nodeName, runtime: docker, reader: mgr.GetClient(), apiReader: mgr.GetAPIReader(), clientCAFile: caFile})
	r, err := controllers.NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), docker, mgr.GetEventRecorder("sandbox-manager-"+nodeName),
		clock.RealClock{}, controllers.Options{
			NodeName:           nodeName,
			StopGracePeriod:    time.Second,
			SkipNameValidation: true,
			AgentEndpoint:      api.endpoint,
			AgentCertSHA256:    api.cert.SHA256,
			History:            hist,
		})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(mgr, time.Hour)).To(Succeed())
	Expect(mgr.Add(api.runnable)).To(Succeed())
	Expect(mgr.Add(api.auth)).To(Succeed())

	mctx, mcancel := context.WithCancel(context.Background())
	stopManager, managerDone = mcancel, make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(managerDone)
		Expect(mgr.Start(mctx)).To(Succeed())
	}()
	Expect(mgr.GetCache().WaitForCacheSync(ctx)).To(BeTrue())
})

var _ = AfterSuite(func() {
	if stopManager != nil {
		stopManager()
		Eventually(managerDone, 30*time.Second).Should(BeClosed())
	}
	if rawDocker != nil {
		removeTestContainers()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

func removeTestContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := rawDocker.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", dockerruntime.LabelManagedBy+"="+dockerruntime.ManagedByValue))})
	if err != nil {
		GinkgoWriter.Printf("listing leftover containers: %v\n", err)
		return
	}
	for _, ct := range list {
		if strings.HasPrefix(ct.Labels[dockerruntime.LabelNode], testNodePrefix) {
			_ = rawDocker.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		}
	}
}

// testServer is one node API server on loopback.
type testServer struct {
	node     string
	endpoint string
	cert     nodeapi.ServingCert
	server   *nodeapi.Server
	runnable *nodeapi.Runnable
	auth     *nodeapi.Auth
	// client pins the server's certificate.
	client *http.Client
}

type serverOptions struct {
	node               string
	runtime            nodeapi.Runtime
	reader, apiReader  client.Reader
	clientCAFile       string
	maxExecsPerSandbox int
}

// newTestServer builds a server; the caller runs its runnable.
func newTestServer(o serverOptions) *testServer {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	cert, err := nodeapi.GenerateServingCert(nodeapi.CertHosts("127.0.0.1", o.node), time.Hour)
	Expect(err).NotTo(HaveOccurred())
	auth, err := nodeapi.NewDelegatingAuth(clientset, nodeapi.AuthOptions{
		ClientCAFile: o.clientCAFile,
		// Short, so that a test that changes RBAC sees it soon; no test
		// relies on a cached answer expiring.
		AllowCacheTTL: 5 * time.Second, DenyCacheTTL: time.Second,
	})
	Expect(err).NotTo(HaveOccurred())
	srv, err := nodeapi.NewServer(nodeapi.Config{
		NodeName:           o.node,
		Sandboxes:          o.reader,
		APIReader:          o.apiReader,
		Runtime:            o.runtime,
		History:            hist,
		Authenticator:      auth.Authenticator,
		Authorizer:         auth.Authorizer,
		FileTransferLimit:  testTransferLimit,
		MaxExecsPerSandbox: o.maxExecsPerSandbox,
		DockerCheckTimeout: 3 * time.Second,
	})
	Expect(err).NotTo(HaveOccurred())
	ts := &testServer{
		node:     o.node,
		endpoint: "https://" + l.Addr().String(),
		cert:     cert,
		server:   srv,
		runnable: nodeapi.NewRunnable(l, srv, cert, auth.RequestsClientCerts()),
		auth:     auth,
	}
	ts.client = pinnedClient(cert.SHA256, nil)
	return ts
}

// start runs a server outside the manager until the test ends.
func (ts *testServer) start() *testServer {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(ts.runnable.Start(ctx)).To(Succeed())
	}()
	DeferCleanup(func() {
		cancel()
		Eventually(done, 10*time.Second).Should(BeClosed())
	})
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
	url := fmt.Sprintf("%s/v1/namespaces/%s/sandboxes/%s/%s", ts.endpoint, r.namespace, r.name, r.subresource)
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

func newNamespace() string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "napi-"}}
	Expect(k8sClient.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

// serviceAccountToken creates a ServiceAccount and returns a token for it.
func serviceAccountToken(ns, name string) string {
	GinkgoHelper()
	ctx := context.Background()
	Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// bind grants a ClusterRole to subject in ns.
func bind(ns, clusterRole string, subject rbacv1.Subject) {
	GinkgoHelper()
	Expect(k8sClient.Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: clusterRole + "-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{subject},
	})).To(Succeed())
}

func saSubject(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
}

func userSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

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
