//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The nodes that run Sandboxes and the Docker Engines on them.
//
// With config/default each node's Engine runs in the operator's engine
// DaemonSet; the suite reaches it with kubectl exec into that node's engine
// pod, as an operator of the cluster would. With config/node-docker the
// nodes' own Engine serves the sandboxes; the suite then expects one node,
// this machine, and uses the local docker CLI.
var (
	// workers are the nodes a manager pod runs on, sorted.
	workers []string
	// engineMode: the operator's engine DaemonSet runs the Engines.
	engineMode bool
	// kindCluster is the kind cluster's name when the nodes are kind's
	// (their providerID is kind://docker/<cluster>/<node>), else empty.
	kindCluster string
	// kindNodes are all the kind cluster's nodes, control plane included.
	kindNodes []string
)

const (
	// engineSocket is where the engine DaemonSet's dockerd listens
	// (config/engine), the same path inside the pod as on the node.
	engineSocket = "unix:///run/code-sandbox-operator/docker.sock"
	// engineDataRoot is the Engine's data root on the node (a hostPath).
	engineDataRoot = "/var/lib/code-sandbox-operator/docker"
	// engineSelector and managerSelector select the operator's pods.
	engineSelector  = "app.kubernetes.io/name=code-sandbox-operator,app.kubernetes.io/component=engine"
	managerSelector = "app.kubernetes.io/name=code-sandbox-operator,app.kubernetes.io/component=manager"
)

// discoverNodes fills workers, engineMode and kindCluster from the running
// operator (after waitOperatorRollout).
func discoverNodes(ctx context.Context) error {
	out, err := kubectl(ctx, "get", "pods", "-n", operatorNS, "-l", managerSelector, "-o", "jsonpath={.items[*].spec.nodeName}")
	if err != nil {
		return err
	}
	workers = strings.Fields(out)
	sort.Strings(workers)
	if len(workers) == 0 {
		return errors.New("no manager pod runs on any node")
	}
	out, err = kubectl(ctx, "get", "daemonset", "-n", operatorNS, "-l", engineSelector, "-o", "name")
	if err != nil {
		return err
	}
	engineMode = strings.TrimSpace(out) != ""
	out, err = kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.providerID}{"\n"}{end}`)
	if err != nil {
		return err
	}
	kindCluster, kindNodes = "", nil
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasPrefix(f[1], "kind://docker/") {
			parts := strings.Split(strings.TrimPrefix(f[1], "kind://docker/"), "/")
			kindCluster = parts[0]
			kindNodes = append(kindNodes, f[0])
		}
	}
	if !engineMode && len(workers) != 1 {
		return fmt.Errorf("the nodes' own Docker Engines (config/node-docker) on %d nodes: the suite reaches only this machine's", len(workers))
	}
	return nil
}

// enginePod is the engine pod on node.
func enginePod(ctx context.Context, node string) (string, error) {
	out, err := kubectl(ctx, "get", "pods", "-n", operatorNS, "-l", engineSelector,
		"--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return "", err
	}
	pods := strings.Fields(out)
	if len(pods) != 1 {
		return "", fmt.Errorf("%d engine pods on node %s", len(pods), node)
	}
	return pods[0], nil
}

// dockerOn runs the docker CLI against node's Engine.
func dockerOn(ctx context.Context, node string, args ...string) (string, error) {
	if !engineMode {
		return docker(ctx, args...)
	}
	pod, err := enginePod(ctx, node)
	if err != nil {
		return "", err
	}
	return kubectl(ctx, append([]string{"exec", "-n", operatorNS, pod, "-c", "dockerd", "--", "docker", "-H", engineSocket}, args...)...)
}

// dockerEach runs the docker CLI against every worker's Engine and returns
// their outputs one after the other (for ps with filters).
func dockerEach(ctx context.Context, args ...string) (string, error) {
	var b strings.Builder
	for _, n := range workers {
		out, err := dockerOn(ctx, n, args...)
		if err != nil {
			return b.String(), fmt.Errorf("node %s: %w", n, err)
		}
		b.WriteString(out)
		if out != "" && !strings.HasSuffix(out, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}

// dockerFind runs the docker CLI against each worker's Engine until one
// succeeds (for inspect of a container that is on one of them).
func dockerFind(ctx context.Context, args ...string) (string, error) {
	var errs []error
	for _, n := range workers {
		out, err := dockerOn(ctx, n, args...)
		if err == nil {
			return out, nil
		}
		errs = append(errs, fmt.Errorf("node %s: %w", n, err))
	}
	return "", errors.Join(errs...)
}

// loadSandboxImages puts images from this machine's Docker into every
// worker's Engine with the one loader the Makefile has (make
// kind-load-sandbox-images, hack/kind-load-sandbox-images.sh: it skips an
// Engine that has them already). With the nodes' own Engine
// (config/node-docker, this machine) they must be here.
func loadSandboxImages(ctx context.Context, images ...string) error {
	if !engineMode {
		_, err := docker(ctx, append([]string{"image", "inspect", "--format", "{{.Id}}"}, images...)...)
		return err
	}
	out, err := run(ctx, repoRoot, nil, "make", "kind-load-sandbox-images",
		"KIND_SANDBOX_IMAGES="+strings.Join(images, " "), "KIND_KUBECONFIG="+kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %v into the Engines: %w\n%s", images, err, out)
	}
	return nil
}

// sandboxNode is the node a Sandbox runs on (status.nodeName).
func sandboxNode(ctx context.Context, ns, name string) string {
	GinkgoHelper()
	return mustKubectl(ctx, "get", "sandbox/"+name, "-n", ns, "-o", "jsonpath={.status.nodeName}")
}

// waitSandboxesReady waits until every named Sandbox in ns is Ready.
func waitSandboxesReady(ctx context.Context, ns string, timeout time.Duration, names ...string) {
	GinkgoHelper()
	kube().WaitSandboxesReady(ctx, ns, timeout, func() string { return describeSandbox(ctx, ns, names[0]) }, names...)
}

// containersLeft lists the sandbox containers on the workers' Engines. Once
// make undeploy has removed the engine pods it lists what is left in their
// data roots instead, which only a kind node (a container on this machine)
// lets the suite see.
func containersLeft(ctx context.Context) (string, error) {
	if !engineMode {
		return docker(ctx, "ps", "-aq", "--filter", "label="+nodeLabel)
	}
	if out, _ := kubectl(ctx, "get", "pods", "-n", operatorNS, "-l", engineSelector, "-o", "name"); strings.TrimSpace(out) != "" {
		return dockerEach(ctx, "ps", "-aq", "--filter", "label="+nodeLabel)
	}
	if kindCluster == "" {
		return "", errors.New("the engine pods are gone and the nodes are not kind's: nothing can list their data roots")
	}
	var b strings.Builder
	for _, n := range workers {
		out, err := docker(ctx, "exec", n, "sh", "-c", "ls -A "+engineDataRoot+"/containers 2>/dev/null || true")
		if err != nil {
			return b.String(), err
		}
		b.WriteString(out)
	}
	return strings.TrimSpace(b.String()), nil
}

// routeServicesThroughKind routes the cluster's Service range from this
// machine to the kind control plane node, whose kube-proxy forwards (and
// masquerades) to the Service's pods: the specs reach the MCP server and
// the webhook through their Services and the cluster's DNS, as a pod
// would. The control plane node is never stopped by the fault specs.
func routeServicesThroughKind(ctx context.Context) {
	GinkgoHelper()
	cfg := mustKubectl(ctx, "get", "configmap", "kubeadm-config", "-n", "kube-system", "-o", "jsonpath={.data.ClusterConfiguration}")
	m := regexp.MustCompile(`serviceSubnet: *"?([0-9./]+)`).FindStringSubmatch(cfg)
	Expect(m).NotTo(BeNil(), "no serviceSubnet in kubeadm's ClusterConfiguration:\n%s", cfg)
	var cp string
	for _, n := range kindNodes {
		if strings.HasSuffix(n, "-control-plane") {
			cp = n
		}
	}
	Expect(cp).NotTo(BeEmpty(), "no control plane node among %v", kindNodes)
	ip := mustKubectl(ctx, "get", "node", cp, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)
	out, err := exec.CommandContext(ctx, "ip", "route", "replace", m[1], "via", ip).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "routing %s via %s (root needed): %s", m[1], ip, out)
	DeferCleanup(func() { _ = exec.Command("ip", "route", "del", m[1], "via", ip).Run() })
}

// withCondition lists the objects of kind (in ns, selected by selector
// unless it is empty) whose condition cond is True, as the value of field
// (a JSONPath inside the object, such as .metadata.name). kubectl's
// JSONPath cannot filter on a filter, so the condition is checked here.
func withCondition(ctx context.Context, kind, ns, selector, cond, field string) ([]string, error) {
	args := []string{"get", kind, "-n", ns, "-o",
		`jsonpath={range .items[*]}{` + field + `}{"|"}{.status.conditions[?(@.type=="` + cond + `")].status}{"\n"}{end}`}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	out, err := kubectl(ctx, args...)
	if err != nil {
		return nil, err
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if v, status, ok := strings.Cut(line, "|"); ok && status == "True" && v != "" {
			got = append(got, v)
		}
	}
	return got, nil
}
