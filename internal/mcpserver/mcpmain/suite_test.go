/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// The suite runs the server's real wiring (flags, serveWith, the HTTP
// transport, the backends) against envtest's kube-apiserver, which issues
// and reviews the tokens, and, for the docker backend, the real Docker
// Engine.
var (
	cp *testenv.ControlPlane
	// adminKubeconfig is a system:masters user, for the kubernetes backend.
	adminKubeconfig string
	// reviewerKubeconfig may only create TokenReviews and
	// SubjectAccessReviews: the RBAC docs/mcp.md gives a docker-backend
	// server under --auth kubernetes.
	reviewerKubeconfig string
)

func TestCodeSandboxMCP(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "code-sandbox-mcp suite (envtest + Docker)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	if !tier.NeedsIntegration() {
		return // unit specs only: no Docker, no API server
	}
	// The service-account issuer's discovery names its keys at the API
	// server's external address, by default the host's own outside IP:
	// --auth oidc's tests fetch them at the loopback address it serves on.
	cp = testenv.StartControlPlane(func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().Set("external-hostname", "127.0.0.1")
	})
	dir := GinkgoT().TempDir()
	adminKubeconfig = writeKubeconfig(dir, envtest.User{Name: "mcp-admin", Groups: []string{"system:masters"}})
	cp.CreateClusterRole("code-sandbox-mcp-reviews",
		rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		rbacv1.PolicyRule{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	)
	cp.BindCluster("code-sandbox-mcp-reviews", testenv.UserSubject("mcp-reviewer"))
	reviewerKubeconfig = writeKubeconfig(dir, envtest.User{Name: "mcp-reviewer"})
})

var _ = AfterSuite(func() {
	if cp != nil {
		cp.Stop()
	}
})

func writeKubeconfig(dir string, u envtest.User) string {
	GinkgoHelper()
	user, err := cp.Env.AddUser(u, nil)
	Expect(err).NotTo(HaveOccurred())
	data, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	f := filepath.Join(dir, u.Name+".kubeconfig")
	Expect(os.WriteFile(f, data, 0o600)).To(Succeed())
	return f
}

// saToken returns a token of ServiceAccount ns/name (created if missing)
// from the TokenRequest API, as `kubectl create token name -n ns
// [--audience a]...` makes it: for audiences, or when none are given for
// the API server's own.
func saToken(ns, name string, audiences ...string) string {
	GinkgoHelper()
	ctx := context.Background()
	err := cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	tr, err := cp.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// configWith is DefaultConfig (the binary's configuration without flags)
// changed by mods, each as the flag it stands for would change it.
func configWith(mods ...func(*Config)) Config {
	o := DefaultConfig()
	for _, m := range mods {
		m(&o)
	}
	return o
}

// onHTTP serves on addr with --auth mode.
func onHTTP(addr, mode string) func(*Config) {
	return func(o *Config) { o.HTTPAddr, o.Auth = addr, mode }
}

// loopbackNoAuth serves on a loopback port without tokens, so that a
// refusal is about the settings under test (and stdout stays the test's).
var loopbackNoAuth = onHTTP("127.0.0.1:0", "none")

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startServer runs the server with DefaultConfig changed by mods (which
// must serve HTTP on 127.0.0.1:0) until the calling node ends, and returns
// its endpoint URL.
func startServer(mods ...func(*Config)) string {
	GinkgoHelper()
	o := configWith(mods...)
	stop := make(chan struct{})
	newCtx := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		return ctx, cancel
	}
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		defer GinkgoRecover()
		done <- serveWith(o, testLogger(), newCtx, func(u string) { urls <- u })
	}()
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		Fail("the server did not start: " + errString(err))
	case <-time.After(time.Minute):
		Fail("the server did not start within a minute")
	}
	DeferCleanup(func() {
		close(stop)
		Eventually(done).WithTimeout(2 * time.Minute).Should(Receive(BeNil()))
	})
	return url
}

// startupError runs the server with DefaultConfig changed by mods and
// returns the error it stops with at once.
func startupError(mods ...func(*Config)) error {
	GinkgoHelper()
	o := configWith(mods...)
	err := serveWith(o, testLogger(), func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // should it get this far, stop at once
		return ctx, cancel
	}, func(string) {})
	return err
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func isUsageError(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}
