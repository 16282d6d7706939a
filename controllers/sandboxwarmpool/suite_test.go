/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool_test

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	sandboxcontroller "github.com/code-sandbox/code-sandbox-operator/controllers/sandbox"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxquota"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxwarmpool"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

var (
	cp      *testenv.ControlPlane
	process *webhookProcess
	// creates counts the controller's Sandbox create attempts per
	// namespace, refused ones included.
	creates = &createCounter{n: map[string]int{}}
)

func TestSandboxWarmPool(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "SandboxWarmPool suite (envtest + quota webhook; the test plays the node managers)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	if !tier.NeedsIntegration() {
		return
	}
	cp = testenv.StartControlPlane(testenv.WithWebhooks(testenv.RepoPath("config", "webhook", "manifests.yaml")))
	process = startWebhook()
})

var _ = AfterSuite(func() {
	process.stop()
	cp.Stop()
})

// webhookProcess is the control-plane role as cmd/manager wires it, minus the
// certificates and the aggregated API: the validators (so that quota
// refusals are real), the quota controller (which admission waits for) and
// the warm pool controller.
type webhookProcess struct {
	stopFn context.CancelFunc
	done   chan struct{}
}

func startWebhook() *webhookProcess {
	GinkgoHelper()
	wio := cp.Env.WebhookInstallOptions
	// As cmd/manager does with --webhook-client-ca: only kube-apiserver's
	// client certificate is accepted.
	clientAuth, err := webhookclient.TLSOption(cp.WebhookClientCAFile())
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    wio.LocalServingHost,
			Port:    wio.LocalServingPort,
			CertDir: wio.LocalServingCertDir,
			TLSOpts: []func(*tls.Config){clientAuth},
		}),
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		// The control-plane role's cache, as cmd/manager wires it: every
		// Sandbox without command and env.
		Cache: sandboxcontroller.CacheOptions(""),
	})
	Expect(err).NotTo(HaveOccurred())
	// The pool controller below runs as cp.Config's user, as in
	// cmd/manager; so do the specs' own writes.
	poolController, err := admission.Self(context.Background(), cp.Client)
	Expect(err).NotTo(HaveOccurred())
	mgr.GetWebhookServer().Register(admission.Path, &webhook.Admission{
		Handler: admission.NewSandboxValidator(mgr.GetAPIReader(), mgr.GetClient(), cp.Scheme, clock.RealClock{}).WithPoolController(poolController),
	})
	mgr.GetWebhookServer().Register(admission.WarmPoolPath, &webhook.Admission{
		Handler: admission.NewWarmPoolValidator(mgr.GetAPIReader(), cp.Scheme),
	})
	Expect(sandboxquota.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), clock.RealClock{},
		sandboxquota.Options{}).SetupWithManager(mgr)).To(Succeed())
	// The backoff is long, so that a pool refilling soon after its quota
	// is raised proves the quota watch, not a retry.
	Expect(sandboxwarmpool.NewReconciler(&countingClient{Client: mgr.GetClient(), counter: creates}, mgr.GetAPIReader(),
		mgr.GetEventRecorder("sandboxwarmpool-controller"), clock.RealClock{},
		sandboxwarmpool.Options{CreateBackoffMax: time.Minute}).SetupWithManager(mgr)).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	w := &webhookProcess{stopFn: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(w.done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	addr := net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort))
	Eventually(func() error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only probing that it listens
		if err != nil {
			return err
		}
		return conn.Close()
	}, 20*time.Second, 100*time.Millisecond).Should(Succeed())
	return w
}

func (w *webhookProcess) stop() {
	GinkgoHelper()
	if w == nil {
		return
	}
	w.stopFn()
	Eventually(w.done, 30*time.Second).Should(BeClosed())
}

type createCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *createCounter) get(namespace string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[namespace]
}

// countingClient counts the Sandbox creates that pass through it.
type countingClient struct {
	client.Client
	counter *createCounter
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*sandboxv1alpha1.Sandbox); ok {
		c.counter.mu.Lock()
		c.counter.n[obj.GetNamespace()]++
		c.counter.mu.Unlock()
	}
	return c.Client.Create(ctx, obj, opts...)
}
