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
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxcontroller "github.com/code-sandbox/code-sandbox-operator/controllers/sandbox"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// NodeAPIOptions configure one node API server on loopback.
type NodeAPIOptions struct {
	Node              string
	Runtime           nodeapi.Runtime
	Reader, APIReader client.Reader
	History           nodeapi.HistoryStore
	// EgressEvents is nodeapi.Config.EgressEvents.
	EgressEvents       func(sandbox string) []subresource.EgressEvent
	FileTransferLimit  int64
	MaxExecsPerSandbox int
	// ExecBodyBudget, MaxFollowersPerSandbox and MaxFollowers: as in
	// nodeapi.Config.
	ExecBodyBudget         int64
	MaxFollowersPerSandbox int
	MaxFollowers           int
	// DockerCheckTimeout defaults to 5 s.
	DockerCheckTimeout time.Duration
	// Activity: as in nodeapi.Config.
	Activity nodeapi.Activity
	// Middleware, when set, wraps the server's handler, so that a test can
	// see which requests reach HTTP and what the server left of them.
	Middleware func(http.Handler) http.Handler
}

// NodeAPI is a node API server listening on 127.0.0.1 with a serving
// certificate for its node from the operator CA; run Runnable (in a
// manager, or with Start).
type NodeAPI struct {
	Endpoint string
	Server   *nodeapi.Server
	Runnable *nodeapi.Runnable
}

// NewNodeAPI builds a node API server as the manager builds it: mutual TLS
// with the operator CA, serving only the aggregated API server's client
// certificate. Its certificate is issued directly by ca; the CSR path that
// a real manager takes is tested in internal/operatorca and e2e.
func NewNodeAPI(ca *operatorca.CA, o NodeAPIOptions) *NodeAPI {
	GinkgoHelper()
	if o.DockerCheckTimeout == 0 {
		o.DockerCheckTimeout = 5 * time.Second
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	cert, err := ca.IssueNode(o.Node, time.Hour)
	Expect(err).NotTo(HaveOccurred())
	authn, err := nodeapi.NewFrontProxyAuthenticator(ca.Pool, []string{operatorca.AggregatorCommonName})
	Expect(err).NotTo(HaveOccurred())
	srv, err := nodeapi.NewServer(nodeapi.Config{
		NodeName:           o.Node,
		Sandboxes:          o.Reader,
		APIReader:          o.APIReader,
		Runtime:            o.Runtime,
		History:            o.History,
		EgressEvents:       o.EgressEvents,
		Authenticator:      authn,
		FileTransferLimit:  o.FileTransferLimit,
		MaxExecsPerSandbox: o.MaxExecsPerSandbox,
		DockerCheckTimeout: o.DockerCheckTimeout,

		ExecBodyBudget:         o.ExecBodyBudget,
		MaxFollowersPerSandbox: o.MaxFollowersPerSandbox,
		MaxFollowers:           o.MaxFollowers,
		Activity:               o.Activity,
	})
	Expect(err).NotTo(HaveOccurred())
	tlsConfig, err := nodeapi.ServerTLSConfig(nodeapi.TLSOptions{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil },
		ClientCAs:      ca.Pool,
	})
	Expect(err).NotTo(HaveOccurred())
	var handler http.Handler = srv
	if o.Middleware != nil {
		handler = o.Middleware(srv)
	}
	return &NodeAPI{
		Endpoint: "https://" + l.Addr().String(),
		Server:   srv,
		Runnable: nodeapi.NewRunnable("nodeapi", l, handler, tlsConfig),
	}
}

// Start runs the server outside a manager until the current spec or
// container ends.
func (a *NodeAPI) Start() *NodeAPI {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(a.Runnable.Start(ctx)).To(Succeed())
	}()
	DeferCleanup(func() {
		cancel()
		Eventually(done, 10*time.Second).Should(BeClosed())
	})
	return a
}

// NodeOptions configure Start.
type NodeOptions struct {
	Name string
	// FileTransferLimit: as in NodeAPIOptions.
	FileTransferLimit int64
	// History defaults to a store in a temporary directory.
	History *history.Store
	// Snapshots, when set, is the node's SandboxSnapshot store: the
	// manager takes and restores snapshots.
	Snapshots sandboxcontroller.SnapshotStore
	// Endpoint is the node API address advertised in Sandbox status when
	// op is nil (nothing serves it): for specs that only need Ready
	// Sandboxes and run their commands through Docker.
	Endpoint string
	// Config, when set, is the manager's client config instead of the
	// control plane's admin: e.g. a token bound to a Pod on the node
	// (ControlPlane.NodeBoundToken), as a deployed manager has, for specs
	// of what only a node's own manager may do.
	Config *rest.Config
}

// Node is a manager for one node running in this process: the Sandbox
// reconciler and the node API it advertises in Sandbox status.
type Node struct {
	Name    string
	API     *NodeAPI
	Docker  *dockerruntime.Client
	History *history.Store
	Manager ctrl.Manager
	// Activity is what the node API records and the reconciler's idle
	// policy reads.
	Activity *sandboxcontroller.Activity

	stop context.CancelFunc
	done chan struct{}
}

// Start starts a manager for opts.Name, with its node API reachable
// through op's aggregated API (no node API when op is nil), and waits for
// its cache. Stop it in AfterSuite (it is usually suite-wide).
func Start(cp *testenv.ControlPlane, op *Operator, opts NodeOptions) *Node {
	GinkgoHelper()
	n := &Node{Name: opts.Name, History: opts.History, done: make(chan struct{})}
	var err error
	if n.History == nil {
		n.History, err = history.New(GinkgoT().TempDir(), 0)
		Expect(err).NotTo(HaveOccurred())
	}
	n.Docker, err = dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	config := cp.Config
	if opts.Config != nil {
		config = opts.Config
	}
	n.Manager, err = ctrl.NewManager(config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  sandboxcontroller.CacheOptions(opts.Name),
	})
	Expect(err).NotTo(HaveOccurred())
	endpoint := opts.Endpoint
	n.Activity = sandboxcontroller.NewActivity(clock.RealClock{})
	if op != nil {
		// The aggregated API server dials only the Node's own addresses.
		cp.EnsureNode(opts.Name, testenv.LoopbackAddress)
		n.API = NewNodeAPI(op.Authority.Current(), NodeAPIOptions{
			Node: opts.Name, Runtime: n.Docker, Reader: n.Manager.GetClient(), APIReader: n.Manager.GetAPIReader(),
			History: n.History, FileTransferLimit: opts.FileTransferLimit, Activity: n.Activity,
		})
		endpoint = n.API.Endpoint
		Expect(n.Manager.Add(n.API.Runnable)).To(Succeed())
	}
	r, err := sandboxcontroller.NewSandboxReconciler(n.Manager.GetClient(), n.Manager.GetAPIReader(), n.Docker,
		n.Manager.GetEventRecorder("sandbox-manager-"+opts.Name), clock.RealClock{}, sandboxcontroller.Options{
			NodeName:           opts.Name,
			StopGracePeriod:    time.Second,
			RetryBackoffBase:   200 * time.Millisecond,
			RetryBackoffMax:    2 * time.Second,
			SkipNameValidation: true,
			NodeAPIEndpoint:    endpoint,
			History:            n.History,
			Activity:           n.Activity,
			Snapshots:          opts.Snapshots,
		})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(n.Manager, time.Hour)).To(Succeed())

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
