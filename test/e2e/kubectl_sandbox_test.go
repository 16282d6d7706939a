//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
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

// The kubectl plugin, built from the tree, against a manager that serves the
// node API, driven as a user would: `kubectl-sandbox --kubeconfig … exec`.
var _ = Describe("kubectl sandbox", Ordered, func() {
	const (
		// pluginNode has a manager of its own: the suite's manager
		// advertises its node name, which does not resolve here, and trusts
		// no client CA, while the kubeconfig's user is a client certificate.
		pluginNode = "e2e-plugin-node"
		namespace  = "kubectl-sandbox-e2e"
		box        = "box"
	)
	var (
		plugin string
		agent  *managerProcess
	)

	BeforeAll(func(ctx SpecContext) {
		By("building kubectl-sandbox")
		plugin = filepath.Join(repoRoot, "bin", "kubectl-sandbox")
		_, err := run(ctx, repoRoot, "go", "build", "-o", plugin, "./cmd/kubectl-sandbox")
		Expect(err).NotTo(HaveOccurred())

		Expect(removeContainersOf(ctx, pluginNode)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(removeContainersOf(ctx, pluginNode)).To(Succeed())
		}, NodeTimeout(time.Minute))

		By("starting a manager that serves the node API on loopback")
		stateDir := filepath.Join(workDir, "plugin-node-state")
		agent, err = startLoopbackNode(pluginNode, stateDir)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() error { return agent.stop(15 * time.Second) })

		_, err = kubectl(ctx, "create", "namespace", namespace)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			wait := "--wait=" + fmt.Sprint(agent.exitErr() == nil)
			_, _ = kubectl(ctx, "delete", "namespace", namespace, "--ignore-not-found", wait, "--timeout=60s")
		}, NodeTimeout(90*time.Second))

		manifest := fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  image: %s
  nodeName: %s
`, box, namespace, sampleImage, pluginNode)
		_, err = runWithStdin(ctx, repoRoot, strings.NewReader(manifest), "kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		_, err = kubectl(ctx, "wait", "-n", namespace, "--for=condition=Ready", "sandbox/"+box, "--timeout=90s")
		Expect(err).NotTo(HaveOccurred(), "the Sandbox did not become Ready")
		Eventually(func() (string, error) {
			return kubectl(ctx, "get", "-n", namespace, "sandbox/"+box, "-o", "jsonpath={.status.agentEndpoint}")
		}, 30*time.Second, 250*time.Millisecond).Should(HavePrefix("https://127.0.0.1:"))
	}, NodeTimeout(5*time.Minute))

	JustBeforeEach(func() {
		Expect(agent.exitErr()).NotTo(HaveOccurred(), "the plugin node's manager exited")
	})

	// sandbox runs the plugin and returns its outputs and exit code.
	sandbox := func(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
		GinkgoHelper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, plugin, append([]string{"--kubeconfig", kubeconfig, "-n", namespace}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		cmd.WaitDelay = 5 * time.Second
		err := cmd.Run()
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

	It("runs a command and exits with its exit code", func(ctx SpecContext) {
		stdout, stderr, code := sandbox(ctx, "", "exec", box, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		Expect(code).To(Equal(7))
		Expect(stdout).To(Equal("out\n"))
		Expect(stderr).To(Equal("err\n"))

		stdout, stderr, code = sandbox(ctx, "print(6*7)\n", "exec", box, "-i", "--", "python3", "-")
		Expect(code).To(BeZero(), stderr)
		Expect(stdout).To(Equal("42\n"))
	}, NodeTimeout(3*time.Minute))

	It("exits 124 when the command times out", func(ctx SpecContext) {
		_, stderr, code := sandbox(ctx, "", "exec", box, "--timeout=1s", "--", "sleep", "30")
		Expect(code).To(Equal(124))
		Expect(stderr).To(ContainSubstring("timed out"))
	}, NodeTimeout(2*time.Minute))

	It("copies a directory in and back out byte for byte", func(ctx SpecContext) {
		src := filepath.Join(workDir, "cp-src")
		Expect(os.MkdirAll(filepath.Join(src, "sub"), 0o755)).To(Succeed())
		payload := make([]byte, 1<<20+3)
		_, _ = rand.Read(payload)
		Expect(os.WriteFile(filepath.Join(src, "sub", "payload.bin"), payload, 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "main.py"), []byte("print('from main')\n"), 0o644)).To(Succeed())

		_, stderr, code := sandbox(ctx, "", "cp", src, box+":/app/project")
		Expect(code).To(BeZero(), stderr)
		stdout, stderr, code := sandbox(ctx, "", "exec", box, "-w", "/app/project", "--", "python3", "main.py")
		Expect(code).To(BeZero(), stderr)
		Expect(stdout).To(Equal("from main\n"))

		dst := filepath.Join(workDir, "cp-dst")
		_, stderr, code = sandbox(ctx, "", "cp", namespace+"/"+box+":/app/project", dst)
		Expect(code).To(BeZero(), stderr)
		got, err := os.ReadFile(filepath.Join(dst, "sub", "payload.bin"))
		Expect(err).NotTo(HaveOccurred())
		Expect(bytes.Equal(got, payload)).To(BeTrue(), "the payload changed on the round trip")
		Expect(filepath.Join(dst, "main.py")).To(BeARegularFile())
	}, NodeTimeout(3*time.Minute))

	It("copies a single file in and out", func(ctx SpecContext) {
		src := filepath.Join(workDir, "note.txt")
		Expect(os.WriteFile(src, []byte("a note\n"), 0o640)).To(Succeed())
		_, stderr, code := sandbox(ctx, "", "cp", src, box+":/tmp/")
		Expect(code).To(BeZero(), stderr)
		stdout, _, code := sandbox(ctx, "", "exec", box, "--shell", "stat -c %a /tmp/note.txt && cat /tmp/note.txt")
		Expect(code).To(BeZero())
		Expect(stdout).To(Equal("640\na note\n"))

		out := filepath.Join(workDir, "note-back.txt")
		_, stderr, code = sandbox(ctx, "", "cp", box+":/tmp/note.txt", out)
		Expect(code).To(BeZero(), stderr)
		Expect(os.ReadFile(out)).To(Equal([]byte("a note\n")))
	}, NodeTimeout(3*time.Minute))

	It("shows the commands run with logs --history", func(ctx SpecContext) {
		_, _, code := sandbox(ctx, "", "exec", box, "--", "sh", "-c", "exit 5")
		Expect(code).To(Equal(5))
		stdout, stderr, code := sandbox(ctx, "", "logs", box, "--history", "--tail=1")
		Expect(code).To(BeZero(), stderr)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		Expect(lines).To(HaveLen(1))
		Expect(lines[0]).To(MatchRegexp(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ exit=5 \S+ sh -c 'exit 5'$`))
	}, NodeTimeout(2*time.Minute))

	It("fails like kubectl for a Sandbox that does not exist", func(ctx SpecContext) {
		_, stderr, code := sandbox(ctx, "", "exec", "nope", "--", "true")
		Expect(code).To(Equal(1))
		Expect(stderr).To(HavePrefix("error: sandbox " + namespace + "/nope: "))
		Expect(stderr).To(ContainSubstring("not found"))
	}, NodeTimeout(time.Minute))
})
