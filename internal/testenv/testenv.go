/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package testenv starts what the integration suites share: the real Docker
// Engine with the test images, envtest's kube-apiserver and etcd with the
// Sandbox CRD, and a node (manager, reconciler and node API on loopback).
// It is imported only by tests; every function asserts with Gomega, so it
// must be called from Ginkgo nodes.
package testenv

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

// Test images, built offline by `make test-images`.
var (
	BusyboxImage = EnvOr("BUSYBOX_IMAGE", "code-sandbox-test/busybox:1")
	PythonImage  = EnvOr("PYTHON_IMAGE", "code-sandbox-test/python:3")
)

// EnvOr returns the environment variable key, or fallback when it is unset.
func EnvOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// RepoPath is a path below the repository root, wherever the test runs from.
func RepoPath(elem ...string) string {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	return filepath.Join(append([]string{root}, elem...)...)
}

// RequireDocker connects to the Docker Engine and checks that it answers
// and has images, failing with the make target that fixes it.
func RequireDocker(images ...string) *dockerclient.Client {
	GinkgoHelper()
	docker, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = docker.Ping(ctx)
	Expect(err).NotTo(HaveOccurred(), "Docker Engine is not answering: run `make docker-up`")
	for _, img := range images {
		_, err := docker.ImageInspect(ctx, img)
		Expect(err).NotTo(HaveOccurred(), "test image %s is missing: run `make test-images`", img)
	}
	return docker
}

// RemoveNodeContainers removes the operator's containers on nodes whose
// name starts with nodePrefix: what a failed test left behind.
func RemoveNodeContainers(docker *dockerclient.Client, nodePrefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := docker.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", dockerruntime.LabelManagedBy+"="+dockerruntime.ManagedByValue))})
	if err != nil {
		GinkgoWriter.Printf("listing leftover containers: %v\n", err)
		return
	}
	for _, ct := range list {
		if strings.HasPrefix(ct.Labels[dockerruntime.LabelNode], nodePrefix) {
			_ = docker.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
			for _, m := range ct.Mounts {
				if v := dockerruntime.MachineIDVolumeOf(m.Destination, m.Source); v != "" {
					_ = docker.VolumeRemove(ctx, v, true)
				}
			}
		}
	}
}

// ControlPlane is envtest's kube-apiserver and etcd with the Sandbox CRD.
type ControlPlane struct {
	Env       *envtest.Environment
	Config    *rest.Config
	Scheme    *kruntime.Scheme
	Client    client.Client
	Clientset kubernetes.Interface
}

// StartControlPlane starts envtest (KUBEBUILDER_ASSETS must point at
// kube-apiserver and etcd, as `make test` arranges) and installs the CRDs
// from config/crd/bases. It also routes controller-runtime's logs to
// GinkgoWriter.
func StartControlPlane(opts ...Option) *ControlPlane {
	GinkgoHelper()
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the suite with `make test`, which provides kube-apiserver and etcd")
	cp := &ControlPlane{Scheme: kruntime.NewScheme()}
	Expect(clientgoscheme.AddToScheme(cp.Scheme)).To(Succeed())
	Expect(sandboxv1alpha1.AddToScheme(cp.Scheme)).To(Succeed())
	cp.Env = &envtest.Environment{
		CRDDirectoryPaths:     []string{RepoPath("config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	for _, o := range opts {
		o(cp.Env)
	}
	var err error
	cp.Config, err = cp.Env.Start()
	if err != nil {
		// Start can fail after launching etcd and kube-apiserver (a CRD
		// that does not install, say); the suite's AfterSuite never sees
		// this ControlPlane, so stop them here.
		_ = cp.Env.Stop()
	}
	Expect(err).NotTo(HaveOccurred())
	cp.Client, err = client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	Expect(err).NotTo(HaveOccurred())
	cp.Clientset, err = kubernetes.NewForConfig(cp.Config)
	Expect(err).NotTo(HaveOccurred())
	return cp
}

// Option adjusts the envtest environment before it starts.
type Option func(*envtest.Environment)

// WithWebhooks installs the webhook configurations in the given manifest
// files. envtest rewrites their client configs to a local address and
// issues a serving certificate; serve them from Env.WebhookInstallOptions
// (LocalServingHost, LocalServingPort, LocalServingCertDir), requiring
// kube-apiserver's client certificate as cmd/manager does with
// --webhook-client-ca: kube-apiserver presents one signed by
// WebhookClientCAFile (package webhookclient).
func WithWebhooks(paths ...string) Option {
	return func(env *envtest.Environment) {
		GinkgoHelper()
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: paths}
		dir, err := os.MkdirTemp("", "code-sandbox-webhook-client-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, dir)
		admissionConfig, err := webhookclient.Write(dir, 24*time.Hour)
		Expect(err).NotTo(HaveOccurred())
		env.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admissionConfig)
	}
}

// WebhookClientCAFile is the CA that signs the client certificate
// kube-apiserver presents to admission webhooks under WithWebhooks.
func (cp *ControlPlane) WebhookClientCAFile() string {
	config := cp.Env.ControlPlane.GetAPIServer().Configure().Get("admission-control-config-file").Get(nil)
	Expect(config).To(HaveLen(1), "the control plane was not started WithWebhooks")
	return filepath.Join(filepath.Dir(config[0]), webhookclient.CAFile)
}

// Stop stops the control plane; it is safe on a nil ControlPlane (a
// BeforeSuite that failed early).
func (cp *ControlPlane) Stop() {
	GinkgoHelper()
	if cp != nil && cp.Env != nil {
		Expect(cp.Env.Stop()).To(Succeed())
	}
}

// ClientCAFile is the CA that signs envtest's client certificates (its
// admin rest.Config authenticates with one).
func (cp *ControlPlane) ClientCAFile() string {
	return filepath.Join(cp.Env.ControlPlane.APIServer.CertDir, "client-cert-auth-ca.crt")
}

// CreateShippedClusterRole creates a ClusterRole from config/rbac as
// shipped, so that tests prove the manifest itself, and returns its name.
func (cp *ControlPlane) CreateShippedClusterRole(file string) string {
	GinkgoHelper()
	data, err := os.ReadFile(RepoPath("config", "rbac", file))
	Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{}
	Expect(yaml.Unmarshal(data, role)).To(Succeed())
	Expect(cp.Client.Create(context.Background(), role)).To(Succeed())
	return role.Name
}

// CreateClusterRole creates a ClusterRole with rules.
func (cp *ControlPlane) CreateClusterRole(name string, rules ...rbacv1.PolicyRule) {
	GinkgoHelper()
	Expect(cp.Client.Create(context.Background(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules})).To(Succeed())
}

// NewNamespace creates a namespace named after prefix.
func (cp *ControlPlane) NewNamespace(prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	Expect(cp.Client.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

// ServiceAccountToken creates a ServiceAccount and returns a token for it
// from the TokenRequest API.
func (cp *ControlPlane) ServiceAccountToken(ns, name string) string {
	GinkgoHelper()
	ctx := context.Background()
	Expect(cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
	tr, err := cp.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// Bind grants a ClusterRole to subject in ns.
func (cp *ControlPlane) Bind(ns, clusterRole string, subject rbacv1.Subject) {
	GinkgoHelper()
	Expect(cp.Client.Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: clusterRole + "-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{subject},
	})).To(Succeed())
}

// BindCluster grants a ClusterRole to subject cluster-wide.
func (cp *ControlPlane) BindCluster(clusterRole string, subject rbacv1.Subject) {
	GinkgoHelper()
	Expect(cp.Client.Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: clusterRole + "-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{subject},
	})).To(Succeed())
}

// ServiceAccountSubject and UserSubject are RBAC subjects.
func ServiceAccountSubject(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
}

func UserSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

// ConfigForToken is a client config for the control plane that
// authenticates with token alone: the API server's address and CA, no
// client certificate.
func (cp *ControlPlane) ConfigForToken(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = token
	return cfg
}

// LoopbackAddress is the address every node manager started by the tests
// (and make dev-up) advertises its node API on.
const LoopbackAddress = "127.0.0.1"

// EnsureNode creates the Node name unless it exists, and makes addresses
// (as InternalIP) part of its status.addresses, as a kubelet reports them:
// the aggregated API server dials a node API only at one of its Node's
// addresses. envtest has no kubelet, so the tests write them.
func (cp *ControlPlane) EnsureNode(name string, addresses ...string) {
	GinkgoHelper()
	ctx := context.Background()
	err := cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred(), "creating Node %s", name)
	}
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		changed := false
	next:
		for _, a := range addresses {
			for _, have := range n.Status.Addresses {
				if have.Type == corev1.NodeInternalIP && have.Address == a {
					continue next
				}
			}
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
			changed = true
		}
		if !changed {
			return nil
		}
		return cp.Client.Status().Update(ctx, &n)
	})).To(Succeed(), "setting the addresses of Node %s", name)
}

// NodeBoundToken returns a token of ServiceAccount serviceAccount in ns bound
// to a Pod on node, as a kubelet hands it to the Pod: the API server then
// adds the node's name to the requests made with it (the user's extra
// authentication.kubernetes.io/node-name), which is how it knows on whose
// behalf a node manager acts. It creates, unless they exist, the Node, the
// ServiceAccount and the Pod (named after both, with spec.nodeName set; it
// never runs, since envtest has no kubelet). The token is valid as long as
// the Pod and the Node exist, and for an hour.
func (cp *ControlPlane) NodeBoundToken(ns, serviceAccount, node string) string {
	GinkgoHelper()
	ctx := context.Background()
	create := func(obj client.Object) {
		GinkgoHelper()
		if err := cp.Client.Create(ctx, obj); !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred(), "creating %T %s", obj, obj.GetName())
		}
	}
	cp.EnsureNode(node, LoopbackAddress)
	create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: serviceAccount}})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: serviceAccount + "-" + node},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: serviceAccount,
			Containers:         []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	create(pod)
	Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
	Expect(pod.Spec.NodeName).To(Equal(node), "Pod %s/%s exists on another node", ns, pod.Name)
	Expect(pod.Spec.ServiceAccountName).To(Equal(serviceAccount), "Pod %s/%s runs as another ServiceAccount", ns, pod.Name)
	tr, err := cp.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// WithServiceRange sets kube-apiserver's Service ClusterIP range (envtest's
// default is 10.0.0.0/24), e.g. to kubeadm's 10.96.0.0/16 for manifests
// that fix a ClusterIP for a kind cluster.
func WithServiceRange(cidr string) Option {
	return func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", cidr)
	}
}
