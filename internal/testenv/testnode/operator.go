/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package testnode

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/aggregatedapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// Names of the in-process operator's objects, as the shipped config names
// them.
const (
	OperatorNamespace = "code-sandbox-system"
	APIServerService  = "code-sandbox-apiserver"
	APIServiceName    = "v1alpha1." + subresource.AggregatedGroup
)

// Operator is the operator's control-plane component running in this
// process: the operator CA and the aggregated API server, registered with
// kube-apiserver by an APIService whose Service points at loopback. The
// control plane must have been started WithAggregation.
type Operator struct {
	Authority *operatorca.Authority
	Server    *aggregatedapi.Server
	// Address is the aggregated API server's host:port on 127.0.0.1.
	Address string

	stop context.CancelFunc
	done chan struct{}
}

// StartOperator starts it and waits until kube-apiserver reports the
// APIService Available. Stop it in AfterSuite.
func StartOperator(cp *testenv.ControlPlane) *Operator {
	GinkgoHelper()
	ctx := context.Background()
	err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	op := &Operator{done: make(chan struct{})}
	op.Authority, err = operatorca.NewAuthority(cp.Client, operatorca.AuthorityOptions{Namespace: OperatorNamespace})
	Expect(err).NotTo(HaveOccurred())
	Expect(op.Authority.Ensure(ctx)).To(Succeed())

	auth, err := aggregatedapi.NewDelegatingAuth(cp.AdminKubeconfig(), cp.Clientset)
	Expect(err).NotTo(HaveOccurred())
	op.Server, err = aggregatedapi.New(aggregatedapi.Config{
		Sandboxes:         cp.Client,
		Nodes:             cp.Client,
		Authenticator:     auth.Authenticator,
		Authorizer:        auth.Authorizer,
		ClientCertificate: op.Authority.ClientCertificate(operatorca.AggregatorCommonName),
		NodeCAs:           op.Authority.Pool,
	})
	Expect(err).NotTo(HaveOccurred())
	serving, err := op.Authority.Current().IssueServing([]string{APIServerService + "." + OperatorNamespace + ".svc", "localhost", "127.0.0.1"}, 24*time.Hour)
	Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	op.Address = l.Addr().String()
	runnable := nodeapi.NewRunnable("aggregatedapi", l, op.Server,
		auth.TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving, nil }))

	runCtx, cancel := context.WithCancel(context.Background())
	op.stop = cancel
	go func() {
		defer GinkgoRecover()
		defer close(op.done)
		errs := make(chan error, 2)
		go func() { errs <- auth.Start(runCtx) }()
		go func() { errs <- runnable.Start(runCtx) }()
		for range 2 {
			Expect(<-errs).To(Succeed())
		}
	}()

	port := l.Addr().(*net.TCPAddr).Port
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: OperatorNamespace, Name: APIServerService},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(port)}}},
	}
	Expect(client.IgnoreAlreadyExists(cp.Client.Create(ctx, svc))).To(Succeed())
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": APIServiceName},
		"spec": map[string]any{
			"group":                subresource.AggregatedGroup,
			"version":              subresource.AggregatedVersion,
			"groupPriorityMinimum": int64(1000),
			"versionPriority":      int64(15),
			"caBundle":             op.Authority.BundlePEM(),
			"service": map[string]any{
				"namespace": OperatorNamespace,
				"name":      APIServerService,
				"port":      int64(port),
			},
		},
	}}
	Expect(cp.Client.Create(ctx, apiService)).To(Succeed())
	Eventually(func(g Gomega) {
		got := &unstructured.Unstructured{}
		got.SetAPIVersion("apiregistration.k8s.io/v1")
		got.SetKind("APIService")
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Name: APIServiceName}, got)).To(Succeed())
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		available := ""
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Available" {
				available = m["status"].(string) + ": " + strconv.Quote(m["message"].(string))
			}
		}
		g.Expect(available).To(HavePrefix("True"))
	}, time.Minute, 250*time.Millisecond).Should(Succeed())
	return op
}

// Stop removes the APIService and stops the servers; safe on nil.
func (op *Operator) Stop(cp *testenv.ControlPlane) {
	GinkgoHelper()
	if op == nil || op.stop == nil {
		return
	}
	apiService := &unstructured.Unstructured{}
	apiService.SetAPIVersion("apiregistration.k8s.io/v1")
	apiService.SetKind("APIService")
	apiService.SetName(APIServiceName)
	_ = cp.Client.Delete(context.Background(), apiService)
	op.stop()
	op.Server.Close()
	Eventually(op.done, 30*time.Second).Should(BeClosed())
}
