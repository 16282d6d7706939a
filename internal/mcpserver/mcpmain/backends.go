package mcpmain

// The backends: the Docker one and the Kubernetes one with its cluster access.

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/kubebackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// sandboxBackend is a backend with the lifecycle serve drives.
type sandboxBackend interface {
	contract.Backend
	Start(context.Context)
	InstanceID() string
}

// kubeSetup is the kubernetes backend's cluster access.
type kubeSetup struct {
	config    *rest.Config
	namespace string
}

// loadKube resolves --kubeconfig and --namespace with kubectl's rules:
// --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the in-cluster
// ServiceAccount; the namespace defaults to the context's (in a cluster,
// the pod's), else "default".
func loadKube(o Config) (*kubeSetup, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, usagef("--backend kubernetes: no usable kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a cluster: %v", err)
	}
	ns := o.Namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, usagef("--backend kubernetes: reading the kubeconfig's namespace: %v (pass --namespace)", err)
		}
	}
	if ns == "" {
		ns = "default"
	}
	// Every tool call costs a few API calls (access reviews, a Get); the
	// client's default of 5 per second would make a busy server queue.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	return &kubeSetup{config: cfg, namespace: ns}, nil
}

func newKubeBackend(o Config, kube *kubeSetup, logger *slog.Logger) (*kubebackend.Backend, error) {
	pull := sandboxv1alpha1.ImagePullPolicy(o.PullPolicy)
	switch pull {
	case sandboxv1alpha1.PullIfNotPresent, sandboxv1alpha1.PullNever, sandboxv1alpha1.PullAlways:
	default:
		return nil, usagef("--pull-policy %q: want IfNotPresent, Never or Always", o.PullPolicy)
	}
	var rt sandboxv1alpha1.RuntimeClass
	switch o.Runtime {
	case dockerruntime.RuntimeRunc:
		rt = sandboxv1alpha1.RuntimeRunc
	case dockerruntime.RuntimeRunsc:
		rt = sandboxv1alpha1.RuntimeGVisor
	default:
		return nil, usagef("--runtime %q: want runc or runsc", o.Runtime)
	}
	if o.ReadyTimeout < time.Second {
		return nil, usagef("--ready-timeout %s: want at least 1s", o.ReadyTimeout)
	}
	b, err := kubebackend.New(kubebackend.Options{
		Config:                      kube.config,
		Namespace:                   kube.namespace,
		NodeName:                    o.NodeName,
		NamespaceFromServiceAccount: o.NamespaceFromServiceAccount,
		CallerNamespaces:            o.Auth == "oidc" && len(o.OIDC.Namespaces) > 0,
		PullPolicy:                  pull,
		Runtime:                     rt,
		MaxSandboxes:                o.MaxSandboxes,
		MaxSnapshots:                o.MaxSnapshots,
		IdleTimeout:                 o.IdleTimeout,
		IdlePause:                   o.IdlePause,
		ReadyTimeout:                o.ReadyTimeout,
		WarmPool:                    o.WarmPool,
		DefaultImage:                o.DefaultImage,
		Logger:                      logger,
	})
	if err != nil {
		return nil, usageError{err}
	}
	return b, nil
}

func newDockerBackend(o Config, logger *slog.Logger) (*dockerbackend.Backend, error) {
	switch dockerruntime.PullPolicy(o.PullPolicy) {
	case dockerruntime.PullIfNotPresent, dockerruntime.PullNever, dockerruntime.PullAlways:
	default:
		return nil, usagef("--pull-policy %q: want IfNotPresent, Never or Always", o.PullPolicy)
	}
	if o.Runtime != dockerruntime.RuntimeRunc && o.Runtime != dockerruntime.RuntimeRunsc {
		return nil, usagef("--runtime %q: want runc or runsc", o.Runtime)
	}
	imagePolicy, err := imagepolicy.New(o.AllowedRegistries, o.AllowPublicRegistries)
	if err != nil {
		return nil, usagef("--allowed-registries: %v", err)
	}
	// Egress sandboxes only behind the egress firewall (internal/egress).
	var fw *egress.Firewall
	var egressReady func(context.Context) error
	if o.AllowEgress {
		allow, err := egress.ParseCIDRs(o.EgressAllowCIDRs)
		if err != nil {
			return nil, usagef("--egress-allow-cidr: %v", err)
		}
		if fw, err = egress.NewFirewall(egress.Options{AllowCIDRs: allow}); err != nil {
			return nil, err
		}
		egressReady = fw.Healthy
	}
	client, err := dockerruntime.New(dockerruntime.Options{Host: o.DockerHost, ManagedBy: dockerruntime.ManagedByMCP, ImagePolicy: imagePolicy, EgressReady: egressReady})
	if err != nil {
		return nil, err
	}
	inst, err := dockerbackend.CurrentInstance()
	if err != nil {
		return nil, err
	}
	var store snapshotstore.Store
	if o.SnapshotRegistry != "" {
		r, err := snapshotstore.NewRegistry(o.SnapshotRegistry, snapshotstore.RegistryOptions{
			MaxBytes: 3 * dockerruntime.DefaultDiskBytes, SpoolDir: o.SnapshotDir})
		if err != nil {
			return nil, usagef("--snapshot-registry: %v", err)
		}
		store = r
	}
	return dockerbackend.New(dockerbackend.Options{
		Client:        client,
		Instance:      inst,
		PullPolicy:    dockerruntime.PullPolicy(o.PullPolicy),
		Runtime:       o.Runtime,
		MaxSandboxes:  o.MaxSandboxes,
		IdleTimeout:   o.IdleTimeout,
		IdlePause:     o.IdlePause,
		HistoryDir:    o.HistoryDir,
		SnapshotDir:   o.SnapshotDir,
		MaxSnapshots:  o.MaxSnapshots,
		SnapshotStore: store,
		Logger:        logger,
		WarmPool:      o.warmPoolCount(),
		DefaultImage:  o.DefaultImage,

		EgressFirewall: fw,
	})
}

// warmPoolCount is the docker backend's pool size, already validated.
func (o Config) warmPoolCount() int {
	n, _ := o.dockerWarmPool()
	return n
}
