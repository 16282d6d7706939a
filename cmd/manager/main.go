/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command manager runs the operator. In its default role, node, it runs the
// Sandbox controller for one node: run one per node (a DaemonSet in a
// cluster), each with its own --node-name and access to that node's Docker
// Engine. In the control-plane role (a Deployment, no Docker) it serves the
// SandboxQuota admission webhook and the aggregated API, keeps the operator
// CA, signs the node managers' certificates and runs the quota and warm pool
// controllers instead. --role webhook is that role's deprecated former name.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	sandboxcontroller "github.com/code-sandbox/code-sandbox-operator/controllers/sandbox"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodelease"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(sandboxv1alpha1.AddToScheme(scheme))
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		nodeName         string
		dockerHost       string
		maxSandboxes     int
		stopGrace        time.Duration
		dockerTimeout    time.Duration
		pullTimeout      time.Duration
		orphanGCInterval time.Duration
		concurrency      int
		metricsAddr      string
		probeAddr        string
		showVersion      bool
		stateDir         string
		nodeAPI          nodeAPIFlags
		role             string
		controlPlane     controlPlaneFlags
		egressOpts       egressFlags
		egressProxyOpts  egressProxyFlags
	)
	flag.StringVar(&role, "role", roleNode, "What this process does: node (the Sandbox controller and node API for --node-name) or control-plane (the SandboxQuota admission webhook, the aggregated API, the operator CA and node certificate signer, and the quota and warm pool controllers). webhook is a deprecated alias of control-plane.")
	flag.StringVar(&nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the node this manager runs on (default $NODE_NAME). Required.")
	flag.StringVar(&dockerHost, "docker-host", os.Getenv("DOCKER_HOST"), "Docker Engine endpoint (default $DOCKER_HOST, else unix:///var/run/docker.sock).")
	flag.IntVar(&maxSandboxes, "max-sandboxes", 50, "Most Sandboxes this node runs at once; unbound Sandboxes beyond it are left to other nodes.")
	flag.DurationVar(&stopGrace, "stop-grace-period", sandboxv1alpha1.DefaultStopGracePeriod, "Time between SIGTERM and SIGKILL when a sandbox is deleted.")
	flag.DurationVar(&dockerTimeout, "docker-timeout", 30*time.Second, "Timeout for each Docker API call (image pulls use --pull-timeout).")
	flag.DurationVar(&pullTimeout, "pull-timeout", 5*time.Minute, "Timeout for one image pull.")
	flag.DurationVar(&orphanGCInterval, "orphan-gc-interval", time.Minute, "How often to remove containers whose Sandbox no longer exists (also done at start-up).")
	flag.IntVar(&concurrency, "max-concurrent-reconciles", 4, "Sandboxes reconciled in parallel.")
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 disables it.")
	flag.BoolVar(&metricsSecure, "metrics-secure", true, "Serve the metrics over HTTPS to callers the API server authenticates and authorizes for GET /metrics (the metrics-reader ClusterRole); false serves plain HTTP to anyone.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&showVersion, "version", false, "Print the version and exit.")
	flag.StringVar(&stateDir, "state-dir", "/var/lib/code-sandbox-operator", "Directory for the manager's state on the node (exec history under history/, SandboxSnapshots' files under snapshots/).")
	snapshotRegistry := flag.String("snapshot-registry", "", "Keep SandboxSnapshots' files in this OCI registry repository (HOST[:PORT]/PATH; plain HTTP only on loopback, verified TLS everywhere else; credentials from the Docker keychain of the manager's user) instead of under --state-dir, so that a Sandbox can be restored from them on any node. Give every node the same value. The registry must allow deletes (storage.delete.enabled).")
	snapshotRegistryCA := flag.String("snapshot-registry-ca", "", "PEM file of the CA(s) that alone are trusted for --snapshot-registry's TLS certificate, instead of the system's (a registry with a CA of its own, e.g. the kind cluster's in-cluster registry). Read at start.")
	allowedRegistries := flag.String("allowed-registries", "", "Comma-separated image registries sandboxes may use besides public ones: host (any port), host:port or CIDR, for example 127.0.0.1:5000,registry.corp,10.0.0.0/8. Without them loopback, private, link-local and single-label registry hosts and localhost are refused (see docs/security.md).")
	allowPublicRegistries := flag.Bool("allow-public-registries", true, "Allow any public registry host (and images without one, which are Docker Hub's). false makes --allowed-registries a strict allow-list (list docker.io to keep Docker Hub).")
	nodeAPI.bind(flag.CommandLine)
	controlPlane.bind(flag.CommandLine)
	egressOpts.bind(flag.CommandLine)
	egressProxyOpts.bind(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()

	if showVersion {
		fmt.Println(version.Version)
		return nil
	}
	role, deprecation, err := parseRole(role)
	if err != nil {
		return err
	}
	if role == roleControlPlane {
		ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
		if deprecation != "" {
			ctrl.Log.WithName("setup").Info("Deprecated: " + deprecation)
		}
		controlPlane.caBundle = nodeAPI.bundleConfigMap
		return runControlPlane(controlPlane, metricsAddr, probeAddr)
	}
	if egressOpts.detect {
		return runEgressDetect(egressOpts)
	}
	if egressOpts.cleanup {
		return runEgressCleanup(egressOpts, dockerHost)
	}
	if nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	if maxSandboxes < 1 {
		return fmt.Errorf("--max-sandboxes must be at least 1, got %d", maxSandboxes)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	imagePolicy, err := imagepolicy.New(strings.Split(*allowedRegistries, ","), *allowPublicRegistries)
	if err != nil {
		return fmt.Errorf("--allowed-registries: %w", err)
	}
	log.Info("image registry policy", "allowed", imagePolicy.String())
	// Egress sandboxes are created only while the egress firewall is in
	// place (internal/egress).
	var egressFW *egress.Firewall
	var egressReady func(context.Context) error
	if egressOpts.firewall {
		if egressFW, err = egressOpts.newFirewall(); err != nil {
			return err
		}
		egressReady = egressFW.Healthy
	}
	docker, err := dockerruntime.New(dockerruntime.Options{Host: dockerHost, CallTimeout: dockerTimeout, PullTimeout: pullTimeout, ImagePolicy: imagePolicy, EgressReady: egressReady})
	if err != nil {
		return err
	}
	defer docker.Close()
	egressCtx, egressCancel := context.WithTimeout(context.Background(), time.Minute)
	startEgress(egressCtx, ctrl.Log.WithName("egress"), egressFW, docker)
	// The node's egress proxy (internal/egressproxy). egressNode is what
	// the sandbox controller sets each policy sandbox's policy on.
	var egressNode *egressproxy.Node
	var runEgressProxy func(context.Context) error
	var egressAudit atomic.Pointer[func(egressproxy.Event)]
	if egressProxyOpts.enabled && egressFW != nil {
		var perr error
		egressNode, runEgressProxy, perr = startEgressProxy(egressCtx, ctrl.Log.WithName("egress-proxy"), egressProxyOpts, egressFW, docker, stateDir, &egressAudit)
		if perr != nil {
			// Sandboxes with an egress policy are refused (no Node);
			// every other sandbox works as before.
			log.Error(perr, "the egress proxy is not available; sandboxes with an egress policy are not created")
			egressNode, runEgressProxy = nil, nil
		}
	}
	egressCancel()

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	// SandboxSnapshots' files: tenant data, 0700/0600, in the node's
	// directory, or in the registry when one is given (then the directory
	// still serves the snapshots stored there before).
	snapshotDir, err := snapshotstore.NewDir(filepath.Join(stateDir, "snapshots"), 0)
	if err != nil {
		return fmt.Errorf("--state-dir %s: %w", stateDir, err)
	}
	snapshots := &snapshotstore.Node{Dir: snapshotDir}
	// Registry pushes and restores spool here: the root file system is
	// read-only in the manager's pod.
	snapshotSpool := filepath.Join(stateDir, "snapshot-spool")
	if err := os.MkdirAll(snapshotSpool, 0o700); err != nil {
		return fmt.Errorf("--state-dir %s: %w", stateDir, err)
	}
	if *snapshotRegistryCA != "" && *snapshotRegistry == "" {
		return errors.New("--snapshot-registry-ca is set without --snapshot-registry")
	}
	if *snapshotRegistry != "" {
		spool := snapshotSpool
		opts := snapshotstore.RegistryOptions{SpoolDir: spool}
		if *snapshotRegistryCA != "" {
			pem, err := os.ReadFile(*snapshotRegistryCA)
			if err != nil {
				return fmt.Errorf("--snapshot-registry-ca: %w", err)
			}
			opts.RootCAs = x509.NewCertPool()
			if !opts.RootCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("--snapshot-registry-ca %s: no PEM certificate in the file", *snapshotRegistryCA)
			}
		}
		reg, err := snapshotstore.NewRegistry(*snapshotRegistry, opts)
		if err != nil {
			return fmt.Errorf("--snapshot-registry: %w", err)
		}
		snapshots.Registry = reg
	}
	hist, err := history.New(filepath.Join(stateDir, "history"), 0)
	if err != nil {
		return fmt.Errorf("--state-dir %s: %w", stateDir, err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsOptions(metricsAddr),
		HealthProbeBindAddress: probeAddr,
		// Each node's manager owns only its node's Sandboxes, so every
		// replica is active; there is nothing to elect.
		LeaderElection: false,
		// Full objects only for this node's Sandboxes.
		Cache: sandboxcontroller.CacheOptions(nodeName),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}

	// What the node API serves is the activity the idle policy of
	// spec.lifecycle counts (controllers/sandbox/idle.go).
	activity := sandboxcontroller.NewActivity(clock.RealClock{})

	// The node API listens before the controller starts, so that the
	// endpoint every Running Sandbox advertises carries the real port.
	api, err := nodeAPI.listen(nodeName)
	if err != nil {
		return err
	}
	if api.listener != nil {
		if err := nodeAPI.serve(mgr, cfg, api.listener, nodeName, docker, hist, activity, egressNode); err != nil {
			return err
		}
		log.Info("node API", "endpoint", api.endpoint, "listen", api.listener.Addr().String())
	}

	// Warm pool members spread over the nodes whose manager keeps a Lease
	// in the operator namespace (internal/nodelease).
	var liveNodes func(context.Context) ([]string, error)
	if nodeAPI.namespace != "" {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("creating the Kubernetes client: %w", err)
		}
		heartbeat, err := nodelease.Heartbeat(cs, nodeName, nodeAPI.namespace)
		if err != nil {
			return err
		}
		if err := mgr.Add(manager.RunnableFunc(heartbeat)); err != nil {
			return err
		}
		leases := &nodelease.Cached{Reader: mgr.GetAPIReader(), Namespace: nodeAPI.namespace, Clock: clock.RealClock{}, TTL: 2 * time.Second}
		liveNodes = leases.Nodes
	} else {
		log.Info("no --operator-namespace: no node Lease, so warm pool members are not spread over nodes")
	}

	reconciler, err := sandboxcontroller.NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), docker,
		mgr.GetEventRecorder("sandbox-manager-"+nodeName), clock.RealClock{}, sandboxcontroller.Options{
			NodeName:                nodeName,
			MaxSandboxes:            maxSandboxes,
			StopGracePeriod:         stopGrace,
			MaxConcurrentReconciles: concurrency,
			NodeAPIEndpoint:         api.endpoint,
			History:                 hist,
			Snapshots:               snapshots,
			SnapshotSpoolDir:        snapshotSpool,
			LiveNodes:               liveNodes,
			Activity:                activity,
			EgressProxy:             egressPolicies(egressNode),
		})
	if err != nil {
		return err
	}
	if err := reconciler.SetupWithManager(mgr, orphanGCInterval); err != nil {
		return fmt.Errorf("setting up controller: %w", err)
	}
	// Refusals become Events on the Sandbox (rate-limited twice: by the
	// proxy's sink and per sandbox, host and reason).
	audit := reconciler.EgressAudit
	egressAudit.Store(&audit)
	if egressFW != nil {
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			return keepEgressFirewall(ctx, ctrl.Log.WithName("egress"), egressFW, egressOpts.interval)
		})); err != nil {
			return err
		}
	}
	if runEgressProxy != nil {
		if err := mgr.Add(manager.RunnableFunc(runEgressProxy)); err != nil {
			return err
		}
	}
	if err := mgr.Add(&sandboxcontroller.UsageCollector{Docker: docker, Node: nodeName}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	// Not ready while Docker does not answer: the node cannot provision.
	if err := mgr.AddReadyzCheck("docker", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		return docker.Ping(ctx)
	}); err != nil {
		return err
	}

	log.Info("starting manager", "version", version.Version, "node", nodeName, "docker", docker.Host(), "maxSandboxes", maxSandboxes)
	return mgr.Start(ctrl.SetupSignalHandler())
}

// nodeAPIFlags configure the node API.
type nodeAPIFlags struct {
	bindAddress        string
	advertiseAddress   string
	namespace          string
	bundleConfigMap    string
	allowedClients     string
	execOutputLimit    resource.Quantity
	fileTransferLimit  resource.Quantity
	maxExecsPerSandbox int
	maxExecs           int
	execBodyBudget     resource.Quantity
	maxFollowersPer    int
	maxFollowers       int
}

func (f *nodeAPIFlags) bind(fs *flag.FlagSet) {
	advertise := os.Getenv("POD_IP")
	f.execOutputLimit = *resource.NewQuantity(execio.DefaultOutputLimit, resource.BinarySI)
	f.fileTransferLimit = *resource.NewQuantity(execio.DefaultUploadLimit, resource.BinarySI)
	f.execBodyBudget = *resource.NewQuantity(nodeapi.DefaultExecBodyBudget, resource.BinarySI)
	fs.StringVar(&f.bindAddress, "node-api-bind-address", ":9443", "Address of the node API (HTTPS with mutual TLS: exec, files, logs for the operator's aggregated API server); 0 disables it.")
	fs.StringVar(&f.advertiseAddress, "node-api-advertise-address", advertise, "Host or IP the aggregated API server uses to reach the node API, published in status.nodeAPIEndpoint (default $POD_IP, else the node name).")
	fs.StringVar(&f.namespace, "operator-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the operator CA bundle ConfigMap and of the node managers' Leases (default $POD_NAMESPACE).")
	fs.StringVar(&f.bundleConfigMap, "ca-bundle-configmap", operatorca.DefaultBundleConfigMap, "ConfigMap with the operator CA bundle: the control-plane role publishes it in --webhook-namespace, node managers read it from --operator-namespace to check node API clients.")
	fs.StringVar(&f.allowedClients, "node-api-allowed-clients", operatorca.AggregatorCommonName, "Comma-separated client certificate names (issued by the operator CA) the node API serves.")
	fs.Var(&quantityFlag{&f.execOutputLimit}, "exec-output-limit", "Largest output of one exec, per stream (stdout and stderr each); a request may ask for less.")
	fs.Var(&quantityFlag{&f.fileTransferLimit}, "file-transfer-limit", "Largest file content of one upload or download.")
	fs.IntVar(&f.maxExecsPerSandbox, "max-execs-per-sandbox", nodeapi.DefaultMaxExecsPerSandbox, "Concurrent execs and file transfers per Sandbox; more are refused with 429.")
	fs.IntVar(&f.maxExecs, "max-execs", nodeapi.DefaultMaxExecs, "Concurrent execs and file transfers on this node, taken before a request body is decoded; more are refused with 429. 0 means no node-wide limit (the manager's memory then grows with concurrent requests).")
	fs.Var(&quantityFlag{&f.execBodyBudget}, "exec-body-budget", "Bytes of exec request bodies (mostly stdin) held at once on this node, reserved before a body is read; a request that does not fit is refused with 429. 0 means no budget.")
	fs.IntVar(&f.maxFollowersPer, "max-followers-per-sandbox", nodeapi.DefaultMaxFollowersPerSandbox, "Concurrent followed log and history streams (follow=true) per Sandbox; more are refused with 429.")
	fs.IntVar(&f.maxFollowers, "max-followers", nodeapi.DefaultMaxFollowers, "Concurrent followed log and history streams on this node; more are refused with 429. 0 means no node-wide limit.")
}

// nodeAPIListener is the bound node API: its listener (nil when disabled)
// and the endpoint Sandboxes advertise.
type nodeAPIListener struct {
	listener net.Listener
	endpoint string
}

func (f *nodeAPIFlags) listen(nodeName string) (nodeAPIListener, error) {
	if f.bindAddress == "0" || f.bindAddress == "" {
		return nodeAPIListener{}, nil
	}
	if f.execOutputLimit.Value() < 1 || f.execOutputLimit.Value() > execio.MaxOutputLimit {
		return nodeAPIListener{}, fmt.Errorf("--exec-output-limit must be between 1 and %d bytes, got %s", execio.MaxOutputLimit, f.execOutputLimit.String())
	}
	if f.fileTransferLimit.Value() < 1 {
		return nodeAPIListener{}, fmt.Errorf("--file-transfer-limit must be positive, got %s", f.fileTransferLimit.String())
	}
	if f.maxExecsPerSandbox < 1 {
		return nodeAPIListener{}, fmt.Errorf("--max-execs-per-sandbox must be at least 1, got %d", f.maxExecsPerSandbox)
	}
	if f.maxFollowersPer < 1 {
		return nodeAPIListener{}, fmt.Errorf("--max-followers-per-sandbox must be at least 1, got %d", f.maxFollowersPer)
	}
	if f.maxExecs < 0 || f.maxFollowers < 0 || f.execBodyBudget.Value() < 0 {
		return nodeAPIListener{}, errors.New("--max-execs, --max-followers and --exec-body-budget must not be negative")
	}
	if f.namespace == "" {
		return nodeAPIListener{}, errors.New("--operator-namespace (or POD_NAMESPACE) is required for the node API's certificate; --node-api-bind-address=0 turns the node API off")
	}
	advertise := f.advertiseAddress
	if advertise == "" {
		advertise = nodeName
	}
	l, err := net.Listen("tcp", f.bindAddress)
	if err != nil {
		return nodeAPIListener{}, fmt.Errorf("--node-api-bind-address %s: %w", f.bindAddress, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return nodeAPIListener{listener: l, endpoint: "https://" + net.JoinHostPort(advertise, strconv.Itoa(port))}, nil
}

// serve adds the node API and its certificate to mgr: the serving
// certificate comes from the operator CA through a CSR made with the
// manager's own (node-bound) credentials, and only the operator's
// aggregated API server may connect.
func (f *nodeAPIFlags) serve(mgr ctrl.Manager, cfg *rest.Config, l net.Listener, nodeName string, docker *dockerruntime.Client, hist *history.Store, activity *sandboxcontroller.Activity, egressNode *egressproxy.Node) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating clientset for the node API: %w", err)
	}
	certs, err := operatorca.NewNodeCertificate(cs, operatorca.NodeCertificateOptions{
		NodeName: nodeName, Namespace: f.namespace, BundleConfigMap: f.bundleConfigMap,
	})
	if err != nil {
		return err
	}
	var allowed []string
	for _, n := range strings.Split(f.allowedClients, ",") {
		if n = strings.TrimSpace(n); n != "" {
			allowed = append(allowed, n)
		}
	}
	authn, err := nodeapi.NewFrontProxyAuthenticator(certs.Pool, allowed)
	if err != nil {
		return err
	}
	server, err := nodeapi.NewServer(nodeapi.Config{
		NodeName:           nodeName,
		Sandboxes:          mgr.GetClient(),
		APIReader:          mgr.GetAPIReader(),
		Runtime:            docker,
		History:            hist,
		Activity:           activity,
		EgressEvents:       egressEvents(egressNode),
		Authenticator:      authn,
		ExecOutputLimit:    f.execOutputLimit.Value(),
		FileTransferLimit:  f.fileTransferLimit.Value(),
		MaxExecsPerSandbox: f.maxExecsPerSandbox,
		MaxExecs:           f.maxExecs,
		ExecBodyBudget:     f.execBodyBudget.Value(),

		MaxFollowersPerSandbox: f.maxFollowersPer,
		MaxFollowers:           f.maxFollowers,
	})
	if err != nil {
		return err
	}
	tlsConfig, err := nodeapi.ServerTLSConfig(nodeapi.TLSOptions{GetCertificate: certs.GetCertificate, ClientCAs: certs.Pool})
	if err != nil {
		return err
	}
	if err := mgr.Add(certs); err != nil {
		return err
	}
	// Not ready until the operator CA has signed this node's certificate
	// and its bundle is loaded: the node API cannot serve before that.
	if err := mgr.AddReadyzCheck("node-api-certificate", func(*http.Request) error {
		if _, err := certs.GetCertificate(nil); err != nil {
			return err
		}
		if certs.Pool() == nil {
			return errors.New("the operator CA bundle is not loaded yet")
		}
		return nil
	}); err != nil {
		return err
	}
	return mgr.Add(nodeapi.NewRunnable("nodeapi", l, server, tlsConfig))
}

// quantityFlag reads sizes such as 1Mi or 100Mi.
type quantityFlag struct{ q *resource.Quantity }

func (f *quantityFlag) String() string {
	if f.q == nil {
		return ""
	}
	return f.q.String()
}

func (f *quantityFlag) Set(v string) error {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return err
	}
	*f.q = q
	return nil
}

// The manager's roles: which process this is.
const (
	// roleNode runs one node's Sandboxes: the Sandbox controller and the
	// node API (a DaemonSet).
	roleNode = "node"
	// roleControlPlane runs the cluster-wide parts: the SandboxQuota
	// webhook, the aggregated API, the operator CA and the node certificate
	// signer, and the quota and warm pool controllers (a Deployment).
	roleControlPlane = "control-plane"
	// roleWebhookDeprecated is roleControlPlane's former name, accepted so
	// that existing Deployments keep working; it ran far more than the
	// webhook, which the name hid.
	roleWebhookDeprecated = "webhook"
)

// parseRole returns the role that the --role value names, and for a
// deprecated name the warning to log.
func parseRole(value string) (role, deprecation string, err error) {
	switch value {
	case roleNode, roleControlPlane:
		return value, "", nil
	case roleWebhookDeprecated:
		return roleControlPlane, "--role webhook is deprecated and will be removed; use --role control-plane (the same role)", nil
	default:
		return "", "", fmt.Errorf("--role must be %s or %s, got %q", roleNode, roleControlPlane, value)
	}
}

// egressPolicies is the sandbox controller's egress proxy: nil (never a
// typed nil) without one, so that Sandboxes with a policy are refused.
func egressPolicies(n *egressproxy.Node) sandboxcontroller.EgressProxy {
	if n == nil {
		return nil
	}
	return n
}

// egressEvents serves log?egress from the node's egress proxy, or nothing
// without one.
func egressEvents(n *egressproxy.Node) func(string) []subresource.EgressEvent {
	if n == nil {
		return nil
	}
	return nodeapi.EgressEventsOf(n)
}
