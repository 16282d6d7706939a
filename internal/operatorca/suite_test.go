/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// cp is envtest's API server: real authentication (ServiceAccount tokens
// bound to Pods, with the node-name extra), RBAC and the CSR API.
var cp *testenv.ControlPlane

func TestOperatorCA(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "operatorca suite (envtest)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	cp = testenv.StartControlPlane()
})

var _ = AfterSuite(func() {
	cp.Stop()
})

// identity is a ServiceAccount's token and what it can reach.
type identity struct {
	Username  string
	Config    *rest.Config
	Client    client.Client
	Clientset kubernetes.Interface
}

func serviceAccountUsername(ns, name string) string {
	return fmt.Sprintf("system:serviceaccount:%s:%s", ns, name)
}

// ensureServiceAccount creates ns/name unless it exists.
func ensureServiceAccount(ns, name string) {
	GinkgoHelper()
	err := cp.Client.Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
}

// ensureNode creates a Node unless it exists.
func ensureNode(name string) {
	GinkgoHelper()
	err := cp.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
}

// tokenFor returns an identity with a TokenRequest token for ns/sa. With a
// node, the token is bound to a new Pod of that ServiceAccount scheduled
// there, as a DaemonSet Pod's projected token is: the API server then adds
// NodeNameExtra to the user's extra.
func tokenFor(ns, sa, node string) *identity {
	GinkgoHelper()
	ctx := context.Background()
	ensureServiceAccount(ns, sa)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if node != "" {
		ensureNode(node)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: sa + "-"},
			Spec: corev1.PodSpec{
				NodeName:                     node,
				ServiceAccountName:           sa,
				AutomountServiceAccountToken: ptr.To(false),
				Containers:                   []corev1.Container{{Name: "manager", Image: "manager"}},
			},
		}
		Expect(cp.Client.Create(ctx, pod)).To(Succeed())
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cp.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	id := &identity{Username: serviceAccountUsername(ns, sa), Config: cfg}
	id.Client, err = client.New(cfg, client.Options{Scheme: cp.Scheme})
	Expect(err).NotTo(HaveOccurred())
	id.Clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	return id
}

var roleSeq int

// installShippedRole grants ns/sa the roles in a generated role.yaml
// (config/rbac or config/webhook) as shipped: the ClusterRole bound
// cluster-wide, and each Role of namespace "system" in ns (kustomize's
// namespace transform), bound there, all under unique names. So the tests
// prove the markers.
func installShippedRole(file, ns, sa string) {
	GinkgoHelper()
	ctx := context.Background()
	data, err := os.ReadFile(testenv.RepoPath(file))
	Expect(err).NotTo(HaveOccurred())
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(bytes.TrimPrefix(doc, []byte("---")))) == 0 {
			continue
		}
		var meta metav1.TypeMeta
		Expect(yaml.Unmarshal(doc, &meta)).To(Succeed())
		roleSeq++
		switch meta.Kind {
		case "ClusterRole":
			role := &rbacv1.ClusterRole{}
			Expect(yaml.Unmarshal(doc, role)).To(Succeed())
			role.Name = fmt.Sprintf("%s-%d", role.Name, roleSeq)
			Expect(cp.Client.Create(ctx, role)).To(Succeed())
			Expect(cp.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: role.Name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
				Subjects:   []rbacv1.Subject{subject},
			})).To(Succeed())
		case "Role":
			role := &rbacv1.Role{}
			Expect(yaml.Unmarshal(doc, role)).To(Succeed())
			Expect(role.Namespace).To(Equal("system"))
			role.Namespace = ns
			role.Name = fmt.Sprintf("%s-%d", role.Name, roleSeq)
			Expect(cp.Client.Create(ctx, role)).To(Succeed())
			Expect(cp.Client.Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
				Subjects:   []rbacv1.Subject{subject},
			})).To(Succeed())
		default:
			Fail("unexpected kind " + meta.Kind + " in " + file)
		}
	}
}

const eventually = 20 * time.Second
