/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// Plugin runs the kubectl plugin (kubectl-sandbox) as one user and returns
// its outputs and exit status; a plugin that cannot run at all fails the
// spec.
type Plugin func(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int)

// PluginFor is the plugin at bin with kubeconfig, in namespace ns (empty:
// the kubeconfig's), bounded to two minutes a run.
func PluginFor(bin, kubeconfig, ns string) Plugin {
	return func(ctx context.Context, stdin string, args ...string) (string, string, int) {
		GinkgoHelper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		pre := []string{"--kubeconfig", kubeconfig}
		if ns != "" {
			pre = append(pre, "-n", ns)
		}
		fmt.Fprintf(GinkgoWriter, "$ %s %s\n", bin, strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, bin, append(pre, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.WaitDelay = 5 * time.Second
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var exitErr *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exitErr):
			code = exitErr.ExitCode()
		default:
			Fail(fmt.Sprintf("running kubectl-sandbox %v: %v", args, err))
		}
		return out.String(), errOut.String(), code
	}
}

// ExecScenario runs commands in Sandbox box with `kubectl sandbox exec`:
// stdout and stderr reach the caller apart, the command's exit status is
// the plugin's, and -i passes stdin through.
func ExecScenario(ctx context.Context, p Plugin, box string) {
	GinkgoHelper()
	stdout, stderr, code := p(ctx, "", "exec", box, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	Expect(code).To(Equal(7), stderr)
	Expect(stdout).To(Equal("out\n"))
	Expect(stderr).To(Equal("err\n"))

	stdout, stderr, code = p(ctx, "print(6*7)\n", "exec", box, "-i", "--", "python3", "-")
	Expect(code).To(BeZero(), stderr)
	Expect(stdout).To(Equal("42\n"))

	stdout, stderr, code = p(ctx, "from stdin\n", "exec", "-i", box, "--", "cat")
	Expect(code).To(BeZero(), stderr)
	Expect(stdout).To(Equal("from stdin\n"))
}

// CopyFileScenario copies a file (named name, made in dir) into Sandbox box
// of namespace ns with `kubectl sandbox cp`, reads it there (its mode kept),
// and copies it back out with the namespace/box:path form.
func CopyFileScenario(ctx context.Context, p Plugin, ns, box, dir, name string) {
	GinkgoHelper()
	src := filepath.Join(dir, name)
	Expect(os.WriteFile(src, []byte("a note\n"), 0o640)).To(Succeed())
	Expect(os.Chmod(src, 0o640)).To(Succeed()) // whatever the umask
	_, stderr, code := p(ctx, "", "cp", src, box+":/tmp/")
	Expect(code).To(BeZero(), stderr)
	stdout, stderr, code := p(ctx, "", "exec", box, "--shell", "stat -c %a /tmp/"+name+" && cat /tmp/"+name)
	Expect(code).To(BeZero(), stderr)
	Expect(stdout).To(Equal("640\na note\n"))

	back := filepath.Join(dir, name+".back")
	_, stderr, code = p(ctx, "", "cp", ns+"/"+box+":/tmp/"+name, back)
	Expect(code).To(BeZero(), stderr)
	Expect(os.ReadFile(back)).To(Equal([]byte("a note\n")))
}

// Docker runs the docker CLI against the Engine that runs a suite's
// sandboxes and returns its stdout.
type Docker func(ctx context.Context, args ...string) (string, error)

// DeleteScenario deletes Sandbox ns/name (whose UID is uid) with kubectl
// delete --wait and expects it gone, and its container with it: the
// manager releases the finalizer only once the container is removed, so
// there is nothing to wait for.
func DeleteScenario(ctx context.Context, k Kubectl, docker Docker, ns, name, uid string) {
	GinkgoHelper()
	_, err := k.Run(ctx, "delete", "sandbox/"+name, "-n", ns, "--wait", "--timeout=90s")
	Expect(err).NotTo(HaveOccurred(), func() string { return "deleting the Sandbox failed:\n" + k.DescribeSandbox(ctx, ns, name) })
	ExpectSandboxGone(ctx, k, docker, ns, name, uid)
}

// ExpectSandboxGone expects Sandbox ns/name (ns empty: the kubeconfig's
// namespace) to be gone, and every container (running or not) of its UID.
func ExpectSandboxGone(ctx context.Context, k Kubectl, docker Docker, ns, name, uid string) {
	GinkgoHelper()
	get := []string{"get", "sandbox/" + name}
	if ns != "" {
		get = append(get, "-n", ns)
	}
	_, err := k.Run(ctx, get...)
	Expect(err).To(MatchError(ContainSubstring("NotFound")))
	out, err := docker(ctx, "ps", "-a", "--filter", "label="+UIDLabel+"="+uid, "--format", "{{.ID}} {{.Status}}")
	Expect(err).NotTo(HaveOccurred())
	Expect(strings.TrimSpace(out)).To(BeEmpty(), "the Sandbox's container is still there")
}
