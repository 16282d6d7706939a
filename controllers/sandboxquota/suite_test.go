/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	dockerclient "github.com/docker/docker/client"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxquota"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

const (
	nodeName = "quota-test-node"
	// reservationTimeout is short so that the overdue path runs within a
	// spec.
	reservationTimeout = 4 * time.Second
)

var (
	cp            *testenv.ControlPlane
	docker        *dockerclient.Client
	node          *testnode.Node
	webhookServer *webhookProcess
)

func TestSandboxQuota(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "SandboxQuota suite (envtest webhook + real Docker)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	docker = testenv.RequireDocker(testenv.BusyboxImage)
	cp = testenv.StartControlPlane(testenv.WithWebhooks(testenv.RepoPath("config", "webhook", "manifests.yaml")))
	testenv.RemoveNodeContainers(docker, nodeName)
	// A real node provisions the admitted Sandboxes, so that expiry is the
	// manager's doing, not the test's.
	node = testnode.Start(cp, nil, testnode.NodeOptions{Name: nodeName})
	webhookServer = startWebhook()
})

var _ = AfterSuite(func() {
	webhookServer.stop()
	node.Stop()
	if docker != nil {
		testenv.RemoveNodeContainers(docker, nodeName)
	}
	cp.Stop()
})

// webhookProcess is the control-plane role, as cmd/manager wires it, in this
// process: the validator on envtest's webhook address and the quota
// controller.
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
		// Several managers in one process register the same controller
		// name over the suite's life.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
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
	mgr.GetWebhookServer().Register(admission.SnapshotPath, &webhook.Admission{
		Handler: admission.NewSnapshotValidator(mgr.GetAPIReader(), mgr.GetClient(), cp.Scheme, clock.RealClock{}),
	})
	Expect(sandboxquota.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), clock.RealClock{},
		sandboxquota.Options{ReservationTimeout: reservationTimeout}).SetupWithManager(mgr)).To(Succeed())

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
