/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	sandboxcontroller "github.com/code-sandbox/code-sandbox-operator/controllers/sandbox"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxnode"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxquota"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxwarmpool"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/aggregatedapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookcert"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

// controlPlaneFlags configure the control-plane role.
type controlPlaneFlags struct {
	bindAddress      string
	apiserverAddress string
	apiserverService string
	apiService       string
	caSecret         string
	// caBundle is --ca-bundle-configmap, which both roles read (see
	// nodeAPIFlags).
	caBundle           string
	managerUsername    string
	certDir            string
	namespace          string
	certSecret         string
	configuration      string
	service            string
	certHosts          string
	leaderElect        bool
	reservationTimeout time.Duration
	// clientCA is --webhook-client-ca: the CA (PEM file) that signs
	// kube-apiserver's webhook client certificate (package webhookclient).
	clientCA string
}

func (f *controlPlaneFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.bindAddress, "webhook-bind-address", ":9443", "control-plane role: address of the HTTPS admission webhook.")
	fs.StringVar(&f.certDir, "webhook-cert-dir", "", "control-plane role: directory with tls.crt and tls.key issued by you or cert-manager. Empty: the webhook keeps its own CA and certificate in --webhook-cert-secret and injects the CA into --webhook-configuration.")
	fs.StringVar(&f.namespace, "webhook-namespace", os.Getenv("POD_NAMESPACE"), "control-plane role: namespace of the certificate Secret, the leader-election Lease and the node managers' Leases, by which lost nodes are told (default $POD_NAMESPACE).")
	fs.StringVar(&f.certSecret, "webhook-cert-secret", "code-sandbox-webhook-server-cert", "control-plane role: Secret holding the self-managed CA and certificate.")
	fs.StringVar(&f.configuration, "webhook-configuration", "code-sandbox-validating-webhook-configuration", "control-plane role: ValidatingWebhookConfiguration that receives the self-managed CA; empty leaves it alone.")
	fs.StringVar(&f.service, "webhook-service", "code-sandbox-webhook-service", "control-plane role: Service in front of the webhook; its cluster DNS names go into the certificate.")
	fs.StringVar(&f.clientCA, "webhook-client-ca", "", "control-plane role: PEM file with the CA that signs the client certificate kube-apiserver presents to admission webhooks (its AdmissionConfiguration; see docs/deploy.md); the webhook then refuses every caller without one. Empty: any peer that reaches the port can send AdmissionReviews (a warning is logged; only the NetworkPolicy limits who).")
	fs.StringVar(&f.certHosts, "webhook-cert-hosts", "", "control-plane role: more comma-separated DNS names or IPs for the certificate (127.0.0.1 for a local run).")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "control-plane role: elect one replica to run the quota and warm pool controllers (every replica serves the webhook).")
	fs.StringVar(&f.apiserverAddress, "apiserver-bind-address", ":8443", "control-plane role: address of the aggregated API server (sandboxes/exec, files, log, history through kube-apiserver); 0 disables it.")
	fs.StringVar(&f.apiserverService, "apiserver-service", "code-sandbox-apiserver", "control-plane role: Service in front of the aggregated API server; its cluster DNS names go into the serving certificate.")
	fs.StringVar(&f.apiService, "apiservice", "v1alpha1."+subresource.AggregatedGroup, "control-plane role: APIService that receives the operator CA as its caBundle; empty leaves it alone.")
	fs.StringVar(&f.caSecret, "ca-secret", operatorca.DefaultCASecret, "control-plane role: Secret (in --webhook-namespace) holding the operator CA; readable only by this component.")
	fs.StringVar(&f.managerUsername, "node-manager-username", "", "control-plane role: the node managers' ServiceAccount user (system:serviceaccount:NS:NAME), the only identity whose node-bound CSRs are signed. Default: system:serviceaccount:<--webhook-namespace>:code-sandbox-controller-manager.")
	fs.DurationVar(&f.reservationTimeout, "quota-reservation-timeout", sandboxquota.DefaultReservationTimeout, "control-plane role: how long quota charged at admission waits for its Sandbox to appear before the API server is asked whether the create failed.")
}

func (f *controlPlaneFlags) hosts() []string {
	var hosts []string
	for _, service := range []string{f.service, f.apiserverService} {
		if service != "" && f.namespace != "" {
			svc := service + "." + f.namespace
			hosts = append(hosts, svc+".svc", service, svc, svc+".svc.cluster.local")
		}
	}
	for _, h := range strings.Split(f.certHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// runControlPlane serves the SandboxQuota admission webhook and the aggregated
// API, keeps the operator CA, signs the node managers' certificates and
// runs the quota and warm pool controllers.
func runControlPlane(f controlPlaneFlags, metricsAddr, probeAddr string) error {
	log := ctrl.Log.WithName("setup")
	host, portStr, err := net.SplitHostPort(f.bindAddress)
	if err != nil {
		return fmt.Errorf("--webhook-bind-address %q: %w", f.bindAddress, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("--webhook-bind-address %q: the port must be a number from 1 to 65535", f.bindAddress)
	}
	if f.reservationTimeout < time.Second {
		return fmt.Errorf("--quota-reservation-timeout must be at least 1s, got %s", f.reservationTimeout)
	}
	if f.namespace == "" {
		return fmt.Errorf("--webhook-namespace (or POD_NAMESPACE) is required: the operator CA, the certificates and the Lease live there")
	}
	if f.managerUsername == "" {
		f.managerUsername = "system:serviceaccount:" + f.namespace + ":code-sandbox-controller-manager"
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()

	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	// The operator CA comes first: the serving certificates, the node API
	// certificates and the aggregated API's client certificate all chain
	// to it.
	authority, err := operatorca.NewAuthority(direct, operatorca.AuthorityOptions{
		Namespace: f.namespace, SecretName: f.caSecret, BundleConfigMap: f.caBundle,
	})
	if err != nil {
		return err
	}
	prepCtx, cancel := context.WithTimeout(ctx, time.Minute)
	err = authority.Ensure(prepCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("preparing the operator CA: %w", err)
	}

	certDir := f.certDir
	var certs *webhookcert.Manager
	if certDir == "" {
		if certDir, err = os.MkdirTemp("", "code-sandbox-webhook-"); err != nil {
			return fmt.Errorf("creating a directory for the webhook certificate: %w", err)
		}
		defer os.RemoveAll(certDir)
		certs, err = webhookcert.New(direct, authority, webhookcert.Options{
			Namespace:            f.namespace,
			SecretName:           f.certSecret,
			WebhookConfiguration: f.configuration,
			APIService:           f.apiService,
			Hosts:                f.hosts(),
			CertDir:              certDir,
		})
		if err != nil {
			return err
		}
		// The servers cannot start without their certificate; the CA
		// injection may wait for the configurations to be applied.
		prepCtx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = certs.Prepare(prepCtx)
		cancel()
		if err != nil {
			return err
		}
	}

	// The warm pool controller below creates members with these
	// credentials; the webhook refuses members created by anyone else.
	prepCtx, cancel = context.WithTimeout(ctx, time.Minute)
	poolController, err := admission.Self(prepCtx, direct)
	cancel()
	if err != nil {
		return err
	}

	var tlsOpts []func(*tls.Config)
	if f.clientCA != "" {
		clientAuth, err := webhookclient.TLSOption(f.clientCA)
		if err != nil {
			return err
		}
		tlsOpts = append(tlsOpts, clientAuth)
	} else {
		// Managed clusters often cannot give kube-apiserver a webhook
		// client certificate, so this stays opt-in; but say loudly what
		// it leaves open.
		log.Info("WARNING: --webhook-client-ca is not set, so the admission webhook accepts AdmissionReviews from any network peer that reaches its port, not only kube-apiserver: a forged review can charge quotas. Configure kube-apiserver's webhook client certificate (docs/deploy.md) or keep the NetworkPolicy in force")
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsOptions(metricsAddr),
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              "code-sandbox-quota-controller",
		LeaderElectionNamespace:       f.namespace,
		LeaderElectionReleaseOnCancel: true,
		// No Sandbox's command or env: the quota and pool controllers
		// and the aggregated API never read them (sandboxcontroller.CacheOptions).
		Cache: sandboxcontroller.CacheOptions(""),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    host,
			Port:    port,
			CertDir: certDir,
			TLSOpts: tlsOpts,
		}),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	mgr.GetWebhookServer().Register(admission.Path, &webhook.Admission{
		Handler: admission.NewSandboxValidator(mgr.GetAPIReader(), mgr.GetClient(), scheme, clock.RealClock{}).WithPoolController(poolController),
	})
	mgr.GetWebhookServer().Register(admission.WarmPoolPath, &webhook.Admission{
		Handler: admission.NewWarmPoolValidator(mgr.GetAPIReader(), scheme),
	})
	mgr.GetWebhookServer().Register(admission.SnapshotPath, &webhook.Admission{
		Handler: admission.NewSnapshotValidator(mgr.GetAPIReader(), mgr.GetClient(), scheme, clock.RealClock{}),
	})
	if certs != nil {
		if err := mgr.Add(certs); err != nil {
			return err
		}
	}
	if err := mgr.Add(authority); err != nil {
		return err
	}
	if err := operatorca.NewSigner(mgr.GetClient(), authority, operatorca.SignerOptions{ManagerUsername: f.managerUsername}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the node certificate signer: %w", err)
	}
	if err := f.serveAggregatedAPI(mgr, cfg, authority, certDir); err != nil {
		return err
	}
	reconciler := sandboxquota.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), clock.RealClock{},
		sandboxquota.Options{ReservationTimeout: f.reservationTimeout})
	if err := reconciler.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the quota controller: %w", err)
	}
	if err := sandboxwarmpool.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("sandboxwarmpool-controller"),
		clock.RealClock{}, sandboxwarmpool.Options{}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the warm pool controller: %w", err)
	}
	// Node loss: NodeLost for the Sandboxes of a node whose kubelet and
	// manager are both gone (docs/node-loss.md).
	nodeLoss, err := sandboxnode.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("sandboxnode-controller"),
		clock.RealClock{}, sandboxnode.Options{ManagerNamespace: f.namespace})
	if err != nil {
		return fmt.Errorf("setting up the node-loss controller (--webhook-namespace names the managers' Lease namespace): %w", err)
	}
	if err := nodeLoss.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the node-loss controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	log.Info("starting the webhook and the aggregated API", "version", version.Version, "webhook", f.bindAddress,
		"apiserver", f.apiserverAddress, "selfManagedCert", certs != nil, "leaderElect", f.leaderElect, "clientCA", f.clientCA)
	return mgr.Start(ctx)
}

// serveAggregatedAPI adds the aggregated API server to mgr. It serves with
// the certificate in certDir (the same one as the webhook: it covers both
// Services) and reaches the node APIs with the operator CA's client
// certificate.
func (f *controlPlaneFlags) serveAggregatedAPI(mgr ctrl.Manager, cfg *rest.Config, authority *operatorca.Authority, certDir string) error {
	if f.apiserverAddress == "" || f.apiserverAddress == "0" {
		return nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a clientset for the aggregated API: %w", err)
	}
	auth, err := aggregatedapi.NewDelegatingAuth(kubeconfigPath(), cs)
	if err != nil {
		return err
	}
	server, err := aggregatedapi.New(aggregatedapi.Config{
		Sandboxes:         mgr.GetClient(),
		APIReader:         mgr.GetAPIReader(),
		Nodes:             mgr.GetAPIReader(),
		Authenticator:     auth.Authenticator,
		Authorizer:        auth.Authorizer,
		ClientCertificate: authority.ClientCertificate(operatorca.AggregatorCommonName),
		NodeCAs:           authority.Pool,
	})
	if err != nil {
		return err
	}
	watcher, err := certwatcher.New(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return fmt.Errorf("loading the aggregated API certificate from %s: %w", certDir, err)
	}
	l, err := net.Listen("tcp", f.apiserverAddress)
	if err != nil {
		return fmt.Errorf("--apiserver-bind-address %s: %w", f.apiserverAddress, err)
	}
	for _, r := range []manager.Runnable{watcher, auth, nodeapi.NewRunnable("aggregatedapi", l, server, auth.TLSConfig(watcher.GetCertificate))} {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}
	return nil
}

// kubeconfigPath is the kubeconfig file controller-runtime reads (its
// --kubeconfig flag, else $KUBECONFIG); empty means in-cluster.
func kubeconfigPath() string {
	if f := flag.Lookup("kubeconfig"); f != nil && f.Value.String() != "" {
		return f.Value.String()
	}
	return os.Getenv("KUBECONFIG")
}
