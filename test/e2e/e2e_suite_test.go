//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package e2e runs the real manager binary against a real kube-apiserver and
// the node's real Docker Engine, and drives it only through kubectl, the
// kubectl plugin, the MCP server and the Docker CLI, as a user would. It
// deliberately imports nothing from this module, so that it tests the
// behaviour and not the implementation.
//
// The system runs as make dev-up-system runs it (system_test.go): a
// kube-apiserver configured for aggregated API servers, the operator's
// objects from config/dev/operator (the status policy, the manager
// ServiceAccount and its RBAC, the user roles, the quota webhook
// configuration and the APIService), the operator's control-plane component
// (`manager --role control-plane`: operator CA, node certificate signer, quota
// webhook, aggregated API) and node managers that authenticate with tokens
// bound to a Pod on their node and get their node API certificates from the
// signer.
//
// Run it with `make test-e2e` (needs KUBEBUILDER_ASSETS, Docker and the test
// images).
package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

const (
	// nodeName is the manager's --node-name; every container it creates
	// carries it in nodeLabel, which is how cleanup finds them.
	nodeName = "e2e-node"

	nodeLabel   = framework.NodeLabel
	uidLabel    = framework.UIDLabel
	sampleImage = framework.SampleImage
)

var (
	repoRoot   string
	workDir    string
	kubeconfig string
	samplesDir string
	// kmcpBin is code-sandbox-mcp and pluginBin kubectl-sandbox, built once
	// for every spec that runs them.
	kmcpBin   string
	pluginBin string

	testEnv *envtest.Environment
	// adminConfig is kubeconfig's user: a client certificate of the API
	// server's client CA, in system:masters.
	adminConfig *rest.Config
	// manager is the suite's node manager (nodeName); operator the
	// operator's control-plane component, which specs may restart.
	manager  *managerProcess
	operator *managerProcess
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "code-sandbox-operator end-to-end")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	Expect(assets).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set; run `make test-e2e` or set it to the output of hack/setup-envtest.sh")

	var err error
	repoRoot, err = findRepoRoot(ctx)
	Expect(err).NotTo(HaveOccurred())
	samplesDir = filepath.Join(repoRoot, "config", "samples")

	_, err = run(ctx, "", "docker", "version", "--format", "{{.Server.Version}}")
	Expect(err).NotTo(HaveOccurred(), "the Docker Engine must be running (make docker-up)")
	_, err = run(ctx, "", "docker", "image", "inspect", "--format", "{{.Id}}", sampleImage)
	Expect(err).NotTo(HaveOccurred(), "the sample's image is missing; run `make test-images`")

	// Containers left by an aborted earlier run would break the "exactly
	// one container" checks; the suite owns every container of its node.
	Expect(removeNodeContainers(ctx)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(removeNodeContainers(ctx)).To(Succeed())
	}, NodeTimeout(2*time.Minute))

	workDir, err = os.MkdirTemp("", "code-sandbox-e2e-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, workDir)

	By("building the manager")
	managerBin := filepath.Join(workDir, "manager")
	_, err = run(ctx, repoRoot, "go", "build", "-o", managerBin, "./cmd/manager")
	Expect(err).NotTo(HaveOccurred())
	By("building code-sandbox-mcp")
	kmcpBin = filepath.Join(workDir, "code-sandbox-mcp")
	_, err = run(ctx, repoRoot, "go", "build", "-o", kmcpBin, "./cmd/code-sandbox-mcp")
	Expect(err).NotTo(HaveOccurred())
	By("building kubectl-sandbox")
	pluginBin = filepath.Join(workDir, "kubectl-sandbox")
	_, err = run(ctx, repoRoot, "go", "build", "-o", pluginBin, "./cmd/kubectl-sandbox")
	Expect(err).NotTo(HaveOccurred())

	By("starting etcd and kube-apiserver, configured for aggregated API servers")
	testEnv = &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{filepath.Join(repoRoot, "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	Expect(configureFrontProxy(testEnv, filepath.Join(workDir, "front-proxy"))).To(Succeed())
	// Registered before Start: Start may fail after launching etcd or
	// kube-apiserver, and Stop copes with a partial start.
	DeferCleanup(func() error { return testEnv.Stop() })
	_, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	admin, err := testEnv.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, &rest.Config{})
	Expect(err).NotTo(HaveOccurred())
	adminConfig = admin.Config()
	kc, err := admin.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	kubeconfig = filepath.Join(workDir, "kubeconfig")
	Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())

	By("installing the operator's objects (config/dev/operator) and starting manager --role control-plane")
	Expect(installOperator(ctx)).To(Succeed())
	operator, err = startOperator(ctx)
	Expect(err).NotTo(HaveOccurred())
	// Cleanups run last first: this one after the node managers' and the
	// MCP servers' (which need the operator no more), before the control
	// plane's.
	DeferCleanup(func() error { return operator.stop(15 * time.Second) })

	By("starting the manager of " + nodeName)
	manager, err = startLoopbackNode(nodeName, filepath.Join(workDir, "node-state"))
	Expect(err).NotTo(HaveOccurred())
	// Runs before the container cleanup above (cleanups run in reverse), so
	// that the manager cannot recreate a container while it is removed.
	DeferCleanup(func() error { return manager.stop(15 * time.Second) })
}, NodeTimeout(15*time.Minute))

// Every spec fails with the manager's or the operator's exit status if one
// died, instead of a puzzling timeout somewhere else.
var _ = JustBeforeEach(func() {
	Expect(manager.exitErr()).NotTo(HaveOccurred(), "the manager exited")
	Expect(operator.exitErr()).NotTo(HaveOccurred(), "the operator (manager --role control-plane) exited")
})

// managerProcess is the manager binary running as a child of the test.
type managerProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
	// log is its output so far (also copied to GinkgoWriter).
	log *processLog

	mu  sync.Mutex
	err error
}

func startManager(bin string, args ...string) (*managerProcess, error) {
	cmd := exec.Command(bin, args...)
	out := &processLog{}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = managerProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the manager: %w", err)
	}
	m := &managerProcess{cmd: cmd, done: make(chan struct{}), log: out}
	go func() {
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exited with status 0")
		}
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		close(m.done)
	}()
	return m, nil
}

// exitErr is nil while the manager runs.
func (m *managerProcess) exitErr() error {
	if m == nil {
		return errors.New("the manager was never started")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// stop sends SIGTERM (the manager's graceful shutdown) and falls back to
// SIGKILL, so that a wedged manager never outlives the suite. A manager that
// never started (nil) is stopped already.
func (m *managerProcess) stop(grace time.Duration) error {
	if m == nil {
		return nil
	}
	select {
	case <-m.done:
		return nil
	default:
	}
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling the manager: %w", err)
	}
	select {
	case <-m.done:
		return nil
	case <-time.After(grace):
	}
	_ = m.cmd.Process.Kill()
	select {
	case <-m.done:
		return fmt.Errorf("the manager ignored SIGTERM for %s and was killed", grace)
	case <-time.After(10 * time.Second):
		return errors.New("the manager did not exit even after SIGKILL")
	}
}

// removeNodeContainers force-removes every container, running or not, that
// the suite's manager created.
func removeNodeContainers(ctx context.Context) error {
	return removeContainersOf(ctx, nodeName)
}

// removeContainersOf force-removes every container, running or not, that a
// manager for node created.
func removeContainersOf(ctx context.Context, node string) error {
	out, err := run(ctx, "", "docker", "ps", "-aq", "--filter", "label="+nodeLabel+"="+node)
	if err != nil {
		return err
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return nil
	}
	fmt.Fprintf(GinkgoWriter, "removing %d container(s) of node %s\n", len(ids), node)
	_, err = run(ctx, "", "docker", append([]string{"rm", "-f", "-v"}, ids...)...)
	return err
}

func findRepoRoot(ctx context.Context) (string, error) {
	out, err := run(ctx, "", "go", "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(out)
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the module: `go env GOMOD` is empty")
	}
	return filepath.Dir(gomod), nil
}

// run runs a command to completion and returns its stdout (the framework's
// Run: bounded, its error carrying stderr).
func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	return framework.Run(ctx, dir, nil, name, args...)
}

func runWithStdin(ctx context.Context, dir string, stdin io.Reader, name string, args ...string) (string, error) {
	return framework.Run(ctx, dir, stdin, name, args...)
}

// kube is kubectl with the suite's admin kubeconfig, run in the repository.
func kube() framework.Kubectl {
	return framework.Kubectl{Kubeconfig: kubeconfig, Dir: repoRoot}
}

func kubectl(ctx context.Context, args ...string) (string, error) {
	return kube().Run(ctx, args...)
}

func docker(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "", "docker", args...)
}
