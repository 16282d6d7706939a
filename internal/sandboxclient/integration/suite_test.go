// Package integration_test drives sandboxclient against the real node API:
// a kube-apiserver (envtest), the Sandbox reconciler and the node API server
// of one manager, and the node's real Docker Engine. It lives apart from the
// client's unit suite so that that one runs anywhere.
package integration_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
)

// Every node name starts with this, so that AfterSuite can remove whatever
// a failed test left behind.
const testNodePrefix = "sbxclient-test-"

var (
	cfg       *rest.Config
	testEnv   *envtest.Environment
	k8sClient client.Client
	clientset kubernetes.Interface
	rawDocker *dockerclient.Client

	busyboxImage = envOr("BUSYBOX_IMAGE", "code-sandbox-test/busybox:1")
	nodeName     = fmt.Sprintf("%s%d-%x", testNodePrefix, GinkgoParallelProcess(), time.Now().UnixNano()&0xffff)

	// execRole is the shipped ClusterRole for using Sandboxes.
	execRole string

	stopManager context.CancelFunc
	managerDone chan struct{}
)

func TestIntegration(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "sandboxclient against the node API (envtest + Docker)")
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

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(sandboxv1alpha1.AddToScheme(scheme)).To(Succeed())
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())

	// The exec ClusterRole as shipped, so that these tests prove it too.
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "rbac", "sandbox_exec_role.yaml"))
	Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{}
	Expect(yaml.Unmarshal(data, role)).To(Succeed())
	Expect(k8sClient.Create(ctx, role)).To(Succeed())
	execRole = role.Name
	Expect(k8sClient.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"}, Verbs: []string{"get"}}},
	})).To(Succeed())
	Expect(k8sClient.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "impersonator"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}},
	})).To(Succeed())

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	docker, err := dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	hist, err := history.New(filepath.Join(GinkgoT().TempDir(), "history"), 0)
	Expect(err).NotTo(HaveOccurred())

	// The node API as the manager runs it, on loopback. It accepts client
	// certificates from envtest's client CA, so that the admin rest.Config
	// envtest hands out (a client certificate) works against it too.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	cert, err := nodeapi.GenerateServingCert(nodeapi.CertHosts("127.0.0.1", nodeName), time.Hour)
	Expect(err).NotTo(HaveOccurred())
	auth, err := nodeapi.NewDelegatingAuth(clientset, nodeapi.AuthOptions{
		ClientCAFile:  filepath.Join(testEnv.ControlPlane.APIServer.CertDir, "client-cert-auth-ca.crt"),
		AllowCacheTTL: time.Second, DenyCacheTTL: time.Second,
	})
	Expect(err).NotTo(HaveOccurred())
	server, err := nodeapi.NewServer(nodeapi.Config{
		NodeName:           nodeName,
		Sandboxes:          mgr.GetClient(),
		APIReader:          mgr.GetAPIReader(),
		Runtime:            docker,
		History:            hist,
		Authenticator:      auth.Authenticator,
		Authorizer:         auth.Authorizer,
		DockerCheckTimeout: 5 * time.Second,
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(mgr.Add(auth)).To(Succeed())
	Expect(mgr.Add(nodeapi.NewRunnable(l, server, cert, auth.RequestsClientCerts()))).To(Succeed())

	r, err := controllers.NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), docker, mgr.GetEventRecorder("sandbox-manager-"+nodeName),
		clock.RealClock{}, controllers.Options{
			NodeName:           nodeName,
			StopGracePeriod:    time.Second,
			RetryBackoffBase:   200 * time.Millisecond,
			RetryBackoffMax:    2 * time.Second,
			SkipNameValidation: true,
			AgentEndpoint:      "https://" + l.Addr().String(),
			AgentCertSHA256:    cert.SHA256,
			History:            hist,
		})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(mgr, time.Hour)).To(Succeed())

	mctx, mcancel := context.WithCancel(context.Background())
	stopManager, managerDone = mcancel, make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(managerDone)
		defer docker.Close()
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

func newNamespace() string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sbxclient-"}}
	Expect(k8sClient.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

// createSandbox creates a Sandbox on nodeName and deletes it when the
// enclosing container ends.
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
		_ = k8sClient.Delete(context.Background(), sbx)
	})
	return sbx
}

// readyState is "Status/Reason" of the Ready condition, plus whether the
// node API endpoint is published.
func readyState(sbx *sandboxv1alpha1.Sandbox) func() string {
	return func() string {
		latest := &sandboxv1alpha1.Sandbox{}
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(sbx), latest); err != nil {
			return "error: " + err.Error()
		}
		c := meta.FindStatusCondition(latest.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if c == nil {
			return ""
		}
		s := string(c.Status) + "/" + c.Reason
		if latest.Status.AgentEndpoint != "" && latest.Status.AgentCertSHA256 != "" {
			s += "/endpoint"
		}
		return s
	}
}

func waitReady(sbx *sandboxv1alpha1.Sandbox) {
	GinkgoHelper()
	Eventually(readyState(sbx), 90*time.Second, 100*time.Millisecond).Should(Equal("True/Running/endpoint"))
}

// serviceAccountConfig creates a ServiceAccount and returns a rest.Config
// that authenticates as it with a token from the TokenRequest API.
func serviceAccountConfig(ns, name string) *rest.Config {
	GinkgoHelper()
	ctx := context.Background()
	Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return &rest.Config{Host: cfg.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}}
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

// bindCluster grants a ClusterRole to subject cluster-wide.
func bindCluster(clusterRole string, subject rbacv1.Subject) {
	GinkgoHelper()
	Expect(k8sClient.Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: clusterRole + "-"},
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
