/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command manager runs the Sandbox controller for one node. Run one per node
// (a DaemonSet in a cluster), each with its own --node-name and access to
// that node's Docker Engine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/controllers"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
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
	)
	flag.StringVar(&nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the node this manager runs on (default $NODE_NAME). Required.")
	flag.StringVar(&dockerHost, "docker-host", os.Getenv("DOCKER_HOST"), "Docker Engine endpoint (default $DOCKER_HOST, else unix:///var/run/docker.sock).")
	flag.IntVar(&maxSandboxes, "max-sandboxes", 50, "Most Sandboxes this node runs at once; unbound Sandboxes beyond it are left to other nodes.")
	flag.DurationVar(&stopGrace, "stop-grace-period", 10*time.Second, "Time between SIGTERM and SIGKILL when a sandbox is deleted.")
	flag.DurationVar(&dockerTimeout, "docker-timeout", 30*time.Second, "Timeout for each Docker API call (image pulls use --pull-timeout).")
	flag.DurationVar(&pullTimeout, "pull-timeout", 5*time.Minute, "Timeout for one image pull.")
	flag.DurationVar(&orphanGCInterval, "orphan-gc-interval", time.Minute, "How often to remove containers whose Sandbox no longer exists (also done at start-up).")
	flag.IntVar(&concurrency, "max-concurrent-reconciles", 4, "Sandboxes reconciled in parallel.")
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&showVersion, "version", false, "Print the version and exit.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()

	if showVersion {
		fmt.Println(version.Version)
		return nil
	}
	if nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	if maxSandboxes < 1 {
		return fmt.Errorf("--max-sandboxes must be at least 1, got %d", maxSandboxes)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	docker, err := dockerruntime.New(dockerruntime.Options{Host: dockerHost, CallTimeout: dockerTimeout, PullTimeout: pullTimeout})
	if err != nil {
		return err
	}
	defer docker.Close()

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		// Each node's manager owns only its node's Sandboxes, so every
		// replica is active; there is nothing to elect.
		LeaderElection: false,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}

	reconciler, err := controllers.NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), docker,
		mgr.GetEventRecorder("sandbox-manager-"+nodeName), clock.RealClock{}, controllers.Options{
			NodeName:                nodeName,
			MaxSandboxes:            maxSandboxes,
			StopGracePeriod:         stopGrace,
			MaxConcurrentReconciles: concurrency,
		})
	if err != nil {
		return err
	}
	if err := reconciler.SetupWithManager(mgr, orphanGCInterval); err != nil {
		return fmt.Errorf("setting up controller: %w", err)
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
