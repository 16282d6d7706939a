/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command devcluster runs a throwaway Kubernetes control plane for local
// development: envtest's etcd and kube-apiserver on loopback, with the
// Sandbox CRD installed and an admin kubeconfig written to disk. There is no
// kubelet, scheduler or controller-manager; the Sandbox managers are the only
// controllers, and they run next to it as plain processes (see make dev-up).
//
// kube-apiserver is configured as a cluster's is for aggregated API servers
// (the front proxy): a front-proxy CA of its own, the client certificate it
// presents when it proxies a request to an APIService, and the
// request-header flags, which it publishes in
// kube-system/extension-apiserver-authentication. The operator's aggregated
// API (sandboxes/exec, files, log, history) is served that way by the local
// `bin/manager --role control-plane` (hack/dev-up-system.sh).
//
// It runs until SIGINT or SIGTERM, then stops etcd and kube-apiserver and
// removes their data, so every start is a fresh cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/code-sandbox/code-sandbox-operator/internal/frontproxy"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

func main() {
	// A private FlagSet: controller-runtime registers its own --kubeconfig
	// (for reading one) on the global set, and ours means "write it here".
	fs := flag.NewFlagSet("devcluster", flag.ExitOnError)
	kubeconfigPath := fs.String("kubeconfig", "bin/dev/kubeconfig", "where to write the admin kubeconfig")
	crdDir := fs.String("crd-dir", "config/crd/bases", "directory holding the CRD manifests to install")
	startTimeout := fs.Duration("start-timeout", 90*time.Second,
		"how long etcd and kube-apiserver may take to become ready (a cold kube-apiserver on a small machine is slow)")
	_ = fs.Parse(os.Args[1:])

	if err := run(*kubeconfigPath, *crdDir, *startTimeout); err != nil {
		fmt.Fprintf(os.Stderr, "devcluster: %v\n", err)
		os.Exit(1)
	}
}

func run(kubeconfigPath, crdDir string, startTimeout time.Duration) (retErr error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set; run through `make dev-up` or set it to the output of hack/setup-envtest.sh")
	}
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return fmt.Errorf("KUBEBUILDER_ASSETS=%s has no %s: %w", assets, bin, err)
		}
	}
	if _, err := os.Stat(crdDir); err != nil {
		return fmt.Errorf("CRD directory: %w (run from the repository root)", err)
	}

	// Catch signals before starting anything, so that a signal that arrives
	// while etcd and kube-apiserver come up still stops them.
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()

	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{crdDir},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	// The front proxy's CA and client key live only as long as this
	// control plane: nothing else needs them.
	frontProxyDir, err := os.MkdirTemp("", "code-sandbox-front-proxy-")
	if err != nil {
		return fmt.Errorf("creating a directory for the front-proxy certificates: %w", err)
	}
	defer os.RemoveAll(frontProxyDir)
	if err := frontproxy.Configure(env, frontProxyDir, 365*24*time.Hour); err != nil {
		return err
	}
	// kube-apiserver proves itself to the admission webhook with a client
	// certificate; the webhook (bin/manager --webhook-client-ca) reads the
	// CA next to the kubeconfig, so it lives as long as this control plane.
	webhookClientDir := filepath.Join(filepath.Dir(kubeconfigPath), "webhook-client")
	if err := os.MkdirAll(webhookClientDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", webhookClientDir, err)
	}
	admissionConfig, err := webhookclient.Write(webhookClientDir, 365*24*time.Hour)
	if err != nil {
		return err
	}
	env.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admissionConfig)
	logf("starting etcd and kube-apiserver from %s", assets)
	cfg, err := env.Start()
	// Start can fail after etcd or kube-apiserver is already running (for
	// example while installing the CRDs); stopping is safe either way and
	// keeps their processes and temp dirs from leaking.
	defer func() {
		logf("stopping etcd and kube-apiserver")
		if err := env.Stop(); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("stopping the control plane: %w", err))
			return
		}
		logf("stopped")
	}()
	if err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}

	// A named user rather than envtest's internal one, so that audit-style
	// output (kubectl auth whoami, managedFields) reads sensibly.
	admin, err := env.AddUser(envtest.User{Name: "dev-admin", Groups: []string{"system:masters"}}, &rest.Config{})
	if err != nil {
		return fmt.Errorf("provisioning the admin user: %w", err)
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return fmt.Errorf("rendering the admin kubeconfig: %w", err)
	}

	if err := prepareCluster(ctx, admin.Config()); err != nil {
		if ctx.Err() != nil {
			// Stopped while starting (make dev-down right after dev-up):
			// not a failure.
			logf("received a stop signal while starting")
			return nil
		}
		return err
	}

	if err := writeFileAtomic(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	// A kubeconfig left behind would point at a dead port; dev-up treats a
	// working kubeconfig as "the cluster is up", so it must not outlive us.
	defer func() {
		if err := os.Remove(kubeconfigPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			retErr = errors.Join(retErr, fmt.Errorf("removing the kubeconfig: %w", err))
		}
	}()

	logf("ready: kube-apiserver at %s, kubeconfig %s (pid %d)", cfg.Host, kubeconfigPath, os.Getpid())
	<-ctx.Done()
	logf("received a stop signal")
	return nil
}

// prepareCluster does what a real cluster's controller-manager would have done
// by now and checks that ServiceAccount tokens can be issued.
func prepareCluster(ctx context.Context, cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building a client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// kube-apiserver creates "default" itself, but envtest only waits 5 s for
	// it; creating it here removes that race on a slow machine.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: metav1.NamespaceDefault}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace default: %w", err)
	}

	// Without a controller-manager nobody creates the "default"
	// ServiceAccount, and `kubectl create token default` (like any workload
	// that expects it) would fail.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	if _, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ServiceAccount default/default: %w", err)
	}

	// Fail at start rather than later in a test if the token issuer is
	// misconfigured.
	expiry := int64(600)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}
	if _, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).CreateToken(ctx, "default", tr, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("issuing a ServiceAccount token (is the token issuer configured?): %w", err)
	}

	// Aggregated API servers read the front proxy's CA and header names
	// from here; kube-apiserver writes it shortly after it starts.
	for {
		cm, err := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		if err == nil && cm.Data["requestheader-client-ca-file"] != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver did not publish the front-proxy configuration in kube-system/extension-apiserver-authentication (last error: %v)", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// writeFileAtomic makes sure a reader never sees a half-written kubeconfig.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s devcluster: %s\n", time.Now().Format(time.RFC3339), fmt.Sprintf(format, args...))
}
