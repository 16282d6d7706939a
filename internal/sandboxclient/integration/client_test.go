package integration_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

func newClient(c *rest.Config) *sandboxclient.Client {
	GinkgoHelper()
	cl, err := sandboxclient.New(c, sandboxclient.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cl.Close)
	return cl
}

// timedWriter records when the first byte arrived.
type timedWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	first time.Time
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() {
		w.first = time.Now()
	}
	return w.buf.Write(p)
}

func shell(line string) execio.Request { return execio.Request{Shell: line} }

// tree is a set of files and their contents, for round trips.
type tree map[string][]byte

func tarOfTree(t tree, dirs ...string) *bytes.Buffer {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirs {
		Expect(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})).To(Succeed())
	}
	for name, data := range t {
		Expect(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))})).To(Succeed())
		_, err := tw.Write(data)
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(tw.Close()).To(Succeed())
	return &buf
}

// readTree reads a download: regular files by name (below the top
// directory), with their modes.
func readTree(r io.Reader) (tree, map[string]int64) {
	GinkgoHelper()
	files, modes := tree{}, map[string]int64{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, modes
		}
		Expect(err).NotTo(HaveOccurred())
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		Expect(err).NotTo(HaveOccurred())
		files[hdr.Name] = data
		modes[hdr.Name] = hdr.Mode
	}
}

var _ = Describe("sandboxclient through the API server and the aggregated API", Ordered, Label("integration"), func() {
	var (
		ns    string
		sbx   *sandboxv1alpha1.Sandbox
		admin *sandboxclient.Client
		ctx   context.Context
	)

	BeforeAll(func() {
		ns = newNamespace()
		sbx = createSandbox(ns, "box")
		waitReady(sbx)
		// envtest's admin: a client certificate, which only the API server
		// sees.
		admin = newClient(cfg)
	})

	BeforeEach(func() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
		DeferCleanup(cancel)
	})

	Describe("Exec", func() {
		It("returns stdout, stderr and the exit code", func() {
			var stdout, stderr bytes.Buffer
			res, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), shell("echo out; echo err >&2; exit 3"), &stdout, &stderr)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(Equal(3))
			Expect(stdout.String()).To(Equal("out\n"))
			Expect(stderr.String()).To(Equal("err\n"))
		})

		It("streams output as the command produces it", func() {
			out := &timedWriter{}
			start := time.Now()
			res, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), shell("echo first; sleep 2; echo second"), out, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(BeZero())
			Expect(out.buf.String()).To(Equal("first\nsecond\n"))
			end := time.Now()
			Expect(end.Sub(start)).To(BeNumerically(">=", 2*time.Second))
			// Relative, not a wall-clock bound from the start (which a slow
			// machine stretches): the first line came most of the command's
			// 2 s sleep before the end, not with the rest at the end.
			Expect(end.Sub(out.first)).To(BeNumerically(">=", 1500*time.Millisecond), "the first line arrived only at the end")
		})

		It("passes argv, stdin, environment and working directory", func() {
			var stdout bytes.Buffer
			res, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), execio.Request{
				Command: []string{"sh", "-c", `printf '%s|%s|' "$GREETING" "$(pwd)"; cat`, "; rm -rf /"},
				Env:     []string{"GREETING=hi there"}, WorkingDir: "/tmp", Stdin: []byte("from stdin"),
			}, &stdout, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(BeZero())
			Expect(stdout.String()).To(Equal("hi there|/tmp|from stdin"))
		})

		It("reports a timeout", func() {
			start := time.Now()
			_, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(err).NotTo(HaveOccurred())
			baseline := time.Since(start)
			res, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), execio.Request{Command: []string{"sleep", "30"}, TimeoutSeconds: 1}, nil, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.TimedOut).To(BeTrue())
			// Relative to a trivial exec just measured: the 1 s timeout plus
			// ten of those (at least 2 s), capped well under the 30 s sleep
			// that a command not killed at its timeout runs.
			Expect(res.Duration()).To(BeNumerically("<", min(time.Second+max(2*time.Second, 10*baseline), 20*time.Second)))
		})

		It("reports truncated output", func() {
			var stdout bytes.Buffer
			res, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), execio.Request{Shell: "head -c 100000 /dev/zero", OutputLimitBytes: 1000}, &stdout, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.StdoutTruncated).To(BeTrue())
			Expect(res.StdoutBytes).To(BeEquivalentTo(100000))
			Expect(stdout.Len()).To(BeNumerically("<", 2000))
		})

		It("refuses an invalid request as a bad request naming the sandbox", func() {
			_, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), execio.Request{}, nil, nil)
			Expect(sandboxclient.IsBadRequest(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("sandbox " + ns + "/box"))
		})
	})

	Describe("file transfer", func() {
		It("round-trips a tree byte for byte", func() {
			big := make([]byte, 3<<20+17)
			_, _ = rand.Read(big)
			files := tree{
				"big.bin":        big,
				"empty":          {},
				"sub/deep/a.txt": []byte("A\x00B\r\n"),
				"sub/b.txt":      []byte(strings.Repeat("b", 10000)),
			}
			stats, err := admin.Upload(ctx, sandboxclient.Named(ns, "box"), "/app/tree", tarOfTree(files, "sub", "sub/deep"))
			Expect(err).NotTo(HaveOccurred())
			Expect(stats.Files).To(Equal(4))
			Expect(stats.Bytes).To(BeEquivalentTo(len(big) + 1 + 4 + 10000))

			var archive bytes.Buffer
			Expect(admin.Download(ctx, sandboxclient.Named(ns, "box"), "/app/tree", &archive)).To(Succeed())
			got, _ := readTree(&archive)
			want := tree{}
			for name, data := range files {
				want["tree/"+name] = data
			}
			Expect(got).To(HaveLen(len(want)))
			for name, data := range want {
				Expect(got).To(HaveKey(name))
				Expect(bytes.Equal(got[name], data)).To(BeTrue(), "%s differs after the round trip", name)
			}
		})

		It("uploads a single file with its mode, creating parents, and downloads it", func() {
			_, err := admin.UploadFile(ctx, sandboxclient.Named(ns, "box"), "/tmp/bin/run.sh", 0o750, strings.NewReader("#!/bin/sh\necho ran\n"))
			Expect(err).NotTo(HaveOccurred())
			var stdout bytes.Buffer
			res, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), shell("stat -c %a /tmp/bin/run.sh && /tmp/bin/run.sh"), &stdout, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(BeZero())
			Expect(stdout.String()).To(Equal("750\nran\n"))

			var archive bytes.Buffer
			Expect(admin.Download(ctx, sandboxclient.Named(ns, "box"), "/tmp/bin/run.sh", &archive)).To(Succeed())
			got, modes := readTree(&archive)
			Expect(got).To(Equal(tree{"run.sh": []byte("#!/bin/sh\necho ran\n")}))
			Expect(modes["run.sh"]).To(BeEquivalentTo(0o750))
		})

		It("uploads relative to the working directory", func() {
			_, err := admin.UploadFile(ctx, sandboxclient.Named(ns, "box"), "rel.txt", 0o644, strings.NewReader("relative"))
			Expect(err).NotTo(HaveOccurred())
			var stdout bytes.Buffer
			_, err = admin.Exec(ctx, sandboxclient.Named(ns, "box"), shell("cat /app/rel.txt"), &stdout, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout.String()).To(Equal("relative"))
		})

		It("reports a missing path as not found", func() {
			err := admin.Download(ctx, sandboxclient.Named(ns, "box"), "/app/does-not-exist", io.Discard)
			Expect(sandboxclient.IsNotFound(err)).To(BeTrue(), "%v", err)
			Expect(sandboxclient.IsPathNotFound(err)).To(BeTrue(), "%+v", sandboxclient.StatusOf(err))
		})

		It("refuses paths outside the sandbox's writable roots", func() {
			_, err := admin.UploadFile(ctx, sandboxclient.Named(ns, "box"), "/etc/passwd", 0o644, strings.NewReader("x"))
			Expect(sandboxclient.IsBadRequest(err)).To(BeTrue(), "%v", err)
		})
	})

	Describe("logs and history", func() {
		It("reads the container's output", func() {
			logged := createSandbox(ns, "logged", func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Command = []string{"sh", "-c", "echo line-1; echo line-2; exec sleep 3600"}
			})
			waitReady(logged)
			Eventually(func() string {
				var out bytes.Buffer
				_ = admin.Logs(ctx, sandboxclient.Named(ns, "logged"), sandboxclient.LogOptions{}, &out)
				return out.String()
			}, 10*time.Second).Should(Equal("line-1\nline-2\n"))
			var out bytes.Buffer
			Expect(admin.Logs(ctx, sandboxclient.Named(ns, "logged"), sandboxclient.LogOptions{Tail: 1}, &out)).To(Succeed())
			Expect(out.String()).To(Equal("line-2\n"))
		})

		It("lists the commands run, and follows new ones", func() {
			_, err := admin.Exec(ctx, sandboxclient.Named(ns, "box"), execio.Request{Command: []string{"sh", "-c", "exit 7"}}, nil, nil)
			Expect(err).NotTo(HaveOccurred())
			var recs []history.Record
			Expect(admin.History(ctx, sandboxclient.Named(ns, "box"), sandboxclient.LogOptions{Tail: 1}, func(r history.Record) error {
				recs = append(recs, r)
				return nil
			})).To(Succeed())
			Expect(recs).To(HaveLen(1))
			Expect(recs[0].Command).To(Equal([]string{"sh", "-c", "exit 7"}))
			Expect(recs[0].ExitCode).To(Equal(7))

			fctx, cancel := context.WithCancel(ctx)
			defer cancel()
			followed := make(chan history.Record, 10)
			done := make(chan error, 1)
			go func() {
				done <- admin.History(fctx, sandboxclient.Named(ns, "box"), sandboxclient.LogOptions{Tail: 1, Follow: true}, func(r history.Record) error {
					followed <- r
					return nil
				})
			}()
			Eventually(followed, 10*time.Second).Should(Receive(HaveField("ExitCode", 7)))
			_, err = admin.Exec(ctx, sandboxclient.Named(ns, "box"), shell("echo followed"), nil, nil)
			Expect(err).NotTo(HaveOccurred())
			Eventually(followed, 10*time.Second).Should(Receive(HaveField("Shell", "echo followed")))
			cancel()
			Eventually(done, 10*time.Second).Should(Receive(MatchError(context.Canceled)))
		})
	})

	Describe("credentials", func() {
		It("works with a ServiceAccount token bound to the exec ClusterRole", func() {
			runner := serviceAccountConfig(ns, "runner")
			bind(ns, execRole, saSubject(ns, "runner"))
			var stdout bytes.Buffer
			Eventually(func() error {
				stdout.Reset()
				_, err := newClient(runner).Exec(ctx, sandboxclient.Named(ns, "box"), shell("echo as-runner"), &stdout, nil)
				return err
			}, 10*time.Second, 500*time.Millisecond).Should(Succeed())
			Expect(stdout.String()).To(Equal("as-runner\n"))

			var recs []history.Record
			Expect(admin.History(ctx, sandboxclient.Named(ns, "box"), sandboxclient.LogOptions{Tail: 1}, func(r history.Record) error {
				recs = append(recs, r)
				return nil
			})).To(Succeed())
			Expect(recs[0].Caller).To(Equal("system:serviceaccount:" + ns + ":runner"))
		})

		It("refuses a ServiceAccount without a binding, at the API server", func() {
			_, err := newClient(serviceAccountConfig(ns, "outsider")).Exec(ctx, sandboxclient.Named(ns, "box"), shell("true"), nil, nil)
			Expect(sandboxclient.IsForbidden(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("sandbox " + ns + "/box"))
		})

		It("refuses a ServiceAccount that may read Sandboxes but not exec, at the API server", func() {
			reader := serviceAccountConfig(ns, "reader")
			bind(ns, "sandbox-reader", saSubject(ns, "reader"))
			_, err := newClient(reader).Exec(ctx, sandboxclient.Named(ns, "box"), shell("true"), nil, nil)
			Expect(sandboxclient.IsForbidden(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(`"sandboxes/exec" in API group "subresources.sandbox.code-sandbox.dev"`))
		})

		It("checks RBAC on sandbox.code-sandbox.dev too, in the aggregated API server", func() {
			// Allowed by kube-apiserver's check of the aggregated group,
			// but not on the Sandbox's own group: the shipped roles grant
			// both, and the aggregated server insists on the second.
			cp.CreateClusterRole("aggregated-only-exec", rbacv1.PolicyRule{
				APIGroups: []string{"subresources.sandbox.code-sandbox.dev"}, Resources: []string{"sandboxes/exec"}, Verbs: []string{"create"}})
			half := serviceAccountConfig(ns, "half")
			bind(ns, "aggregated-only-exec", saSubject(ns, "half"))
			var err error
			Eventually(func() string {
				_, err = newClient(half).Exec(ctx, sandboxclient.Named(ns, "box"), shell("true"), nil, nil)
				if err == nil {
					return ""
				}
				return err.Error()
			}, 15*time.Second, 500*time.Millisecond).Should(ContainSubstring(`in API group "sandbox.code-sandbox.dev"`))
			Expect(sandboxclient.IsForbidden(err)).To(BeTrue(), "%v", err)
		})

		It("acts as the user named in rest.Config.Impersonate", func() {
			mcp := serviceAccountConfig(ns, "mcp-server")
			bindCluster("impersonator", saSubject(ns, "mcp-server"))
			bind(ns, execRole, userSubject("alice"))

			asAlice := rest.CopyConfig(mcp)
			asAlice.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"system:authenticated"}}
			Eventually(func() error {
				_, err := newClient(asAlice).Exec(ctx, sandboxclient.Named(ns, "box"), shell("echo as-alice"), nil, nil)
				return err
			}, 10*time.Second, 500*time.Millisecond).Should(Succeed())
			var recs []history.Record
			Expect(admin.History(ctx, sandboxclient.Named(ns, "box"), sandboxclient.LogOptions{Tail: 1}, func(r history.Record) error {
				recs = append(recs, r)
				return nil
			})).To(Succeed())
			Expect(recs[0].Caller).To(Equal("alice"))

			asMallory := rest.CopyConfig(mcp)
			asMallory.Impersonate = rest.ImpersonationConfig{UserName: "mallory"}
			_, err := newClient(asMallory).Exec(ctx, sandboxclient.Named(ns, "box"), shell("true"), nil, nil)
			Expect(sandboxclient.IsForbidden(err)).To(BeTrue(), "%v", err)
		})

		It("authenticates with a client certificate", func() {
			user, err := testEnv.AddUser(envtest.User{Name: "carol"}, cfg)
			Expect(err).NotTo(HaveOccurred())
			bind(ns, execRole, userSubject("carol"))
			var stdout bytes.Buffer
			Eventually(func() error {
				stdout.Reset()
				_, err := newClient(user.Config()).Exec(ctx, sandboxclient.Named(ns, "box"), shell("echo as-carol"), &stdout, nil)
				return err
			}, 10*time.Second, 500*time.Millisecond).Should(Succeed())
			Expect(stdout.String()).To(Equal("as-carol\n"))
		})
	})

	It("explains a Sandbox that is not Ready", func() {
		broken := createSandbox(ns, "broken", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = "code-sandbox-test/does-not-exist:1"
			s.Spec.ImagePullPolicy = sandboxv1alpha1.PullNever
		})
		Eventually(readyState(broken), 60*time.Second).Should(HavePrefix("False/ImageNotFound"))
		_, err := admin.Exec(ctx, sandboxclient.Named(ns, "broken"), shell("true"), nil, nil)
		Expect(sandboxclient.IsNotReady(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("sandbox " + ns + "/broken is not Ready: ImageNotFound: "))
		// Through kube-apiserver and the aggregated API server, typed.
		Expect(apierrors.ReasonForError(err)).To(Equal(metav1.StatusReasonConflict))
		Expect(sandboxclient.HasCause(err, subresource.CauseSandboxNotReady)).To(BeTrue(), "%+v", sandboxclient.StatusOf(err))
		st := sandboxclient.StatusOf(err)
		Expect(st.Details.Name).To(Equal("broken"))
		Expect(st.Details.Group).To(Equal(subresource.StatusGroup))
		Expect(st.Details.Kind).To(Equal(subresource.StatusKind))
	})

	It("refuses exec and files on a paused Sandbox with the cause SandboxPaused, and serves it again once resumed", func() {
		paused := createSandbox(ns, "paused")
		waitReady(paused)
		setPaused := func(v bool) {
			Eventually(func() error {
				latest := &sandboxv1alpha1.Sandbox{}
				if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "paused"}, latest); err != nil {
					return err
				}
				latest.Spec.Paused = v
				return k8sClient.Update(ctx, latest)
			}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
		}
		setPaused(true)
		Eventually(readyState(paused), 30*time.Second).Should(HavePrefix("False/Paused"))
		// The aggregated API server reads through its cache, which may be a
		// moment behind.
		Eventually(func(g Gomega) {
			_, err := admin.Exec(ctx, sandboxclient.Named(ns, "paused"), shell("touch /app/while-paused"), nil, nil)
			g.Expect(sandboxclient.IsSandboxPaused(err)).To(BeTrue(), "%v", err)
			g.Expect(sandboxclient.IsNotReady(err)).To(BeTrue())
			g.Expect(apierrors.ReasonForError(err)).To(Equal(metav1.StatusReasonConflict))
		}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
		err := admin.Download(ctx, sandboxclient.Named(ns, "paused"), "/app/", io.Discard)
		Expect(sandboxclient.IsSandboxPaused(err)).To(BeTrue(), "%v", err)

		setPaused(false)
		Eventually(readyState(paused), 30*time.Second).Should(HavePrefix("True/Running"))
		Eventually(func(g Gomega) {
			var stdout bytes.Buffer
			_, err := admin.Exec(ctx, sandboxclient.Named(ns, "paused"), shell("ls /app"), &stdout, nil)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(stdout.String()).NotTo(ContainSubstring("while-paused"))
		}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
	})

	It("reports a Sandbox that does not exist", func() {
		_, err := admin.Exec(ctx, sandboxclient.Named(ns, "nope"), shell("true"), nil, nil)
		Expect(sandboxclient.IsNotFound(err)).To(BeTrue(), "%v", err)
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
		Expect(sandboxclient.IsSandboxGone(err)).To(BeTrue(), "%v", err)
		Expect(sandboxclient.StatusOf(err).Details.Name).To(Equal("nope"))
	})
})

var _ = Describe("a forged node API endpoint", Label("integration"), func() {
	var forgeStatus func(ns, node, endpoint string)
	// A Sandbox's status names its node API's address. Whoever could write
	// that address (only the node's manager, under the status policy) still
	// cannot make the aggregated API server talk to an impostor: the server
	// certificate must chain to the operator CA and name status.nodeName.
	// The impostor must receive nothing but a TLS handshake: no request
	// line, no identity headers, no credential.
	impostor := func(cert tls.Certificate) (endpoint string, received func() int) {
		GinkgoHelper()
		l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
		Expect(err).NotTo(HaveOccurred())
		var mu sync.Mutex
		n := 0
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer conn.Close()
					_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
					buf := make([]byte, 4096)
					for {
						k, err := conn.Read(buf)
						mu.Lock()
						n += k
						mu.Unlock()
						if err != nil {
							return
						}
					}
				}()
			}
		}()
		DeferCleanup(l.Close)
		return "https://" + l.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
	}

	forge := func(ns, node, endpoint string) {
		GinkgoHelper()
		// The impostor listens on an address of node (as a manager's
		// node API does), so the server dials it and checks its
		// certificate.
		cp.EnsureNode(node, testenv.LoopbackAddress)
		forgeStatus(ns, node, endpoint)
	}

	forgeStatus = func(ns, node, endpoint string) {
		GinkgoHelper()
		sbx := createSandbox(ns, "forged", func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = node })
		// envtest runs without the status policy, so the test can write
		// the status a (compromised) manager of node would write.
		sbx.Status = sandboxv1alpha1.SandboxStatus{
			NodeName: node, NodeAPIEndpoint: endpoint, ContainerID: "c0ffee",
			Conditions: []metav1.Condition{{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionTrue,
				Reason: sandboxv1alpha1.SandboxReasonRunning, Message: "forged", LastTransitionTime: metav1.Now()}},
		}
		Expect(k8sClient.Status().Update(context.Background(), sbx)).To(Succeed())
	}

	execIn := func(ns string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		runner := serviceAccountConfig(ns, "runner")
		bind(ns, execRole, saSubject(ns, "runner"))
		var err error
		// The RoleBinding reaches the authorizer's cache within seconds.
		Eventually(func() bool {
			_, err = newClient(runner).Exec(ctx, sandboxclient.Named(ns, "forged"), shell("echo hi"), nil, nil)
			return err != nil && !sandboxclient.IsForbidden(err)
		}, 15*time.Second, 500*time.Millisecond).Should(BeTrue(), "%v", err)
		return err
	}

	It("gets no bytes from a self-signed impostor", func() {
		ns := newNamespace()
		cert, err := operatorca.SelfSigned(operatorca.NodeCommonName("fake-node"), []string{"127.0.0.1"}, x509.ExtKeyUsageServerAuth, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		endpoint, received := impostor(*cert)
		forge(ns, "fake-node", endpoint)
		err = execIn(ns)
		Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("fake-node"))
		Consistently(received, time.Second).Should(BeZero())
	})

	It("is never dialled when it is not an address of its node, and the caller learns nothing of the network", func() {
		// A compromised manager could otherwise make the aggregated API
		// server dial any address (a port scan of the cluster network,
		// read from the errors). The Node's addresses are the kubelet's.
		ns := newNamespace()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(l.Close)
		var accepted atomic.Int32
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				_ = conn.Close()
			}
		}()
		node := "fake-node-elsewhere"
		cp.EnsureNode(node, "192.0.2.10") // TEST-NET-1: not where the endpoint points
		forgeStatus(ns, node, "https://"+l.Addr().String())
		err = execIn(ns)
		Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("the node API of node " + node + " is unavailable"))
		Expect(err.Error()).NotTo(ContainSubstring("127.0.0.1"))
		Consistently(accepted.Load, time.Second).Should(BeZero(), "the aggregated API server dialled an address that is not its node's")

		// A closed port among the node's addresses: the dial fails, and
		// the caller gets the same error, without the dial's text.
		closed, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		addr := closed.Addr().String()
		Expect(closed.Close()).To(Succeed())
		ns2 := newNamespace()
		cp.EnsureNode("fake-node-closed", testenv.LoopbackAddress)
		forgeStatus(ns2, "fake-node-closed", "https://"+addr)
		err = execIn(ns2)
		Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).NotTo(Or(ContainSubstring("refused"), ContainSubstring("dial"), ContainSubstring(addr)))
	})

	It("gets no bytes from a real node's certificate used for another node", func() {
		ns := newNamespace()
		// A certificate the operator CA issued to "other-node", served
		// for a Sandbox bound to "fake-node-2".
		cert, err := operator.Authority.Current().IssueNode("other-node", time.Hour)
		Expect(err).NotTo(HaveOccurred())
		endpoint, received := impostor(*cert)
		forge(ns, "fake-node-2", endpoint)
		err = execIn(ns)
		Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
		Consistently(received, time.Second).Should(BeZero())
	})
})

var _ = Describe("the aggregated API server reached directly", Label("integration"), func() {
	// Only kube-apiserver's front proxy authenticates there: a caller who
	// reaches the Service directly, even with a token that kube-apiserver
	// would accept and RBAC that allows exec, gets 401 and is never
	// reviewed, so every exec passes kube-apiserver's RBAC and audit log.
	It("refuses a valid token, a forged X-Remote-User and no credentials alike", func() {
		ns := newNamespace()
		bind(ns, execRole, saSubject(ns, "direct"))
		token := cp.ServiceAccountToken(ns, "direct")
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: operator.Authority.Pool(), ServerName: "localhost"}}}
		for name, headers := range map[string]map[string]string{
			"token":         {"Authorization": "Bearer " + token},
			"forged header": {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"},
			"nothing":       {},
		} {
			req, err := http.NewRequest(http.MethodPost,
				"https://"+operator.Address+"/apis/subresources.sandbox.code-sandbox.dev/v1alpha1/namespaces/"+ns+"/sandboxes/box/exec",
				strings.NewReader(`{"command":["true"]}`))
			Expect(err).NotTo(HaveOccurred())
			for k, v := range headers {
				req.Header.Set(k, v)
			}
			resp, err := hc.Do(req)
			Expect(err).NotTo(HaveOccurred(), name)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), "%s: %s", name, body)
		}
	})
})
