/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package testenv

import (
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// FrontProxyClientName is the CommonName of kube-apiserver's front-proxy
// client certificate under WithAggregation.
const FrontProxyClientName = "front-proxy-client"

// WithAggregation configures kube-apiserver as a cluster does for
// aggregated API servers: a front-proxy CA, the client certificate it
// presents to them, and the request-header flags, which kube-apiserver
// publishes in kube-system/extension-apiserver-authentication.
func WithAggregation() Option {
	return func(env *envtest.Environment) {
		GinkgoHelper()
		dir, err := os.MkdirTemp("", "code-sandbox-front-proxy-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, dir)
		ca, err := operatorca.NewCA("front-proxy-ca", 24*time.Hour, time.Now())
		Expect(err).NotTo(HaveOccurred())
		client, err := ca.IssueClient(FrontProxyClientName, nil, 24*time.Hour)
		Expect(err).NotTo(HaveOccurred())
		certPEM, keyPEM, err := operatorca.EncodeKeyPair(client)
		Expect(err).NotTo(HaveOccurred())
		files := map[string][]byte{"ca.crt": ca.CertPEM(), "client.crt": certPEM, "client.key": keyPEM}
		for name, data := range files {
			Expect(os.WriteFile(filepath.Join(dir, name), data, 0o600)).To(Succeed())
		}
		args := env.ControlPlane.GetAPIServer().Configure()
		args.Set("requestheader-client-ca-file", filepath.Join(dir, "ca.crt"))
		args.Set("requestheader-allowed-names", FrontProxyClientName)
		args.Set("requestheader-username-headers", "X-Remote-User")
		args.Set("requestheader-uid-headers", "X-Remote-Uid")
		args.Set("requestheader-group-headers", "X-Remote-Group")
		args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
		args.Set("proxy-client-cert-file", filepath.Join(dir, "client.crt"))
		args.Set("proxy-client-key-file", filepath.Join(dir, "client.key"))
	}
}

// AdminKubeconfig writes a kubeconfig for envtest's admin user and returns
// its path, for components that read a kubeconfig file themselves.
func (cp *ControlPlane) AdminKubeconfig() string {
	GinkgoHelper()
	user, err := cp.Env.AddUser(envtest.User{Name: "code-sandbox-test-admin", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	data, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	dir, err := os.MkdirTemp("", "code-sandbox-kubeconfig-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	path := filepath.Join(dir, "kubeconfig")
	Expect(os.WriteFile(path, data, 0o600)).To(Succeed())
	return path
}
