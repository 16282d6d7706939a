//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
)

// The kubectl plugin, built from the tree, driven as a user would:
// `kubectl-sandbox --kubeconfig … exec`. It talks only to kube-apiserver
// (the sandboxes/exec, files, log and history subresources of the
// operator's aggregated API), which authenticates the user with whatever
// the kubeconfig holds, and the operator's aggregated API server reaches
// the node API over mutual TLS. The same specs run for a ServiceAccount
// token, a client certificate, an exec credential plugin and kubectl proxy,
// each user holding only the shipped exec role in the namespace. (A token
// could not reach a node API by itself: see "the node API, connected to
// directly" below.)
var _ = Describe("kubectl sandbox through the API server", Ordered, func() {
	const (
		// pluginNode has a manager of its own, started like every node's
		// (system_test.go), so that the specs can find its node API.
		pluginNode = "e2e-plugin-node"
		namespace  = "kubectl-sandbox-e2e"
		box        = "box"
		// What box's own command prints to the container's output.
		boxGreeting = "box is up"
	)
	var (
		agent *managerProcess
		// kubeconfigs by credential: "token", "certificate",
		// "exec-plugin" (the token, from a credential plugin),
		// "kubectl-proxy" (a kubectl proxy with the token), and
		// "no-rights" (a token whose user has no role in the namespace).
		kubeconfigs = map[string]string{}
		// endpoint is status.nodeAPIEndpoint of box.
		endpoint string
		// token is the "token" user's bearer token.
		token string
	)

	BeforeAll(func(ctx SpecContext) {
		Expect(removeContainersOf(ctx, pluginNode)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(removeContainersOf(ctx, pluginNode)).To(Succeed())
		}, NodeTimeout(time.Minute))

		By("starting a manager for " + pluginNode)
		var err error
		agent, err = startLoopbackNode(pluginNode, filepath.Join(workDir, "plugin-node-state"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() error { return agent.stop(15 * time.Second) })

		_, err = kubectl(ctx, "create", "namespace", namespace)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			// No wait: envtest runs no namespace controller. The Sandbox
			// goes first, while its manager still runs.
			_, _ = kubectl(ctx, "delete", "sandbox", box, "-n", namespace, "--ignore-not-found", "--wait="+fmt.Sprint(agent.exitErr() == nil), "--timeout=60s")
			_, _ = kubectl(ctx, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
		}, NodeTimeout(90*time.Second))

		manifest := fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  image: %s
  nodeName: %s
  command: ["sh", "-c", "echo %s; exec sleep 86400"]
`, box, namespace, sampleImage, pluginNode, boxGreeting)
		_, err = runWithStdin(ctx, repoRoot, strings.NewReader(manifest), "kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		kube().WaitSandboxesReady(ctx, namespace, 90*time.Second, nil, box)
		endpoint, err = kubectl(ctx, "get", "-n", namespace, "sandbox/"+box, "-o", "jsonpath={.status.nodeAPIEndpoint}")
		Expect(err).NotTo(HaveOccurred())
		Expect(endpoint).To(HavePrefix("https://127.0.0.1:"))

		By("giving a ServiceAccount and a certificate user the shipped exec role, and another ServiceAccount nothing")
		for _, sa := range []string{"plugin-user", "no-rights"} {
			_, err = kubectl(ctx, "create", "serviceaccount", sa, "-n", namespace)
			Expect(err).NotTo(HaveOccurred())
		}
		_, err = kubectl(ctx, "create", "rolebinding", "plugin-user-exec", "-n", namespace,
			"--clusterrole="+execRole, "--serviceaccount="+namespace+":plugin-user")
		Expect(err).NotTo(HaveOccurred())
		const certUser = "e2e-plugin-cert-user"
		_, err = kubectl(ctx, "create", "rolebinding", "cert-user-exec", "-n", namespace,
			"--clusterrole="+execRole, "--user="+certUser)
		Expect(err).NotTo(HaveOccurred())

		out, err := kubectl(ctx, "create", "token", "plugin-user", "-n", namespace, "--duration=1h")
		Expect(err).NotTo(HaveOccurred())
		token = strings.TrimSpace(out)
		kubeconfigs["token"], err = tokenKubeconfig("plugin-user", token)
		Expect(err).NotTo(HaveOccurred())
		kubeconfigs["certificate"], err = certKubeconfig(certUser)
		Expect(err).NotTo(HaveOccurred())
		kubeconfigs["exec-plugin"], err = execPluginKubeconfig("plugin-user-exec-plugin", token)
		Expect(err).NotTo(HaveOccurred())
		proxy := startKubectlProxy(kubeconfigs["token"])
		kubeconfigs["kubectl-proxy"], err = writeKubeconfigFor("plugin-user-proxy", map[string]any{"server": proxy}, map[string]any{})
		Expect(err).NotTo(HaveOccurred())
		out, err = kubectl(ctx, "create", "token", "no-rights", "-n", namespace, "--duration=1h")
		Expect(err).NotTo(HaveOccurred())
		kubeconfigs["no-rights"], err = tokenKubeconfig("no-rights", strings.TrimSpace(out))
		Expect(err).NotTo(HaveOccurred())
	}, NodeTimeout(5*time.Minute))

	JustBeforeEach(func() {
		Expect(agent.exitErr()).NotTo(HaveOccurred(), "the plugin node's manager exited")
	})

	// command is the plugin run as credential's user.
	command := func(ctx context.Context, credential, stdin string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, pluginBin, append([]string{"--kubeconfig", kubeconfigs[credential], "-n", namespace}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
	// sandbox runs the plugin and returns its outputs and exit code.
	sandbox := func(ctx context.Context, credential, stdin string, args ...string) (stdout, stderr string, code int) {
		GinkgoHelper()
		return framework.PluginFor(pluginBin, kubeconfigs[credential], namespace)(ctx, stdin, args...)
	}

	for _, cred := range []struct{ what, key string }{
		{"a ServiceAccount token", "token"},
		{"a client certificate", "certificate"},
		{"a token from an exec credential plugin", "exec-plugin"},
		{"kubectl proxy (the token's) and no credential of its own", "kubectl-proxy"},
	} {
		Context("with "+cred.what+" in the kubeconfig", func() {
			It("runs a command and exits with its exit code", func(ctx SpecContext) {
				framework.ExecScenario(ctx, framework.PluginFor(pluginBin, kubeconfigs[cred.key], namespace), box)
			}, NodeTimeout(3*time.Minute))

			It("streams the output while the command runs", func(ctx SpecContext) {
				// The command sleeps between its lines: a first line that
				// arrived with the end of the command would come less than
				// the sleep before the second.
				const sleep = 3 * time.Second
				cmd := command(ctx, cred.key, "", "exec", box, "--", "sh", "-c", fmt.Sprintf("echo first; sleep %d; echo second", int(sleep/time.Second)))
				stdout, err := cmd.StdoutPipe()
				Expect(err).NotTo(HaveOccurred())
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				started := time.Now()
				Expect(cmd.Start()).To(Succeed())
				lines := bufio.NewReader(stdout)
				first, err := lines.ReadString('\n')
				Expect(err).NotTo(HaveOccurred(), stderr.String())
				Expect(first).To(Equal("first\n"))
				firstAt := time.Since(started)
				rest, err := io.ReadAll(lines)
				Expect(err).NotTo(HaveOccurred())
				Expect(string(rest)).To(Equal("second\n"))
				Expect(cmd.Wait()).To(Succeed(), stderr.String())
				endAt := time.Since(started)
				Expect(endAt).To(BeNumerically(">=", sleep))
				Expect(endAt-firstAt).To(BeNumerically(">=", sleep*2/3),
					"the first line arrived only %v before the end of a command that sleeps %v after it", endAt-firstAt, sleep)
			}, NodeTimeout(2*time.Minute))

			It("exits 124 when the command times out", func(ctx SpecContext) {
				_, stderr, code := sandbox(ctx, cred.key, "", "exec", box, "--timeout=1s", "--", "sleep", "30")
				Expect(code).To(Equal(124))
				Expect(stderr).To(ContainSubstring("timed out"))
			}, NodeTimeout(2*time.Minute))

			It("copies a directory in and back out byte for byte", func(ctx SpecContext) {
				src := filepath.Join(workDir, cred.key+"-cp-src")
				Expect(os.MkdirAll(filepath.Join(src, "sub"), 0o755)).To(Succeed())
				payload := make([]byte, 1<<20+3)
				_, _ = rand.Read(payload)
				Expect(os.WriteFile(filepath.Join(src, "sub", "payload.bin"), payload, 0o644)).To(Succeed())
				Expect(os.WriteFile(filepath.Join(src, "main.py"), []byte("print('from main')\n"), 0o644)).To(Succeed())

				remote := "/app/" + cred.key
				_, stderr, code := sandbox(ctx, cred.key, "", "cp", src, box+":"+remote)
				Expect(code).To(BeZero(), stderr)
				stdout, stderr, code := sandbox(ctx, cred.key, "", "exec", box, "-w", remote, "--", "python3", "main.py")
				Expect(code).To(BeZero(), stderr)
				Expect(stdout).To(Equal("from main\n"))

				// A trailing / asks for a directory; dst does not exist, so
				// the directory lands as dst.
				dst := filepath.Join(workDir, cred.key+"-cp-dst")
				_, stderr, code = sandbox(ctx, cred.key, "", "cp", namespace+"/"+box+":"+remote+"/", dst)
				Expect(code).To(BeZero(), stderr)
				got, err := os.ReadFile(filepath.Join(dst, "sub", "payload.bin"))
				Expect(err).NotTo(HaveOccurred())
				Expect(bytes.Equal(got, payload)).To(BeTrue(), "the payload changed on the round trip")
				Expect(filepath.Join(dst, "main.py")).To(BeARegularFile())
			}, NodeTimeout(3*time.Minute))

			It("copies a single file in and out", func(ctx SpecContext) {
				framework.CopyFileScenario(ctx, framework.PluginFor(pluginBin, kubeconfigs[cred.key], namespace), namespace, box, workDir, cred.key+"-note.txt")
			}, NodeTimeout(3*time.Minute))

			It("shows the container's output with logs, and the commands run with logs --history", func(ctx SpecContext) {
				stdout, stderr, code := sandbox(ctx, cred.key, "", "logs", box)
				Expect(code).To(BeZero(), stderr)
				Expect(stdout).To(Equal(boxGreeting + "\n"))

				_, _, code = sandbox(ctx, cred.key, "", "exec", box, "--", "sh", "-c", "exit 5")
				Expect(code).To(Equal(5))
				stdout, stderr, code = sandbox(ctx, cred.key, "", "logs", box, "--history", "--tail=1")
				Expect(code).To(BeZero(), stderr)
				lines := strings.Split(strings.TrimSpace(stdout), "\n")
				Expect(lines).To(HaveLen(1))
				Expect(lines[0]).To(MatchRegexp(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ exit=5 \S+ sh -c 'exit 5'$`))
			}, NodeTimeout(2*time.Minute))
		})
	}

	It("runs a detached process: exec --detach prints a handle, ps lists it, attach follows it to its exit code, kill ends another's tree", func(ctx SpecContext) {
		handle, stderr, code := sandbox(ctx, "token", "", "exec", box, "--detach", "--shell", "echo one; sleep 2; echo two >&2; exit 5")
		Expect(code).To(BeZero(), stderr)
		handle = strings.TrimSpace(handle)
		Expect(handle).To(HavePrefix("p-"))
		stdout, stderr, code := sandbox(ctx, "token", "", "ps", box)
		Expect(code).To(BeZero(), stderr)
		Expect(stdout).To(ContainSubstring(handle))
		stdout, stderr, code = sandbox(ctx, "token", "", "attach", box, handle)
		Expect(code).To(Equal(5), stderr)
		Expect(stdout).To(Equal("one\n"))
		Expect(stderr).To(Equal("two\n"))

		other, stderr, code := sandbox(ctx, "token", "", "exec", box, "-d", "--", "sh", "-c", "sleep 6001 & sleep 6002")
		Expect(code).To(BeZero(), stderr)
		stdout, stderr, code = sandbox(ctx, "token", "", "kill", box, strings.TrimSpace(other))
		Expect(code).To(BeZero(), stderr)
		Expect(stdout).To(ContainSubstring("exit code 137"))
		stdout, _, _ = sandbox(ctx, "token", "", "exec", box, "--shell", "ps -o args | grep '[s]leep 600' || true")
		Expect(stdout).To(BeEmpty(), "the tree survived kill")
		_, stderr, code = sandbox(ctx, "token", "", "attach", box, "../../etc")
		Expect(code).NotTo(BeZero())
		Expect(stderr).To(ContainSubstring("not a background process handle"))
	}, NodeTimeout(3*time.Minute))

	It("downloads only what was asked for: no planted tree, no overwrite, no exec bits", func(ctx SpecContext) {
		// The user's project, into which a report is downloaded.
		project := filepath.Join(workDir, "cp-project")
		Expect(os.MkdirAll(filepath.Join(project, ".git", "hooks"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(project, "Makefile"), []byte("mine\n"), 0o644)).To(Succeed())
		before := fstree.List(project)

		// Code in the sandbox turns /app/report.txt into a directory of
		// things that run on the host once merged into a project.
		_, stderr, code := sandbox(ctx, "token", "", "exec", box, "--shell",
			"rm -rf /app/report.txt && mkdir -p /app/report.txt/.git/hooks && printf '#!/bin/sh\\necho pwned\\n' > /app/report.txt/.git/hooks/pre-commit && chmod 755 /app/report.txt/.git/hooks/pre-commit && echo 'echo pwned' > /app/report.txt/.envrc && echo 'all:' > /app/report.txt/Makefile")
		Expect(code).To(BeZero(), stderr)
		for _, args := range [][]string{
			{"cp", box + ":/app/report.txt", project},
			{"cp", box + ":/app/report.txt", project + "/"},
			{"cp", "--overwrite", "--preserve-exec", box + ":report.txt", filepath.Join(project, "report.txt")},
		} {
			_, stderr, code = sandbox(ctx, "token", "", args...)
			Expect(code).To(Equal(1), "%v", args)
			Expect(stderr).To(ContainSubstring("report.txt is a directory in the sandbox, but a file was asked for"), "%v", args)
			Expect(fstree.List(project)).To(Equal(before), "%v", args)
		}

		// A file with every mode bit set lands without exec bits and
		// without group/world write unless asked; an existing file is
		// replaced only with --overwrite.
		_, stderr, code = sandbox(ctx, "token", "", "exec", box, "--shell", "echo tool > /app/tool.sh && chmod 777 /app/tool.sh")
		Expect(code).To(BeZero(), stderr)
		_, stderr, code = sandbox(ctx, "token", "", "cp", box+":/app/tool.sh", project)
		Expect(code).To(BeZero(), stderr)
		fi, err := os.Stat(filepath.Join(project, "tool.sh"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode().Perm()&0o133).To(BeZero(), "mode %v", fi.Mode())
		_, stderr, code = sandbox(ctx, "token", "", "cp", "--preserve-exec", box+":/app/tool.sh", project)
		Expect(code).To(Equal(1))
		Expect(stderr).To(ContainSubstring("exists"))
		_, stderr, code = sandbox(ctx, "token", "", "cp", "--preserve-exec", "--overwrite", box+":/app/tool.sh", project)
		Expect(code).To(BeZero(), stderr)
		fi, err = os.Stat(filepath.Join(project, "tool.sh"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode().Perm()&0o111).NotTo(BeZero(), "mode %v", fi.Mode())
		Expect(fi.Mode().Perm()&0o022).To(BeZero(), "mode %v", fi.Mode())

		// Asked for as a directory, the tree lands as a new directory.
		quarantine := filepath.Join(workDir, "cp-quarantine")
		_, stderr, code = sandbox(ctx, "token", "", "cp", box+":/app/report.txt/", quarantine)
		Expect(code).To(BeZero(), stderr)
		Expect(filepath.Join(quarantine, ".git", "hooks", "pre-commit")).To(BeARegularFile())
		Expect(filepath.Join(project, ".git", "hooks", "pre-commit")).NotTo(BeAnExistingFile())
	}, NodeTimeout(3*time.Minute))

	It("refuses a user without the exec role, with the API server's 403", func(ctx SpecContext) {
		for _, args := range [][]string{
			{"exec", box, "--", "true"},
			{"logs", box},
			{"cp", box + ":/etc/hostname", filepath.Join(workDir, "never")},
		} {
			_, stderr, code := sandbox(ctx, "no-rights", "", args...)
			Expect(code).To(Equal(1), "%v", args)
			Expect(stderr).To(ContainSubstring("system:serviceaccount:"+namespace+":no-rights"), "%v", args)
			Expect(strings.ToLower(stderr)).To(ContainSubstring("forbidden"), "%v", args)
		}
		Expect(filepath.Join(workDir, "never")).NotTo(BeAnExistingFile())
	}, NodeTimeout(2*time.Minute))

	It("forwards local connections to a port in the Sandbox (port-forward), through kube-apiserver and the aggregated API", func(ctx SpecContext) {
		_, stderr, code := sandbox(ctx, "token", "", "exec", box, "--", "sh", "-c",
			`mkdir -p /tmp/pf && echo forwarded-through-the-api-server > /tmp/pf/index.html && cd /tmp/pf && (nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) && python3 -c '
import socket, time
for i in range(100):
    try: socket.create_connection(("127.0.0.1", 8000)).close(); break
    except OSError: time.sleep(0.1)'`)
		Expect(code).To(BeZero(), stderr)

		for _, cred := range []string{"token", "kubectl-proxy"} {
			pctx, cancel := context.WithCancel(ctx)
			cmd := command(pctx, cred, "", "port-forward", box, ":8000")
			out, err := cmd.StdoutPipe()
			Expect(err).NotTo(HaveOccurred())
			var errOut bytes.Buffer
			cmd.Stderr = &errOut
			Expect(cmd.Start()).To(Succeed())
			line, err := bufio.NewReader(out).ReadString('\n')
			Expect(err).NotTo(HaveOccurred(), errOut.String())
			Expect(line).To(MatchRegexp(`^Forwarding from 127\.0\.0\.1:\d+ -> 8000\n$`))
			addr := strings.Fields(line)[2]
			for range 3 {
				resp, err := http.Get("http://" + addr + "/index.html")
				Expect(err).NotTo(HaveOccurred(), errOut.String())
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				Expect(resp.StatusCode).To(Equal(http.StatusOK), cred)
				Expect(string(body)).To(Equal("forwarded-through-the-api-server\n"), cred)
			}
			cancel()
			_ = cmd.Wait()
		}

		By("a closed port: the connection is closed and the plugin says why")
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cmd := command(pctx, "token", "", "port-forward", box, ":9")
		out, err := cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		var errOut syncBuf
		cmd.Stderr = &errOut
		Expect(cmd.Start()).To(Succeed())
		line, err := bufio.NewReader(out).ReadString('\n')
		Expect(err).NotTo(HaveOccurred())
		_, err = http.Get("http://" + strings.Fields(line)[2] + "/")
		Expect(err).To(HaveOccurred())
		Eventually(errOut.String).Should(ContainSubstring("port 9"))

		By("a user without the role: the API server's 403")
		cmd = command(pctx, "no-rights", "", "port-forward", box, ":8000")
		out, err = cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		var denied syncBuf
		cmd.Stderr = &denied
		Expect(cmd.Start()).To(Succeed())
		line, err = bufio.NewReader(out).ReadString('\n')
		Expect(err).NotTo(HaveOccurred())
		_, err = http.Get("http://" + strings.Fields(line)[2] + "/")
		Expect(err).To(HaveOccurred())
		Eventually(denied.String).Should(ContainSubstring("forbidden"))
		Expect(denied.String()).To(ContainSubstring("sandboxes/portforward"))
	}, NodeTimeout(3*time.Minute))

	It("fails like kubectl for a Sandbox that does not exist", func(ctx SpecContext) {
		_, stderr, code := sandbox(ctx, "token", "", "exec", "nope", "--", "true")
		Expect(code).To(Equal(1))
		Expect(stderr).To(HavePrefix("error: sandbox " + namespace + "/nope"))
		Expect(stderr).To(ContainSubstring("not found"))
	}, NodeTimeout(time.Minute))

	// The node API itself serves only the operator's aggregated API server:
	// mutual TLS with a client certificate from the operator CA. Nothing a
	// user holds gets a request through, not even as far as HTTP.
	Describe("the node API, connected to directly", func() {
		// get sends GET log to the node API with the TLS settings given
		// and, if token is set, a bearer token; it returns the response or
		// the error. The node's certificate is not checked: only the
		// server's verdict on the client matters here.
		get := func(ctx context.Context, tlsConfig *tls.Config, token string) (*http.Response, error) {
			tlsConfig.InsecureSkipVerify = true //nolint:gosec // see above
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}, Timeout: 30 * time.Second}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/v1/namespaces/"+namespace+"/sandboxes/"+box+"/log", nil)
			Expect(err).NotTo(HaveOccurred())
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := hc.Do(req)
			if resp != nil {
				resp.Body.Close()
			}
			return resp, err
		}

		It("fails the TLS handshake of a client without a certificate", func(ctx SpecContext) {
			// TLS 1.2 decides before the client's handshake ends (the server
			// logs "client didn't provide a certificate").
			conn, err := tls.Dial("tcp", strings.TrimPrefix(endpoint, "https://"), &tls.Config{
				InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, //nolint:gosec // see get
			})
			if err == nil {
				conn.Close()
			}
			Expect(err).To(MatchError(ContainSubstring("remote error: tls: handshake failure")))

			// TLS 1.3 sends the verdict right after the client's
			// Finished: the request never gets a response.
			resp, err := get(ctx, &tls.Config{MinVersion: tls.VersionTLS13}, "")
			Expect(resp).To(BeNil())
			Expect(err).To(MatchError(ContainSubstring("certificate required")))
		}, NodeTimeout(time.Minute))

		It("refuses a bearer token the API server accepts, before any HTTP", func(ctx SpecContext) {
			resp, err := get(ctx, &tls.Config{}, token)
			Expect(resp).To(BeNil())
			Expect(err).To(MatchError(ContainSubstring("certificate required")))
		}, NodeTimeout(time.Minute))

		It("refuses a client certificate the API server accepts (its cluster admin's)", func(ctx SpecContext) {
			pair, err := tls.X509KeyPair(adminConfig.CertData, adminConfig.KeyData)
			Expect(err).NotTo(HaveOccurred())
			resp, err := get(ctx, &tls.Config{Certificates: []tls.Certificate{pair}}, "")
			Expect(resp).To(BeNil())
			Expect(err).To(MatchError(ContainSubstring("bad certificate")))
		}, NodeTimeout(time.Minute))
	})
})

// syncBuf is a bytes.Buffer a process writes while a spec reads it.
type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
