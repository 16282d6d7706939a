/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxquota"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookcert"
)

// webhookFlags configure the webhook role.
type webhookFlags struct {
	bindAddress        string
	certDir            string
	namespace          string
	certSecret         string
	configuration      string
	service            string
	certHosts          string
	leaderElect        bool
	reservationTimeout time.Duration
}

func (f *webhookFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.bindAddress, "webhook-bind-address", ":9443", "webhook role: address of the HTTPS admission webhook.")
	fs.StringVar(&f.certDir, "webhook-cert-dir", "", "webhook role: directory with tls.crt and tls.key issued by you or cert-manager. Empty: the webhook keeps its own CA and certificate in --webhook-cert-secret and injects the CA into --webhook-configuration.")
	fs.StringVar(&f.namespace, "webhook-namespace", os.Getenv("POD_NAMESPACE"), "webhook role: namespace of the certificate Secret and the leader-election Lease (default $POD_NAMESPACE).")
	fs.StringVar(&f.certSecret, "webhook-cert-secret", "code-sandbox-webhook-server-cert", "webhook role: Secret holding the self-managed CA and certificate.")
	fs.StringVar(&f.configuration, "webhook-configuration", "code-sandbox-validating-webhook-configuration", "webhook role: ValidatingWebhookConfiguration that receives the self-managed CA; empty leaves it alone.")
	fs.StringVar(&f.service, "webhook-service", "code-sandbox-webhook-service", "webhook role: Service in front of the webhook; its cluster DNS names go into the certificate.")
	fs.StringVar(&f.certHosts, "webhook-cert-hosts", "", "webhook role: more comma-separated DNS names or IPs for the certificate (127.0.0.1 for a local run).")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "webhook role: elect one replica to run the quota controller (every replica serves the webhook).")
	fs.DurationVar(&f.reservationTimeout, "quota-reservation-timeout", sandboxquota.DefaultReservationTimeout, "webhook role: how long quota charged at admission waits for its Sandbox to appear before the API server is asked whether the create failed.")
}

func (f *webhookFlags) hosts() []string {
	var hosts []string
	if f.service != "" && f.namespace != "" {
		svc := f.service + "." + f.namespace
		hosts = append(hosts, svc+".svc", f.service, svc, svc+".svc.cluster.local")
	}
	for _, h := range strings.Split(f.certHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// runWebhook serves the SandboxQuota admission webhook and runs the quota
// controller.
func runWebhook(f webhookFlags, metricsAddr, probeAddr string) error {
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
	if f.leaderElect && f.namespace == "" {
		return fmt.Errorf("--leader-elect needs --webhook-namespace (or POD_NAMESPACE) for its Lease")
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()

	certDir := f.certDir
	var certs *webhookcert.Manager
	if certDir == "" {
		if certDir, err = os.MkdirTemp("", "code-sandbox-webhook-"); err != nil {
			return fmt.Errorf("creating a directory for the webhook certificate: %w", err)
		}
		defer os.RemoveAll(certDir)
		direct, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("creating a client: %w", err)
		}
		certs, err = webhookcert.New(direct, webhookcert.Options{
			Namespace:            f.namespace,
			SecretName:           f.certSecret,
			WebhookConfiguration: f.configuration,
			Hosts:                f.hosts(),
			CertDir:              certDir,
		})
		if err != nil {
			return err
		}
		// The server cannot start without its certificate; the CA
		// injection may wait for the configuration to be applied.
		prepCtx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = certs.Prepare(prepCtx)
		cancel()
		if err != nil {
			return err
		}
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              "code-sandbox-quota-controller",
		LeaderElectionNamespace:       f.namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    host,
			Port:    port,
			CertDir: certDir,
		}),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	mgr.GetWebhookServer().Register(admission.Path, &webhook.Admission{
		Handler: admission.NewSandboxValidator(mgr.GetAPIReader(), mgr.GetClient(), scheme, clock.RealClock{}),
	})
	if certs != nil {
		if err := mgr.Add(certs); err != nil {
			return err
		}
	}
	reconciler := sandboxquota.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), clock.RealClock{},
		sandboxquota.Options{ReservationTimeout: f.reservationTimeout})
	if err := reconciler.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the quota controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	log.Info("starting the webhook", "version", version.Version, "address", f.bindAddress, "selfManagedCert", certs != nil, "leaderElect", f.leaderElect)
	return mgr.Start(ctx)
}
