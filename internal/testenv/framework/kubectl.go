/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package framework

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// Kubectl is kubectl with a kubeconfig.
type Kubectl struct {
	// Bin is the kubectl binary (empty: "kubectl" on the PATH).
	Bin        string
	Kubeconfig string
	// Dir is the working directory (empty: the test's), for relative
	// paths in -f.
	Dir string
}

func (k Kubectl) bin() string {
	if k.Bin == "" {
		return "kubectl"
	}
	return k.Bin
}

// Run runs kubectl with args and returns its stdout.
func (k Kubectl) Run(ctx context.Context, args ...string) (string, error) {
	return Run(ctx, k.Dir, nil, k.bin(), append([]string{"--kubeconfig", k.Kubeconfig}, args...)...)
}

// Must runs kubectl with args, fails the spec if it fails, and returns its
// stdout trimmed.
func (k Kubectl) Must(ctx context.Context, args ...string) string {
	GinkgoHelper()
	out, err := k.Run(ctx, args...)
	Expect(err).NotTo(HaveOccurred())
	return strings.TrimSpace(out)
}

// Apply applies a manifest with kubectl apply -f -.
func (k Kubectl) Apply(ctx context.Context, manifest string) error {
	_, err := Run(ctx, k.Dir, strings.NewReader(manifest), k.bin(), "--kubeconfig", k.Kubeconfig, "apply", "-f", "-")
	return err
}

// WaitSandboxesReady waits with kubectl wait until every named Sandbox in
// ns (empty: the kubeconfig's namespace) is Ready, and otherwise fails the
// spec with describe's report (nil: DescribeSandbox of the first).
func (k Kubectl) WaitSandboxesReady(ctx context.Context, ns string, timeout time.Duration, describe func() string, names ...string) {
	GinkgoHelper()
	args := []string{"wait", "--for=condition=Ready", fmt.Sprintf("--timeout=%ds", int(timeout.Seconds()))}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	for _, n := range names {
		args = append(args, "sandbox/"+n)
	}
	if describe == nil {
		describe = func() string { return k.DescribeSandbox(ctx, ns, names[0]) }
	}
	_, err := k.Run(ctx, args...)
	Expect(err).NotTo(HaveOccurred(), func() string { return "a Sandbox did not become Ready:\n" + describe() })
}

// DescribeSandbox gathers what a user looks at when a Sandbox misbehaves:
// the object, its events, and the output of each command in more. Failures
// to gather it are part of the report, not a second failure.
func (k Kubectl) DescribeSandbox(ctx context.Context, ns, name string, more ...[]string) string {
	inNS := func(args ...string) []string {
		if ns == "" {
			return args
		}
		return append(args, "-n", ns)
	}
	var b strings.Builder
	for _, args := range append([][]string{
		inNS("get", "sandbox/"+name, "-o", "yaml"),
		inNS("get", "events", "--field-selector", "involvedObject.name="+name),
	}, more...) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		out, err := k.Run(ctx, args...)
		cancel()
		fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}

// WarmPoolManifest is a SandboxWarmPool of replicas members of image,
// never pulled (the suites' images are loaded, not in a registry).
func WarmPoolManifest(name, ns, image string, replicas int) string {
	return fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: SandboxWarmPool
metadata:
  name: %s
  namespace: %s
spec:
  replicas: %d
  template:
    image: %s
    imagePullPolicy: Never
`, name, ns, replicas, image)
}

// ClaimManifest is a Sandbox that claims a member of warm pool pool, with
// TASK_ID=taskID in its env and an activeDeadlineSeconds of deadline.
func ClaimManifest(name, ns, pool, taskID string, deadline int) string {
	return fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  warmPoolRef:
    name: %s
  env:
  - name: TASK_ID
    value: %q
  activeDeadlineSeconds: %d
`, name, ns, pool, taskID, deadline)
}
