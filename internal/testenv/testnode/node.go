/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package testnode runs a node for integration suites: a manager with the
// Sandbox reconciler and the node API it advertises, on loopback. It is
// apart from testenv so that the controllers' own suite can use testenv.
package testnode

import (
	"context"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/code-sandbox/code-sandbox-operator/controllers"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// NodeAPIOptions configure one node API server on loopback.
type NodeAPIOptions struct {
	Node              string
	Runtime           nodeapi.Runtime
	Reader, APIReader client.Reader
	History           nodeapi.HistoryStore
	// ClientCAFile, when set, makes the server accept client certificates.
	ClientCAFile       string
	FileTransferLimit  int64
	MaxExecsPerSandbox int
	// AllowCacheTTL and DenyCacheTTL default to 5 s and 1 s: short, so that
	// a test that changes RBAC sees it soon.
	AllowCacheTTL, DenyCacheTTL time.Duration
	// DockerCheckTimeout defaults to 5 s.
	DockerCheckTimeout time.Duration
}

// NodeAPI is a node API server listening on 127.0.0.1; run Runnable and
// Auth (in a manager, or with Start).
type NodeAPI struct {
	Endpoint string
	Cert     nodeapi.ServingCert
	Server   *nodeapi.Server
	Runnable *nodeapi.Runnable
	Auth     *nodeapi.Auth
}

// NewNodeAPI builds a node API server as the manager builds it, with the
// delegating authenticator and authorizer of this control plane.
func NewNodeAPI(cp *testenv.ControlPlane, o NodeAPIOptions) *NodeAPI {
	GinkgoHelper()
	if o.AllowCacheTTL == 0 {
		o.AllowCacheTTL = 5 * time.Second
	}
	if o.DenyCacheTTL == 0 {
		o.DenyCacheTTL = time.Second
	}
	if o.DockerCheckTimeout == 0 {
		o.DockerCheckTimeout = 5 * time.Second
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	cert, err := nodeapi.GenerateServingCert(nodeapi.CertHosts("127.0.0.1", o.Node), time.Hour)
	Expect(err).NotTo(HaveOccurred())
	auth, err := nodeapi.NewDelegatingAuth(cp.Clientset, nodeapi.AuthOptions{
		ClientCAFile:  o.ClientCAFile,
		AllowCacheTTL: o.AllowCacheTTL,
		DenyCacheTTL:  o.DenyCacheTTL,
	})
	Expect(err).NotTo(HaveOccurred())
	srv, err := nodeapi.NewServer(nodeapi.Config{
		NodeName:           o.Node,
		Sandboxes:          o.Reader,
		APIReader:          o.APIReader,
		Runtime:            o.Runtime,
		History:            o.History,
		Authenticator:      auth.Authenticator,
		Authorizer:         auth.Authorizer,
		FileTransferLimit:  o.FileTransferLimit,
		MaxExecsPerSandbox: o.MaxExecsPerSandbox,
		DockerCheckTimeout: o.DockerCheckTimeout,
	})
	Expect(err).NotTo(HaveOccurred())
	return &NodeAPI{
		Endpoint: "https://" + l.Addr().String(),
		Cert:     cert,
		Server:   srv,
		Runnable: nodeapi.NewRunnable(l, srv, cert, auth.RequestsClientCerts()),
		Auth:     auth,
	}
}

// Start runs the server (and its client-CA reloader) outside a manager
// until the current spec or container ends.
func (a *NodeAPI) Start() *NodeAPI {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for _, r := range []interface{ Start(context.Context) error }{a.Runnable, a.Auth} {
		go func() {
			defer GinkgoRecover()
			defer func() { done <- struct{}{} }()
			Expect(r.Start(ctx)).To(Succeed())
		}()
	}
	DeferCleanup(func() {
		cancel()
		for range 2 {
			Eventually(done, 10*time.Second).Should(Receive())
		}
	})
	return a
}

// NodeOptions configure Start.
type NodeOptions struct {
	Name string
	// ClientCAFile, FileTransferLimit: as in NodeAPIOptions.
	ClientCAFile      string
	FileTransferLimit int64
	// History defaults to a store in a temporary directory.
	History *history.Store
}

// Node is a manager for one node running in this process: the Sandbox
// reconciler and the node API it advertises in Sandbox status.
type Node struct {
	Name    string
	API     *NodeAPI
	Docker  *dockerruntime.Client
	History *history.Store
	Manager ctrl.Manager

	stop context.CancelFunc
	done chan struct{}
}

// Start starts a manager for opts.Name and waits for its cache. Stop it
// in AfterSuite (it is usually suite-wide).
func Start(cp *testenv.ControlPlane, opts NodeOptions) *Node {
	GinkgoHelper()
	n := &Node{Name: opts.Name, History: opts.History, done: make(chan struct{})}
	var err error
	if n.History == nil {
		n.History, err = history.New(GinkgoT().TempDir(), 0)
		Expect(err).NotTo(HaveOccurred())
	}
	n.Docker, err = dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	n.Manager, err = ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	n.API = NewNodeAPI(cp, NodeAPIOptions{
		Node: opts.Name, Runtime: n.Docker, Reader: n.Manager.GetClient(), APIReader: n.Manager.GetAPIReader(),
		History: n.History, ClientCAFile: opts.ClientCAFile, FileTransferLimit: opts.FileTransferLimit,
	})
	r, err := controllers.NewSandboxReconciler(n.Manager.GetClient(), n.Manager.GetAPIReader(), n.Docker,
		n.Manager.GetEventRecorder("sandbox-manager-"+opts.Name), clock.RealClock{}, controllers.Options{
			NodeName:           opts.Name,
			StopGracePeriod:    time.Second,
			RetryBackoffBase:   200 * time.Millisecond,
			RetryBackoffMax:    2 * time.Second,
			SkipNameValidation: true,
			AgentEndpoint:      n.API.Endpoint,
			AgentCertSHA256:    n.API.Cert.SHA256,
			History:            n.History,
		})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(n.Manager, time.Hour)).To(Succeed())
	Expect(n.Manager.Add(n.API.Runnable)).To(Succeed())
	Expect(n.Manager.Add(n.API.Auth)).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	go func() {
		defer GinkgoRecover()
		defer close(n.done)
		defer n.Docker.Close()
		Expect(n.Manager.Start(ctx)).To(Succeed())
	}()
	syncCtx, syncCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer syncCancel()
	Expect(n.Manager.GetCache().WaitForCacheSync(syncCtx)).To(BeTrue())
	return n
}

// Stop stops the manager and waits for it; safe on a nil Node.
func (n *Node) Stop() {
	GinkgoHelper()
	if n == nil || n.stop == nil {
		return
	}
	n.stop()
	Eventually(n.done, 30*time.Second).Should(BeClosed())
}
