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

	"github.com/code-sandbox/code-sandbox-operator/internal/frontproxy"
)

// FrontProxyClientName is the CommonName of kube-apiserver's front-proxy
// client certificate under WithAggregation.
const FrontProxyClientName = frontproxy.ClientName

// WithAggregation configures kube-apiserver as a cluster does for
// aggregated API servers (see package frontproxy).
func WithAggregation() Option {
	return func(env *envtest.Environment) {
		GinkgoHelper()
		dir, err := os.MkdirTemp("", "code-sandbox-front-proxy-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, dir)
		Expect(frontproxy.Configure(env, dir, 24*time.Hour)).To(Succeed())
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
