//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/code-sandbox/code-sandbox-operator/internal/frontproxy"
)

// The system as make dev-up-system runs it (hack/dev-lib.sh,
// config/dev/operator), on loopback ports of its own.
const (
	operatorNamespace     = "code-sandbox-system"
	managerServiceAccount = "code-sandbox-controller-manager"
	managerUser           = "system:serviceaccount:" + operatorNamespace + ":" + managerServiceAccount
	webhookConfiguration  = "code-sandbox-validating-webhook-configuration"
	apiServiceName        = "v1alpha1.subresources.sandbox.code-sandbox.dev"
	apiServerService      = "code-sandbox-apiserver"
	// The user roles of config/rbac, as config/dev/operator installs them.
	editorRole = "code-sandbox-sandbox-editor-role"
	execRole   = "code-sandbox-sandbox-exec-role"

	// nodeCertificateLog is what a manager logs once the signer has issued
	// its node API certificate.
	nodeCertificateLog = "serving a new node API certificate"
)

var (
	// webhookAddr and apiserverAddr are the operator's quota webhook and
	// aggregated API server (config/dev/operator uses 127.0.0.1:9444 and
	// :9445; the suite picks free ports so that it can run next to make
	// dev-up-system).
	webhookAddr, apiserverAddr string
)

// configureFrontProxy sets kube-apiserver's aggregation flags with a fresh
// front-proxy CA and client certificate in dir, as hack/devcluster does
// (package frontproxy).
func configureFrontProxy(env *envtest.Environment, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return frontproxy.Configure(env, dir, 24*time.Hour)
}

// freeAddr is a loopback address nothing listens on right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// installOperator applies config/dev/operator, as make dev-up-system does,
// with the quota webhook and the aggregated API on free loopback ports
// instead of 9444 and 9445.
func installOperator(ctx context.Context) error {
	var err error
	if webhookAddr, err = freeAddr(); err != nil {
		return err
	}
	if apiserverAddr, err = freeAddr(); err != nil {
		return err
	}
	_, apiPortStr, _ := net.SplitHostPort(apiserverAddr)
	apiPort, _ := strconv.ParseInt(apiPortStr, 10, 64)

	rendered, err := kubectl(ctx, "kustomize", filepath.Join(repoRoot, "config", "dev", "operator"))
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for _, doc := range strings.Split(rendered, "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			return fmt.Errorf("config/dev/operator: %w", err)
		}
		switch obj.GetKind() {
		case "ValidatingWebhookConfiguration":
			hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
			for _, h := range hooks {
				cc := h.(map[string]any)["clientConfig"].(map[string]any)
				raw, ok := cc["url"].(string)
				if !ok {
					return fmt.Errorf("config/dev/operator: webhook %v has no clientConfig.url: add it to the overlay's webhook patch", h.(map[string]any)["name"])
				}
				u, err := url.Parse(raw)
				if err != nil {
					return err
				}
				u.Host = webhookAddr
				cc["url"] = u.String()
			}
			if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
				return err
			}
		case "APIService":
			if err := unstructured.SetNestedField(obj.Object, apiPort, "spec", "service", "port"); err != nil {
				return err
			}
		case "Service":
			if obj.GetName() == apiServerService {
				ports := []any{map[string]any{"name": "https", "port": apiPort, "protocol": "TCP"}}
				if err := unstructured.SetNestedSlice(obj.Object, ports, "spec", "ports"); err != nil {
					return err
				}
			}
		}
		data, err := yaml.Marshal(obj.Object)
		if err != nil {
			return err
		}
		out.WriteString("---\n")
		out.Write(data)
	}
	_, err = runWithStdin(ctx, repoRoot, &out, "kubectl", "--kubeconfig", kubeconfig,
		"apply", "--server-side", "--field-manager=e2e", "-f", "-")
	return err
}

// startOperator starts `manager --role control-plane` as hack/dev-lib.sh does and
// waits until the API server calls its webhook and serves its aggregated
// API.
func startOperator(ctx context.Context) (*managerProcess, error) {
	p, err := startManager(filepath.Join(workDir, "manager"),
		"--role", "control-plane",
		"--kubeconfig", kubeconfig,
		"--webhook-namespace", operatorNamespace,
		"--webhook-bind-address", webhookAddr,
		"--webhook-service", "",
		"--webhook-configuration", webhookConfiguration,
		"--apiserver-bind-address", apiserverAddr,
		"--apiserver-service", apiServerService,
		"--apiservice", apiServiceName,
		"--webhook-cert-hosts", "127.0.0.1,"+apiServerService+"."+operatorNamespace+".svc",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "127.0.0.1:0",
	)
	if err != nil {
		return nil, err
	}
	if err := waitOperator(ctx, p); err != nil {
		_ = p.stop(15 * time.Second)
		return nil, err
	}
	return p, nil
}

// waitOperator waits until the operator has injected its CA, the API
// server calls its webhook (a dry-run create is admitted or refused by it,
// never "failed calling webhook") and reports the APIService Available.
func waitOperator(ctx context.Context, p *managerProcess) error {
	steps := []struct {
		what  string
		check func(context.Context) error
	}{
		{"the CA in every webhook and the APIService", func(ctx context.Context) error {
			out, err := kubectl(ctx, "get", "validatingwebhookconfiguration", webhookConfiguration,
				"-o", `jsonpath={range .webhooks[*]}[{.clientConfig.caBundle}]{end}`)
			if err != nil {
				return err
			}
			if out == "" || strings.Contains(out, "[]") {
				return fmt.Errorf("webhooks without a caBundle: %.80s", out)
			}
			out, err = kubectl(ctx, "get", "apiservice", apiServiceName, "-o", "jsonpath={.spec.caBundle}")
			if err == nil && out == "" {
				err = errors.New("no caBundle in the APIService")
			}
			return err
		}},
		{"the API server calling the webhook", func(ctx context.Context) error {
			_, err := runWithStdin(ctx, repoRoot, strings.NewReader(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata: {generateName: e2e-probe-, namespace: default}
spec: {image: e2e/probe:1, activeDeadlineSeconds: 60}
`), "kubectl", "--kubeconfig", kubeconfig, "create", "--dry-run=server", "-o", "name", "-f", "-")
			if err != nil && !strings.Contains(err.Error(), `admission webhook "sandbox-quota.code-sandbox.dev" denied the request`) {
				return err
			}
			return nil
		}},
		{"APIService " + apiServiceName + " Available", func(ctx context.Context) error {
			out, err := kubectl(ctx, "get", "apiservice", apiServiceName,
				"-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}: {.status.conditions[?(@.type=="Available")].message}`)
			if err == nil && !strings.HasPrefix(out, "True:") {
				err = errors.New(out)
			}
			return err
		}},
	}
	for _, step := range steps {
		By("waiting for " + step.what)
		err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
			if err := p.exitErr(); err != nil {
				return stopPolling{fmt.Errorf("the operator exited: %w", err)}
			}
			return step.check(ctx)
		})
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", step.what, err)
		}
	}
	return nil
}

// nodeKubeconfig writes a kubeconfig for node's manager with a token bound
// to a Pod on node (hack/dev-node-kubeconfig.sh, which make dev-up-system
// uses too) and returns its path.
func nodeKubeconfig(ctx context.Context, node string) (string, error) {
	path := filepath.Join(workDir, "manager-"+node+".kubeconfig")
	_, err := run(ctx, repoRoot, filepath.Join(repoRoot, "hack", "dev-node-kubeconfig.sh"), kubeconfig, node, path, "2h")
	return path, err
}

// startLoopbackNode starts a manager for node as make dev-up-system starts
// one: with a Pod-bound token of the manager ServiceAccount, its node API
// on loopback with a certificate the operator's signer issued. It returns
// once that certificate is served.
func startLoopbackNode(node, stateDir string) (*managerProcess, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodeConfig, err := nodeKubeconfig(ctx, node)
	if err != nil {
		return nil, err
	}
	m, err := startManager(filepath.Join(workDir, "manager"),
		"--kubeconfig", nodeConfig,
		"--node-name", node,
		"--operator-namespace", operatorNamespace,
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "127.0.0.1:0",
		"--state-dir", stateDir,
		"--node-api-bind-address", "127.0.0.1:0",
		"--node-api-advertise-address", "127.0.0.1",
	)
	if err != nil {
		return nil, err
	}
	err = poll(ctx, 2*time.Minute, func(context.Context) error {
		if err := m.exitErr(); err != nil {
			return stopPolling{fmt.Errorf("the manager of %s exited: %w", node, err)}
		}
		if !strings.Contains(m.log.String(), nodeCertificateLog) {
			return fmt.Errorf("the manager of %s has no node API certificate yet", node)
		}
		return nil
	})
	if err != nil {
		_ = m.stop(15 * time.Second)
		return nil, err
	}
	return m, nil
}

// writeKubeconfig writes a kubeconfig named name for the suite's API server
// (its address and CA) whose user is user (token, client certificate, exec
// plugin: the kubeconfig's user fields), and returns its path.
func writeKubeconfig(name string, user map[string]any) (string, error) {
	return writeKubeconfigFor(name, map[string]any{
		"server":                     adminConfig.Host,
		"certificate-authority-data": base64.StdEncoding.EncodeToString(adminConfig.CAData),
	}, user)
}

// writeKubeconfigFor writes a kubeconfig named name for cluster and user
// (kubeconfig fields) and returns its path.
func writeKubeconfigFor(name string, cluster, user map[string]any) (string, error) {
	cfg := map[string]any{
		"apiVersion": "v1", "kind": "Config",
		"clusters":        []any{map[string]any{"name": "e2e", "cluster": cluster}},
		"users":           []any{map[string]any{"name": name, "user": user}},
		"contexts":        []any{map[string]any{"name": name, "context": map[string]any{"cluster": "e2e", "user": name}}},
		"current-context": name,
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(workDir, name+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// tokenKubeconfig is a kubeconfig whose user is token.
func tokenKubeconfig(name, token string) (string, error) {
	return writeKubeconfig(name, map[string]any{"token": token})
}

// execPluginKubeconfig is a kubeconfig whose user gets token from a
// client-go credential plugin (as OIDC and cloud logins do): here one that
// prints an ExecCredential with token.
func execPluginKubeconfig(name, token string) (string, error) {
	credential := filepath.Join(workDir, name+".credential.json")
	data := fmt.Sprintf(`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":%q}}`, token)
	if err := os.WriteFile(credential, []byte(data), 0o600); err != nil {
		return "", err
	}
	return writeKubeconfig(name, map[string]any{"exec": map[string]any{
		"apiVersion":      "client.authentication.k8s.io/v1",
		"command":         "cat",
		"args":            []any{credential},
		"interactiveMode": "Never",
	}})
}

// certKubeconfig is a kubeconfig whose user is a client certificate, from
// the API server's client CA, for user (in no group).
func certKubeconfig(user string) (string, error) {
	u, err := testEnv.AddUser(envtest.User{Name: user}, &rest.Config{})
	if err != nil {
		return "", err
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(workDir, user+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// stopPolling ends poll at once with its error.
type stopPolling struct{ error }

// poll runs check every 250 ms until it returns nil, returns stopPolling,
// or timeout passes (then it returns the last error).
func poll(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := check(ctx)
		var stop stopPolling
		switch {
		case err == nil:
			return nil
		case errors.As(err, &stop):
			return stop.error
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (after %s)", err, timeout)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startKubectlProxy runs `kubectl proxy` with kubeconfigPath's credentials
// on a free loopback port until the calling node ends, and returns its URL.
func startKubectlProxy(kubeconfigPath string) string {
	GinkgoHelper()
	cmd := exec.Command("kubectl", "--kubeconfig", kubeconfigPath, "proxy", "--address=127.0.0.1", "--port=0")
	out := &processLog{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = managerProcAttr()
	Expect(cmd.Start()).To(Succeed())
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	DeferCleanup(func() {
		_ = cmd.Process.Kill()
		Eventually(waited).WithTimeout(time.Minute).Should(Receive())
	})
	served := regexp.MustCompile(`Starting to serve on (127\.0\.0\.1:\d+)`)
	Eventually(out.String).WithTimeout(30*time.Second).Should(MatchRegexp(served.String()), "kubectl proxy did not start")
	return "http://" + served.FindStringSubmatch(out.String())[1]
}
