package sandboxclient_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient/sandboxclienttest"
)

const (
	ns   = "team-a"
	name = "box"
	// aggregated is where the subresources of team-a/box live on the API
	// server; spelled out rather than taken from package wire, so that the
	// test pins the contract.
	aggregated = "/apis/subresources.sandbox.code-sandbox.dev/v1alpha1/namespaces/team-a/sandboxes/box/"
)

func writeFrames(w http.ResponseWriter, frames ...subresource.Frame) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, f := range frames {
		Expect(enc.Encode(f)).To(Succeed())
		w.(http.Flusher).Flush()
	}
}

// answerOK answers every call like a successful exec.
func answerOK(w http.ResponseWriter, _ *http.Request, _ []byte) {
	writeFrames(w,
		subresource.Frame{Stream: "stdout", Data: []byte("hello\n")},
		subresource.Frame{Result: &execio.Result{ExitCode: 0}})
}

// answerAll answers each subresource as the aggregated API would.
func answerAll(w http.ResponseWriter, r *http.Request, body []byte) {
	sub := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	switch {
	case sub == "exec":
		answerOK(w, r, body)
	case sub == "files" && r.Method == http.MethodPost:
		_ = json.NewEncoder(w).Encode(execio.TransferStats{Files: 1, Bytes: int64(len(body))})
	case sub == "files":
		w.Header().Set("Trailer", subresource.TrailerTransferError)
		w.Header().Set("Content-Type", "application/x-tar")
		_, _ = w.Write([]byte("archive bytes"))
	case sub == "log":
		_, _ = w.Write([]byte("log line\n"))
	case sub == "history":
		_ = json.NewEncoder(w).Encode(history.Record{ID: "1", Command: []string{"ls"}})
	default:
		http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusTeapot)
	}
}

var _ = Describe("Client", Label("unit"), func() {
	var (
		cluster *sandboxclienttest.Cluster
		ctx     context.Context
	)

	BeforeEach(func() {
		cluster = sandboxclienttest.New()
		DeferCleanup(cluster.Close)
		cluster.Handle(answerOK)
		cluster.AddSandbox(ns, name)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		DeferCleanup(cancel)
		// Runs before cluster.Close (cleanups run last in, first out):
		// whatever a test did, nothing reached the node API that the
		// Sandbox's status names.
		DeferCleanup(func() {
			Expect(cluster.DecoyConnections()).To(BeZero(),
				"a client connected to status.nodeAPIEndpoint; it sent %d requests there: %+v", len(cluster.DecoyRequests()), cluster.DecoyRequests())
		})
	})

	newClient := func(cfg *rest.Config, opts sandboxclient.Options) *sandboxclient.Client {
		GinkgoHelper()
		c, err := sandboxclient.New(cfg, opts)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		return c
	}

	execHelloOn := func(c *sandboxclient.Client, ref sandboxclient.Ref) (string, error) {
		var out bytes.Buffer
		_, err := c.Exec(ctx, ref, execio.Request{Command: []string{"echo", "hello"}}, &out, nil)
		return out.String(), err
	}
	execHello := func(c *sandboxclient.Client) (string, error) { return execHelloOn(c, sandboxclient.Named(ns, name)) }

	last := func() sandboxclienttest.Request {
		GinkgoHelper()
		r, ok := cluster.LastSubresourceRequest()
		Expect(ok).To(BeTrue(), "the API server got no subresource call")
		return r
	}

	Describe("reaching the subresources through the API server", func() {
		It("sends every call to the API server's aggregated path with its method, never to the node the status names", func() {
			cluster.Handle(answerAll)
			// The node API that the status names would answer, and so would
			// a server at the removed agentEndpoint with a matching pin:
			// an old client would have sent the token there.
			cluster.AddSandbox(ns, name, func(st map[string]any) {
				st["agentEndpoint"] = cluster.Decoy.URL
				st["agentCertSHA256"] = cluster.DecoyPin
			})
			c := newClient(cluster.RESTConfig("caller-token"), sandboxclient.Options{})

			_, err := execHello(c)
			Expect(err).NotTo(HaveOccurred())
			_, err = c.Upload(ctx, sandboxclient.Named(ns, name), "/app/src", bytes.NewReader(tarOf("a.txt", "abc")))
			Expect(err).NotTo(HaveOccurred())
			_, err = c.UploadFile(ctx, sandboxclient.Named(ns, name), "/app/run.sh", 0o755, strings.NewReader("#!/bin/sh\n"))
			Expect(err).NotTo(HaveOccurred())
			var archive bytes.Buffer
			Expect(c.Download(ctx, sandboxclient.Named(ns, name), "/app/out", &archive)).To(Succeed())
			Expect(archive.String()).To(Equal("archive bytes"))
			var logs bytes.Buffer
			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, &logs)).To(Succeed())
			Expect(logs.String()).To(Equal("log line\n"))
			Expect(c.History(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, func(history.Record) error { return nil })).To(Succeed())

			type call struct{ Method, Path, Path2, User, Auth string }
			var calls []call
			for _, r := range cluster.Requests() {
				calls = append(calls, call{r.Method, r.Path, r.Query.Get("path"), r.User, r.Header.Get("Authorization")})
			}
			auth := "Bearer caller-token"
			Expect(calls).To(Equal([]call{
				{"POST", aggregated + "exec", "", "caller-token-user", auth},
				{"POST", aggregated + "files", "/app/src", "caller-token-user", auth},
				{"POST", aggregated + "files", "/app/run.sh", "caller-token-user", auth},
				{"GET", aggregated + "files", "/app/out", "caller-token-user", auth},
				{"GET", aggregated + "log", "", "caller-token-user", auth},
				{"GET", aggregated + "history", "", "caller-token-user", auth},
			}), "one request per call, to the API server only: the Sandbox is not read first")
			Expect(cluster.DecoyConnections()).To(BeZero())
		})

		DescribeTable("honours a path prefix in the server URL, as behind kubectl proxy --api-prefix",
			func(prefix string) {
				cluster.ServeUnder("/k8s/proxy")
				cfg := cluster.RESTConfig("t")
				cfg.Host = cluster.API.URL + prefix
				c := newClient(cfg, sandboxclient.Options{})
				out, err := execHello(c)
				Expect(err).NotTo(HaveOccurred())
				Expect(out).To(Equal("hello\n"))
				Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, io.Discard)).To(Succeed())
				var paths []string
				for _, r := range cluster.Requests() {
					paths = append(paths, r.Method+" "+r.Path)
				}
				Expect(paths).To(Equal([]string{"POST /k8s/proxy" + aggregated + "exec", "GET /k8s/proxy" + aggregated + "log"}))
			},
			Entry("without a trailing slash", "/k8s/proxy"),
			Entry("with a trailing slash", "/k8s/proxy/"),
		)

		It("does not follow a redirect, which would carry the credentials to another host", func() {
			cluster.Handle(func(w http.ResponseWriter, r *http.Request, _ []byte) {
				http.Redirect(w, r, cluster.Decoy.URL+"/steal", http.StatusTemporaryRedirect)
			})
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			_, err := execHello(c)
			Expect(err).To(HaveOccurred())
			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, io.Discard)).NotTo(Succeed())
			Expect(cluster.SubresourceRequests()).To(HaveLen(2))
			Expect(cluster.DecoyConnections()).To(BeZero(), "the redirect was followed: %+v", cluster.DecoyRequests())
		})

		It("reuses connections to the API server", func() {
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			for range 3 {
				_, err := execHello(c)
				Expect(err).NotTo(HaveOccurred())
			}
			reqs := cluster.SubresourceRequests()
			Expect(reqs).To(HaveLen(3))
			Expect(reqs[1].RemoteAddr).To(Equal(reqs[0].RemoteAddr))
			Expect(reqs[2].RemoteAddr).To(Equal(reqs[0].RemoteAddr))
		})

		It("sends Options.UserAgent on every request", func() {
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{UserAgent: "sandbox-test/1"})
			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, io.Discard)).To(Succeed())
			_, err := execHello(c)
			Expect(err).NotTo(HaveOccurred())
			reqs := cluster.Requests()
			Expect(reqs).To(HaveLen(2))
			Expect(reqs[0].Header.Get("User-Agent")).To(Equal("sandbox-test/1"))
			Expect(reqs[1].Header.Get("User-Agent")).To(Equal("sandbox-test/1"))
		})
	})

	Describe("authenticating to the API server with the caller's credentials", func() {
		It("sends the bearer token", func() {
			_, err := execHello(newClient(cluster.RESTConfig("my-token"), sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer my-token"))
			Expect(r.User).To(Equal("my-token-user"))
		})

		It("reads a token file", func() {
			cluster.AllowToken("file-token", "file-user")
			file := filepath.Join(GinkgoT().TempDir(), "token")
			Expect(os.WriteFile(file, []byte("file-token\n"), 0o600)).To(Succeed())
			cfg := cluster.RESTConfig("")
			cfg.BearerTokenFile = file
			c := newClient(cfg, sandboxclient.Options{})
			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, io.Discard)).To(Succeed())
			_, err := execHello(c)
			Expect(err).NotTo(HaveOccurred())
			Expect(cluster.Requests()).To(HaveLen(2))
			for _, r := range cluster.Requests() {
				Expect(r.Header.Get("Authorization")).To(Equal("Bearer file-token"), r.Path)
				Expect(r.User).To(Equal("file-user"), r.Path)
			}
		})

		It("presents the client certificate of the rest.Config, and no token", func() {
			c := newClient(cluster.CertConfig("cert-user"), sandboxclient.Options{})
			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, io.Discard)).To(Succeed())
			_, err := execHello(c)
			Expect(err).NotTo(HaveOccurred())
			reqs := cluster.Requests()
			Expect(reqs).To(HaveLen(2))
			for _, r := range reqs {
				Expect(r.ClientCertCN).To(Equal("cert-user"), r.Path)
				Expect(r.User).To(Equal("cert-user"), r.Path)
				Expect(r.Header.Get("Authorization")).To(BeEmpty(), r.Path)
			}
		})

		It("sends the impersonation headers of rest.Config.Impersonate", func() {
			cfg := cluster.RESTConfig("mcp-server-token")
			cfg.Impersonate = rest.ImpersonationConfig{
				UserName: "alice", UID: "1234", Groups: []string{"devs", "agents"},
				Extra: map[string][]string{"scopes": {"a", "b"}},
			}
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer mcp-server-token"))
			Expect(r.Header.Get("Impersonate-User")).To(Equal("alice"))
			Expect(r.Header.Get("Impersonate-Uid")).To(Equal("1234"))
			Expect(r.Header.Values("Impersonate-Group")).To(ConsistOf("devs", "agents"))
			Expect(r.Header.Values("Impersonate-Extra-Scopes")).To(ConsistOf("a", "b"))
		})

		writePlugin := func(status map[string]any) string {
			GinkgoHelper()
			cred, err := json.Marshal(map[string]any{
				"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status,
			})
			Expect(err).NotTo(HaveOccurred())
			dir := GinkgoT().TempDir()
			Expect(os.WriteFile(filepath.Join(dir, "cred.json"), cred, 0o600)).To(Succeed())
			script := filepath.Join(dir, "plugin.sh")
			Expect(os.WriteFile(script, []byte("#!/bin/sh\ncat "+filepath.Join(dir, "cred.json")+"\n"), 0o700)).To(Succeed())
			return script
		}
		execProvider := func(script string) *clientcmdapi.ExecConfig {
			return &clientcmdapi.ExecConfig{Command: script, APIVersion: "client.authentication.k8s.io/v1",
				InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
		}

		It("runs an exec credential plugin for a token", func() {
			cluster.AllowToken("plugin-token", "oidc:alice")
			cfg := cluster.RESTConfig("")
			cfg.ExecProvider = execProvider(writePlugin(map[string]any{"token": "plugin-token"}))
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer plugin-token"))
			Expect(r.User).To(Equal("oidc:alice"))
		})

		It("runs an exec credential plugin for a client certificate", func() {
			certPEM, keyPEM := cluster.ClientCertificate("plugin-cert-user")
			cfg := cluster.RESTConfig("")
			cfg.ExecProvider = execProvider(writePlugin(map[string]any{
				"clientCertificateData": string(certPEM), "clientKeyData": string(keyPEM)}))
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.ClientCertCN).To(Equal("plugin-cert-user"))
			Expect(r.User).To(Equal("plugin-cert-user"))
		})

		It("reports a token the API server does not accept as unauthorized", func() {
			cfg := cluster.RESTConfig("")
			cfg.BearerToken = "expired-token"
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(sandboxclient.IsUnauthorized(err)).To(BeTrue(), "%v", err)
			Expect(last().Path).To(Equal(aggregated + "exec"))
		})

		It("reports missing credentials as unauthorized", func() {
			_, err := execHello(newClient(cluster.RESTConfig(""), sandboxclient.Options{}))
			Expect(sandboxclient.IsUnauthorized(err)).To(BeTrue(), "%v", err)
		})
	})

	Describe("deciding from a Sandbox the caller read (For)", func() {
		// sandboxFor is the Sandbox ns/name as the fake cluster serves it,
		// changed by mutate: what a caller such as the MCP kubernetes
		// backend has just read.
		sandboxFor := func(mutate ...func(map[string]any)) *sandboxv1alpha1.Sandbox {
			GinkgoHelper()
			cluster.AddSandbox(ns, name, mutate...)
			return cluster.Sandbox(ns, name)
		}
		// refused runs an exec on sbx and returns its error, which the
		// client must decide without a request.
		refused := func(sbx *sandboxv1alpha1.Sandbox) error {
			GinkgoHelper()
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Exec(ctx, sandboxclient.For(sbx), execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(cluster.APICalls()).To(BeZero(), "the client asked the API server about a Sandbox it could judge itself")
			return err
		}

		It("calls a Ready Sandbox's subresource at once", func() {
			sbx := sandboxFor()
			out, err := execHelloOn(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}), sandboxclient.For(sbx))
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("hello\n"))
			Expect(cluster.Requests()).To(HaveLen(1), "one request: the exec, no read of the Sandbox")
		})

		It("explains a Sandbox that is not Ready with its condition's reason and message", func() {
			err := refused(sandboxFor(sandboxclienttest.NotReady("ContainerExited", "the main process exited with code 3")))
			Expect(sandboxclient.IsNotReady(err)).To(BeTrue())
			Expect(err).To(MatchError("sandbox team-a/box is not ready: ContainerExited: the main process exited with code 3"))
			var nr *sandboxclient.NotReadyError
			Expect(errors.As(err, &nr)).To(BeTrue())
			Expect(nr.Reason).To(Equal("ContainerExited"))
		})

		It("explains a Sandbox no manager has reported on", func() {
			err := refused(sandboxFor(func(st map[string]any) { delete(st, "conditions") }))
			Expect(sandboxclient.IsNotReady(err)).To(BeTrue())
			Expect(err).To(MatchError(ContainSubstring("sandbox team-a/box is not ready: no manager has reported on it yet")))
		})

		It("reports a Ready Sandbox whose node has not published its node API as unavailable", func() {
			err := refused(sandboxFor(func(st map[string]any) { delete(st, "nodeAPIEndpoint") }))
			Expect(sandboxclient.IsUnavailable(err)).To(BeTrue())
			Expect(err).To(MatchError(ContainSubstring(`the manager on node "fake-node" has not published its node API`)))
		})

		It("refuses invalid names before asking anyone", func() {
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			_, err := c.Exec(ctx, sandboxclient.Named(ns, "../etc"), execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(sandboxclient.IsBadRequest(err)).To(BeTrue())
			Expect(err.Error()).To(ContainSubstring(`invalid sandbox name "../etc"`))
			_, err = c.Exec(ctx, sandboxclient.Named("", name), execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(err).To(MatchError(ContainSubstring("invalid namespace")))
			Expect(c.Logs(ctx, sandboxclient.Named("Team_A", name), sandboxclient.LogOptions{}, io.Discard)).To(MatchError(ContainSubstring("invalid namespace")))
			Expect(c.Download(ctx, sandboxclient.Named(ns, "a/b"), "/x", io.Discard)).To(MatchError(ContainSubstring("invalid sandbox name")))
			Expect(cluster.APICalls()).To(BeZero())
		})
	})

	Describe("errors from the subresource path", func() {
		DescribeTable("decode a metav1.Status into typed errors that name the sandbox",
			func(code int, reason metav1.StatusReason, is func(error) bool) {
				cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
					sandboxclienttest.WriteStatus(w, code, reason, "the server says no")
				})
				_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
				Expect(is(err)).To(BeTrue(), "%v", err)
				var ae *sandboxclient.APIError
				Expect(errors.As(err, &ae)).To(BeTrue())
				Expect(ae.Code).To(BeEquivalentTo(code))
				Expect(ae.Reason).To(Equal(reason))
				Expect(ae.Message).To(Equal("the server says no"))
				Expect(err.Error()).To(Equal(fmt.Sprintf("sandbox team-a/box: the server says no (sandbox API, HTTP %d)", code)))
			},
			Entry("400", http.StatusBadRequest, metav1.StatusReasonBadRequest, sandboxclient.IsBadRequest),
			Entry("401", http.StatusUnauthorized, metav1.StatusReasonUnauthorized, sandboxclient.IsUnauthorized),
			Entry("403", http.StatusForbidden, metav1.StatusReasonForbidden, sandboxclient.IsForbidden),
			Entry("404", http.StatusNotFound, metav1.StatusReasonNotFound, sandboxclient.IsNotFound),
			Entry("409 is a conflict", http.StatusConflict, metav1.StatusReasonConflict, sandboxclient.IsConflict),
			Entry("409 is not ready", http.StatusConflict, metav1.StatusReasonConflict, sandboxclient.IsNotReady),
			Entry("413", http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, sandboxclient.IsTooLarge),
			Entry("429", http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, sandboxclient.IsTooManyRequests),
			Entry("503", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, sandboxclient.IsUnavailable),
		)

		DescribeTable("decode the causes of a Status, for errors.As and apierrors",
			func(code int, reason metav1.StatusReason, cause metav1.CauseType, is func(error) bool) {
				cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(code)
					_ = json.NewEncoder(w).Encode(subresource.FailureStatus(int32(code), reason, name, "the server says no", metav1.StatusCause{Type: cause}))
				})
				_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
				Expect(is(err)).To(BeTrue(), "%v", err)
				Expect(apierrors.ReasonForError(err)).To(Equal(reason))
				Expect(sandboxclient.HasCause(err, cause)).To(BeTrue())
				st := sandboxclient.StatusOf(err)
				Expect(st).NotTo(BeNil())
				Expect(st.Details.Name).To(Equal(name))
				Expect(st.Details.Group).To(Equal("sandbox.code-sandbox.dev"))
				Expect(st.Details.Kind).To(Equal("sandboxes"))
			},
			Entry("SandboxNotReady", http.StatusConflict, metav1.StatusReasonConflict, subresource.CauseSandboxNotReady, sandboxclient.IsSandboxNotReady),
			Entry("SandboxTerminating", http.StatusConflict, metav1.StatusReasonConflict, subresource.CauseSandboxTerminating, sandboxclient.IsSandboxNotReady),
			Entry("ContainerNotRunning", http.StatusConflict, metav1.StatusReasonConflict, subresource.CauseContainerNotRunning, sandboxclient.IsSandboxNotReady),
			Entry("PathNotFound", http.StatusNotFound, metav1.StatusReasonNotFound, subresource.CausePathNotFound, sandboxclient.IsPathNotFound),
			Entry("SandboxNotOnNode", http.StatusNotFound, metav1.StatusReasonNotFound, subresource.CauseSandboxNotOnNode, sandboxclient.IsSandboxGone),
			Entry("ExecLimit", http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, subresource.CauseExecLimit, sandboxclient.IsExecLimit),
			Entry("NodeAPIUnavailable", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, subresource.CauseNodeAPIUnavailable, sandboxclient.IsUnavailable),
		)

		It("checks readiness from the Sandbox the caller read, without a round trip", func() {
			sbx := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Status: sandboxv1alpha1.SandboxStatus{Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "OOMKilled", Message: "killed"}}}}
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Exec(ctx, sandboxclient.For(sbx), execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(sandboxclient.IsSandboxNotReady(err)).To(BeTrue(), "%v", err)
			Expect(apierrors.IsConflict(err)).To(BeTrue(), "%v", err)
			Expect(cluster.APICalls()).To(Equal(0))
		})

		It("reports the server's 409 for a Sandbox that is not Ready, without reading the Sandbox itself", func() {
			cluster.AddSandbox(ns, name, sandboxclienttest.NotReady("ContainerExited", "the main process exited with code 3"))
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(sandboxclient.IsNotReady(err)).To(BeTrue(), "%v", err)
			Expect(sandboxclient.IsConflict(err)).To(BeTrue(), "%v", err)
			Expect(err).To(MatchError(ContainSubstring("is not Ready: ContainerExited: the main process exited with code 3")))
			// Named once: the server's message already names it.
			Expect(err.Error()).To(HavePrefix("sandbox team-a/box is not Ready: "))
			Expect(cluster.APICalls()).To(Equal(1))
			Expect(last().Path).To(Equal(aggregated + "exec"))
		})

		It("reports a missing Sandbox as not found, naming it", func() {
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Exec(ctx, sandboxclient.Named(ns, "nope"), execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(sandboxclient.IsNotFound(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(HavePrefix("sandbox team-a/nope"))
			Expect(err.Error()).To(ContainSubstring("sandbox API, HTTP 404"))
		})

		It("reports the server's 503 for a node that has not published its node API as unavailable", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { delete(st, "nodeAPIEndpoint") })
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
			Expect(err).To(MatchError(ContainSubstring("node fake-node has not published its node API")))
		})

		It("reports an unreachable API server as unavailable", func() {
			dead := httptest.NewUnstartedServer(http.NotFoundHandler())
			addr := dead.Listener.Addr().String()
			Expect(dead.Listener.Close()).To(Succeed())
			cfg := cluster.RESTConfig("t")
			cfg.Host = "https://" + addr
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box"))
			Expect(err.Error()).To(ContainSubstring("the API server " + addr + " is unreachable"))
		})

		It("keeps a body that is not a Status as the message", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				http.Error(w, "upstream proxy broke", http.StatusBadGateway)
			})
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(err).To(MatchError("sandbox team-a/box: upstream proxy broke (sandbox API, HTTP 502)"))
		})
	})

	Describe("Exec", func() {
		It("sends the request and returns the result", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w,
					subresource.Frame{Stream: "stdout", Data: []byte("a")},
					subresource.Frame{Stream: "stderr", Data: []byte("b")},
					subresource.Frame{Stream: "stdout", Data: []byte("c")},
					subresource.Frame{Result: &execio.Result{ExitCode: 7, DurationMillis: 5, StdoutBytes: 2, StderrBytes: 1}})
			})
			var stdout, stderr bytes.Buffer
			req := execio.Request{Command: []string{"sh", "-c", "x"}, Stdin: []byte("in"), Env: []string{"A=1"}, WorkingDir: "/tmp", TimeoutSeconds: 5}
			res, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Exec(ctx, sandboxclient.Named(ns, name), req, &stdout, &stderr)
			Expect(err).NotTo(HaveOccurred())
			Expect(res).To(Equal(execio.Result{ExitCode: 7, DurationMillis: 5, StdoutBytes: 2, StderrBytes: 1}))
			Expect(stdout.String()).To(Equal("ac"))
			Expect(stderr.String()).To(Equal("b"))

			r := last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Path).To(Equal(aggregated + "exec"))
			Expect(r.RawQuery).To(BeEmpty())
			Expect(r.Header.Get("Content-Type")).To(Equal("application/json"))
			Expect(r.Header.Get("Accept")).To(HavePrefix("application/x-ndjson"))
			var sent execio.Request
			Expect(json.Unmarshal(r.Body, &sent)).To(Succeed())
			Expect(sent).To(Equal(req))
		})

		It("delivers output as the server flushes it, before the command ends", func() {
			release := make(chan struct{})
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			DeferCleanup(unblock)
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w, subresource.Frame{Stream: "stdout", Data: []byte("first")})
				<-release
				writeFrames(w, subresource.Frame{Stream: "stdout", Data: []byte(" second")}, subresource.Frame{Result: &execio.Result{ExitCode: 0}})
			})
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			stdout := &gbytesBuffer{}
			done := make(chan error, 1)
			go func() {
				_, err := c.Exec(ctx, sandboxclient.Named(ns, name), execio.Request{Shell: "echo first; sleep 1; echo second"}, stdout, nil)
				done <- err
			}()
			Eventually(stdout.String).Should(Equal("first"))
			Consistently(done, 100*time.Millisecond).ShouldNot(Receive())
			unblock()
			Eventually(done).Should(Receive(BeNil()))
			Expect(stdout.String()).To(Equal("first second"))
		})

		It("returns an ExecError when the stream ends with an error frame", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w, subresource.Frame{Stream: "stdout", Data: []byte("x")}, subresource.Frame{Error: "docker went away"})
			})
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			var ee *sandboxclient.ExecError
			Expect(errors.As(err, &ee)).To(BeTrue())
			Expect(err).To(MatchError("sandbox team-a/box: exec failed: docker went away"))
		})

		It("types an error frame by its Status reason", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w, subresource.Frame{Error: "docker went away", Status: subresource.FailureStatus(503, metav1.StatusReasonServiceUnavailable, name,
					"docker went away", metav1.StatusCause{Type: subresource.CauseRuntimeUnavailable}, metav1.StatusCause{Type: subresource.CauseStreamFailed})})
			})
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			var ee *sandboxclient.ExecError
			Expect(errors.As(err, &ee)).To(BeTrue())
			Expect(apierrors.IsServiceUnavailable(err)).To(BeTrue(), "%v", err)
			Expect(sandboxclient.HasCause(err, subresource.CauseStreamFailed)).To(BeTrue())
		})

		It("fails when the stream is cut before the result", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w, subresource.Frame{Stream: "stdout", Data: []byte("x")})
			})
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(err).To(MatchError(io.ErrUnexpectedEOF))
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box"))
		})
	})

	Describe("DecodeFrames", func() {
		It("writes each frame as soon as it arrives", func() {
			pr, pw := io.Pipe()
			stdout := gbytesBuffer{}
			done := make(chan execio.Result, 1)
			go func() {
				defer GinkgoRecover()
				res, err := sandboxclient.DecodeFrames(pr, &stdout, io.Discard)
				Expect(err).NotTo(HaveOccurred())
				done <- res
			}()
			enc := json.NewEncoder(pw)
			Expect(enc.Encode(subresource.Frame{Stream: "stdout", Data: []byte("first")})).To(Succeed())
			Eventually(stdout.String).Should(Equal("first"), "the first frame is written before the stream ends")
			Consistently(done, 100*time.Millisecond).ShouldNot(Receive())
			Expect(enc.Encode(subresource.Frame{Result: &execio.Result{ExitCode: 1}})).To(Succeed())
			Eventually(done).Should(Receive(Equal(execio.Result{ExitCode: 1})))
			pw.Close()
		})

		It("skips frames it does not know", func() {
			in := `{"stream":"stdout","data":"YQ=="}` + "\n" + `{"stream":"debug","data":"Yg=="}` + "\n" + `{"future":true}` + "\n" + `{"result":{"exitCode":0,"durationMillis":1,"stdoutBytes":1,"stderrBytes":0}}` + "\n"
			var out bytes.Buffer
			res, err := sandboxclient.DecodeFrames(strings.NewReader(in), &out, io.Discard)
			Expect(err).NotTo(HaveOccurred())
			Expect(out.String()).To(Equal("a"))
			Expect(res.DurationMillis).To(BeEquivalentTo(1))
		})

		It("refuses a stream that is not NDJSON", func() {
			_, err := sandboxclient.DecodeFrames(strings.NewReader("<html>"), io.Discard, io.Discard)
			Expect(err).To(MatchError(ContainSubstring("reading the exec stream")))
		})

		It("stops when a writer fails", func() {
			in := `{"stream":"stdout","data":"YQ=="}` + "\n"
			_, err := sandboxclient.DecodeFrames(strings.NewReader(in), failingWriter{}, io.Discard)
			Expect(err).To(MatchError(ContainSubstring("writing stdout")))
		})
	})

	Describe("file transfer", func() {
		answerStats := func(w http.ResponseWriter, _ *http.Request, body []byte) {
			_ = json.NewEncoder(w).Encode(execio.TransferStats{Files: 1, Bytes: int64(len(body))})
		}

		It("streams an upload archive with POST", func() {
			cluster.Handle(answerStats)
			pr, pw := io.Pipe()
			go func() {
				tw := tar.NewWriter(pw)
				_ = tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
				_, _ = tw.Write([]byte("abc"))
				pw.CloseWithError(tw.Close())
			}()
			stats, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Upload(ctx, sandboxclient.Named(ns, name), "/app/src", pr)
			Expect(err).NotTo(HaveOccurred())
			Expect(stats.Files).To(Equal(1))
			r := last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Path).To(Equal(aggregated + "files"))
			Expect(r.Query.Get("path")).To(Equal("/app/src"))
			Expect(r.Header.Get("Content-Type")).To(Equal("application/x-tar"))
			tr := tar.NewReader(bytes.NewReader(r.Body))
			hdr, err := tr.Next()
			Expect(err).NotTo(HaveOccurred())
			Expect(hdr.Name).To(Equal("a.txt"))
		})

		It("uploads one file with its length and mode", func() {
			cluster.Handle(answerStats)
			stats, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, sandboxclient.Named(ns, name), "bin/run.sh", 0o755, strings.NewReader("#!/bin/sh\n"))
			Expect(err).NotTo(HaveOccurred())
			Expect(stats.Bytes).To(BeEquivalentTo(10))
			r := last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Header.Get("Content-Length")).To(Equal("10"))
			Expect(r.Header.Get("Content-Type")).To(Equal("application/octet-stream"))
			Expect(r.Query.Get("path")).To(Equal("bin/run.sh"))
			Expect(r.Query.Get("mode")).To(Equal("0755"))
		})

		It("uploads the rest of a file from its current offset", func() {
			cluster.Handle(answerStats)
			f, err := os.CreateTemp(GinkgoT().TempDir(), "src")
			Expect(err).NotTo(HaveOccurred())
			defer f.Close()
			_, err = f.WriteString("skip-keep")
			Expect(err).NotTo(HaveOccurred())
			_, err = f.Seek(5, io.SeekStart)
			Expect(err).NotTo(HaveOccurred())
			_, err = newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, sandboxclient.Named(ns, name), "x", 0o600, f)
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.Header.Get("Content-Length")).To(Equal("4"))
			Expect(string(r.Body)).To(Equal("keep"))
		})

		It("gives content of unknown length a Content-Length by spooling it", func() {
			cluster.Handle(answerStats)
			pr, pw := io.Pipe()
			go func() {
				_, _ = pw.Write([]byte("streamed"))
				pw.Close()
			}()
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, sandboxclient.Named(ns, name), "x", 0o644, pr)
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.Header.Get("Content-Length")).To(Equal("8"))
			Expect(string(r.Body)).To(Equal("streamed"))
		})

		It("uploads an empty file", func() {
			cluster.Handle(answerStats)
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, sandboxclient.Named(ns, name), "empty", 0o644, strings.NewReader(""))
			Expect(err).NotTo(HaveOccurred())
			r := last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.Body).To(BeEmpty())
			Expect(r.Header.Get("Content-Length")).To(Or(BeEmpty(), Equal("0")))
		})

		It("downloads an archive with GET", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				w.Header().Set("Trailer", "Sandbox-Transfer-Error")
				w.Header().Set("Content-Type", "application/x-tar")
				_, _ = w.Write([]byte("archive bytes"))
			})
			var out bytes.Buffer
			Expect(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Download(ctx, sandboxclient.Named(ns, name), "/app/out", &out)).To(Succeed())
			Expect(out.String()).To(Equal("archive bytes"))
			r := last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "files"))
			Expect(r.Query.Get("path")).To(Equal("/app/out"))
			Expect(r.Header.Get("Accept")).To(HavePrefix("application/x-tar"))
		})

		It("fails a download whose trailer reports an error", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				w.Header().Set("Trailer", "Sandbox-Transfer-Error, Sandbox-Transfer-Error-Reason")
				_, _ = w.Write([]byte("partial"))
				w.(http.Flusher).Flush()
				w.Header().Set("Sandbox-Transfer-Error", "too large: big.bin takes the download past its 8388608-byte limit")
				w.Header().Set("Sandbox-Transfer-Error-Reason", "RequestEntityTooLarge")
			})
			var out bytes.Buffer
			err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Download(ctx, sandboxclient.Named(ns, name), "/app", &out)
			var te *sandboxclient.TransferError
			Expect(errors.As(err, &te)).To(BeTrue(), "%v", err)
			Expect(sandboxclient.IsTooLarge(err)).To(BeTrue())
			// The reason, not the text, says what failed.
			Expect(apierrors.ReasonForError(err)).To(Equal(metav1.StatusReasonRequestEntityTooLarge))
			Expect(sandboxclient.HasCause(err, subresource.CauseStreamFailed)).To(BeTrue())
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box: download of /app failed part-way"))
			Expect(out.String()).To(Equal("partial"))
		})
	})

	Describe("logs and history", func() {
		It("streams logs with tail and follow", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				_, _ = w.Write([]byte("line 1\nline 2\n"))
			})
			var out bytes.Buffer
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{Tail: 2, Follow: true}, &out)).To(Succeed())
			Expect(out.String()).To(Equal("line 1\nline 2\n"))
			r := last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "log"))
			Expect(r.Query.Get("tail")).To(Equal("2"))
			Expect(r.Query.Get("follow")).To(Equal("true"))

			Expect(c.Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, io.Discard)).To(Succeed())
			Expect(last().RawQuery).To(BeEmpty(), "no tail means everything")
		})

		It("serves logs of a Sandbox that is not Ready", func() {
			cluster.AddSandbox(ns, name, sandboxclienttest.NotReady("ContainerExited", "exit code 1"))
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) { _, _ = w.Write([]byte("last words\n")) })
			var out bytes.Buffer
			Expect(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Logs(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, &out)).To(Succeed())
			Expect(out.String()).To(Equal("last words\n"))
		})

		It("decodes history records until the stream ends, or fn says stop", func() {
			cluster.Handle(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				enc := json.NewEncoder(w)
				_ = enc.Encode(history.Record{ID: "1", Command: []string{"ls"}, ExitCode: 0})
				_ = enc.Encode(history.Record{ID: "2", Shell: "exit 3", ExitCode: 3})
			})
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			var ids []string
			Expect(c.History(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{Tail: 5}, func(r history.Record) error {
				ids = append(ids, r.ID)
				return nil
			})).To(Succeed())
			Expect(ids).To(Equal([]string{"1", "2"}))
			r := last()
			Expect(r.Method).To(Equal(http.MethodGet))
			Expect(r.Path).To(Equal(aggregated + "history"))
			Expect(r.Query.Get("tail")).To(Equal("5"))

			stop := errors.New("stop")
			Expect(c.History(ctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{}, func(history.Record) error { return stop })).To(MatchError(stop))
		})

		It("returns the context's error when a follow is cancelled", func() {
			cluster.Handle(func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Logs(lctx, sandboxclient.Named(ns, name), sandboxclient.LogOptions{Follow: true}, io.Discard)
			Expect(err).To(MatchError(context.DeadlineExceeded))
		})
	})
})

// tarOf is an archive with one regular file.
func tarOf(name, content string) []byte {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	Expect(tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})).To(Succeed())
	_, err := tw.Write([]byte(content))
	Expect(err).NotTo(HaveOccurred())
	Expect(tw.Close()).To(Succeed())
	return buf.Bytes()
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// gbytesBuffer is a buffer safe to read while another goroutine writes.
type gbytesBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *gbytesBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *gbytesBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
