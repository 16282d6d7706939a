package sandboxclient_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi/wire"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient/sandboxclienttest"
)

const (
	ns   = "team-a"
	name = "box"
)

// recorder is a node API handler that keeps what it was sent.
type recorder struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   [][]byte
	answer   func(w http.ResponseWriter, r *http.Request, body []byte)
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.requests = append(rec.requests, r)
	rec.bodies = append(rec.bodies, body)
	answer := rec.answer
	rec.mu.Unlock()
	if answer != nil {
		answer(w, r, body)
	}
}

func (rec *recorder) count() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.requests)
}

func (rec *recorder) last() (*http.Request, []byte) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	Expect(rec.requests).NotTo(BeEmpty(), "the node API got no request")
	return rec.requests[len(rec.requests)-1], rec.bodies[len(rec.bodies)-1]
}

func writeFrames(w http.ResponseWriter, frames ...wire.Frame) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, f := range frames {
		Expect(enc.Encode(f)).To(Succeed())
		w.(http.Flusher).Flush()
	}
}

// answerOK answers every exec with some output and exit code 0.
func answerOK(w http.ResponseWriter, _ *http.Request, _ []byte) {
	writeFrames(w,
		wire.Frame{Stream: "stdout", Data: []byte("hello\n")},
		wire.Frame{Result: &execio.Result{ExitCode: 0}})
}

func selfSignedPEM(cn string) (certPEM, keyPEM []byte) {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

var _ = Describe("Client", Label("unit"), func() {
	var (
		cluster *sandboxclienttest.Cluster
		node    *recorder
		ctx     context.Context
	)

	BeforeEach(func() {
		cluster = sandboxclienttest.New()
		DeferCleanup(cluster.Close)
		node = &recorder{answer: answerOK}
		cluster.SetNodeHandler(node)
		cluster.AddSandbox(ns, name)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		DeferCleanup(cancel)
	})

	newClient := func(cfg *rest.Config, opts sandboxclient.Options) *sandboxclient.Client {
		GinkgoHelper()
		c, err := sandboxclient.New(cfg, opts)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		return c
	}

	execHello := func(c *sandboxclient.Client) (string, error) {
		var out bytes.Buffer
		_, err := c.Exec(ctx, ns, name, execio.Request{Command: []string{"echo", "hello"}}, &out, nil)
		return out.String(), err
	}

	Describe("authenticating the node API", func() {
		It("talks to the node whose certificate matches status.agentCertSHA256", func() {
			out, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("hello\n"))
		})

		It("refuses a node whose certificate does not match, before sending anything", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { st["agentCertSHA256"] = strings.Repeat("ab", 32) })
			_, err := execHello(newClient(cluster.RESTConfig("secret-token"), sandboxclient.Options{}))
			Expect(err).To(MatchError(sandboxclient.ErrCertificateMismatch))
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box"))
			Expect(node.count()).To(BeZero(), "the token must not reach an unauthenticated server")
		})

		It("refuses a Sandbox without a pin when no CA bundle is configured", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { delete(st, "agentCertSHA256") })
			_, err := execHello(newClient(cluster.RESTConfig("secret-token"), sandboxclient.Options{}))
			Expect(err).To(MatchError(sandboxclient.ErrNoPin))
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box"))
			Expect(node.count()).To(BeZero())
		})

		It("verifies against Options.CABundle when the Sandbox has no pin", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { delete(st, "agentCertSHA256") })
			out, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{CABundle: cluster.NodeCAPEM()}))
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("hello\n"))
		})

		It("fails chain verification against a CA bundle that did not sign the node's certificate", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { delete(st, "agentCertSHA256") })
			otherCA, _ := selfSignedPEM("someone else")
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{CABundle: otherCA}))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring("certificate"))
			Expect(node.count()).To(BeZero())
		})

		It("ignores the API server's CA and insecure flag for the node", func() {
			cfg := cluster.RESTConfig("t")
			cfg.CAData = nil
			cfg.Insecure = true
			cluster.AddSandbox(ns, name, func(st map[string]any) { st["agentCertSHA256"] = strings.Repeat("cd", 32) })
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).To(MatchError(sandboxclient.ErrCertificateMismatch))
		})

		DescribeTable("refuses endpoints that are not https://HOST:PORT",
			func(endpoint string) {
				cluster.AddSandbox(ns, name, func(st map[string]any) { st["agentEndpoint"] = endpoint })
				_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
				Expect(err).To(MatchError(sandboxclient.ErrInvalidEndpoint))
				Expect(node.count()).To(BeZero())
			},
			Entry("plain http", "http://127.0.0.1:9443"),
			Entry("no port", "https://127.0.0.1"),
			Entry("a path", "https://127.0.0.1:9443/elsewhere"),
			Entry("user info", "https://user:pw@127.0.0.1:9443"),
		)

		It("refuses a malformed pin", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { st["agentCertSHA256"] = "abc" })
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(err).To(MatchError(ContainSubstring("agentCertSHA256")))
		})

		It("does not follow redirects, which would carry the credentials elsewhere", func() {
			node.answer = func(w http.ResponseWriter, r *http.Request, _ []byte) {
				http.Redirect(w, r, "https://example.invalid/steal", http.StatusTemporaryRedirect)
			}
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(err).To(HaveOccurred())
			Expect(node.count()).To(Equal(1))
		})

		It("computes pins as the manager publishes them", func() {
			Expect(sandboxclient.CertificatePin(cluster.Node.Certificate().Raw)).To(Equal(cluster.Pin))
			pin, err := sandboxclient.ParsePin(cluster.Pin)
			Expect(err).NotTo(HaveOccurred())
			Expect(pin).To(HaveLen(32))
			_, err = sandboxclient.ParsePin(strings.Repeat("zz", 32))
			Expect(err).To(HaveOccurred())
		})
	})

	Describe("sending the caller's credentials", func() {
		It("sends the bearer token", func() {
			_, err := execHello(newClient(cluster.RESTConfig("my-token"), sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer my-token"))
		})

		It("reads a token file", func() {
			file := filepath.Join(GinkgoT().TempDir(), "token")
			Expect(os.WriteFile(file, []byte("file-token\n"), 0o600)).To(Succeed())
			cfg := cluster.RESTConfig("")
			cfg.BearerTokenFile = file
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer file-token"))
		})

		It("sends the impersonation headers of rest.Config.Impersonate", func() {
			cfg := cluster.RESTConfig("mcp-server-token")
			cfg.Impersonate = rest.ImpersonationConfig{
				UserName: "alice", UID: "1234", Groups: []string{"devs", "agents"},
				Extra: map[string][]string{"scopes": {"a", "b"}},
			}
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer mcp-server-token"))
			Expect(r.Header.Get("Impersonate-User")).To(Equal("alice"))
			Expect(r.Header.Get("Impersonate-Uid")).To(Equal("1234"))
			Expect(r.Header.Values("Impersonate-Group")).To(ConsistOf("devs", "agents"))
			Expect(r.Header.Values("Impersonate-Extra-Scopes")).To(ConsistOf("a", "b"))
		})

		It("presents the client certificate", func() {
			certPEM, keyPEM := selfSignedPEM("cert-user")
			cfg := cluster.RESTConfig("")
			cfg.CertData, cfg.KeyData = certPEM, keyPEM
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.TLS.PeerCertificates).NotTo(BeEmpty())
			Expect(r.TLS.PeerCertificates[0].Subject.CommonName).To(Equal("cert-user"))
			Expect(r.Header.Get("Authorization")).To(BeEmpty())
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
			cfg := cluster.RESTConfig("")
			cfg.ExecProvider = execProvider(writePlugin(map[string]any{"token": "plugin-token"}))
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.Header.Get("Authorization")).To(Equal("Bearer plugin-token"))
		})

		It("runs an exec credential plugin for a client certificate", func() {
			certPEM, keyPEM := selfSignedPEM("plugin-cert-user")
			cfg := cluster.RESTConfig("")
			cfg.ExecProvider = execProvider(writePlugin(map[string]any{
				"clientCertificateData": string(certPEM), "clientKeyData": string(keyPEM)}))
			_, err := execHello(newClient(cfg, sandboxclient.Options{}))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.TLS.PeerCertificates).NotTo(BeEmpty())
			Expect(r.TLS.PeerCertificates[0].Subject.CommonName).To(Equal("plugin-cert-user"))
		})
	})

	Describe("resolving the Sandbox", func() {
		It("explains a Sandbox that is not Ready with its condition's reason and message", func() {
			cluster.AddSandbox(ns, name, sandboxclienttest.NotReady("ContainerExited", "the main process exited with code 3"))
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(sandboxclient.IsNotReady(err)).To(BeTrue())
			Expect(err).To(MatchError("sandbox team-a/box is not ready: ContainerExited: the main process exited with code 3"))
			var nr *sandboxclient.NotReadyError
			Expect(errors.As(err, &nr)).To(BeTrue())
			Expect(nr.Reason).To(Equal("ContainerExited"))
			Expect(node.count()).To(BeZero())
		})

		It("explains a Sandbox no manager has reported on", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { delete(st, "conditions") })
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(sandboxclient.IsNotReady(err)).To(BeTrue())
			Expect(err).To(MatchError(ContainSubstring("sandbox team-a/box is not ready: no manager has reported on it yet")))
		})

		It("reports a Ready Sandbox without an endpoint as unavailable", func() {
			cluster.AddSandbox(ns, name, func(st map[string]any) { delete(st, "agentEndpoint") })
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(sandboxclient.IsUnavailable(err)).To(BeTrue())
			Expect(err).To(MatchError(ContainSubstring(`the manager on node "fake-node" has not published its node API`)))
		})

		It("reports a missing Sandbox as not found, naming it", func() {
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Exec(ctx, ns, "nope", execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(sandboxclient.IsNotFound(err)).To(BeTrue())
			Expect(err.Error()).To(HavePrefix("sandbox team-a/nope: "))
			Expect(err.Error()).To(ContainSubstring("kube-apiserver, HTTP 404"))
		})

		It("reports an unreachable node as unavailable", func() {
			dead := httptest.NewUnstartedServer(http.NotFoundHandler())
			addr := dead.Listener.Addr().String()
			dead.Listener.Close()
			cluster.AddSandbox(ns, name, func(st map[string]any) { st["agentEndpoint"] = "https://" + addr })
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(sandboxclient.IsUnavailable(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box"))
		})

		It("refuses invalid names before asking anyone", func() {
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			_, err := c.Exec(ctx, ns, "../etc", execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(sandboxclient.IsBadRequest(err)).To(BeTrue())
			Expect(err.Error()).To(ContainSubstring(`invalid sandbox name "../etc"`))
			_, err = c.Exec(ctx, "", name, execio.Request{Command: []string{"true"}}, nil, nil)
			Expect(err).To(MatchError(ContainSubstring("invalid namespace")))
			Expect(cluster.APICalls()).To(BeZero())
		})

		It("waits for a Sandbox to become Ready", func() {
			cluster.AddSandbox(ns, name, sandboxclienttest.NotReady("Provisioning", "pulling"))
			go func() {
				defer GinkgoRecover()
				time.Sleep(300 * time.Millisecond)
				cluster.AddSandbox(ns, name)
			}()
			Expect(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).WaitReady(ctx, ns, name)).To(Succeed())
		})

		It("stops waiting for a Sandbox whose container exited", func() {
			cluster.AddSandbox(ns, name, sandboxclienttest.NotReady("ContainerExited", "exit code 1"))
			err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).WaitReady(ctx, ns, name)
			Expect(sandboxclient.IsNotReady(err)).To(BeTrue())
		})

		It("reports the deadline and the last reason when waiting times out", func() {
			cluster.AddSandbox(ns, name, sandboxclienttest.NotReady("Provisioning", "pulling"))
			wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).WaitReady(wctx, ns, name)
			Expect(err).To(MatchError(context.DeadlineExceeded))
		})
	})

	Describe("decoding node API refusals", func() {
		DescribeTable("into typed errors that name the sandbox",
			func(code int, reason metav1.StatusReason, is func(error) bool) {
				node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
					sandboxclienttest.WriteStatus(w, code, reason, "the server says no")
				}
				_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
				Expect(is(err)).To(BeTrue(), "%v", err)
				var ae *sandboxclient.APIError
				Expect(errors.As(err, &ae)).To(BeTrue())
				Expect(ae.Code).To(BeEquivalentTo(code))
				Expect(ae.Reason).To(Equal(reason))
				Expect(ae.Message).To(Equal("the server says no"))
				Expect(err.Error()).To(Equal(fmt.Sprintf("sandbox team-a/box: the server says no (node API, HTTP %d)", code)))
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

		It("keeps a body that is not a Status as the message", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				http.Error(w, "upstream proxy broke", http.StatusBadGateway)
			}
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			Expect(err).To(MatchError("sandbox team-a/box: upstream proxy broke (node API, HTTP 502)"))
		})
	})

	Describe("Exec", func() {
		It("sends the request and returns the result", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w,
					wire.Frame{Stream: "stdout", Data: []byte("a")},
					wire.Frame{Stream: "stderr", Data: []byte("b")},
					wire.Frame{Stream: "stdout", Data: []byte("c")},
					wire.Frame{Result: &execio.Result{ExitCode: 7, DurationMillis: 5, StdoutBytes: 2, StderrBytes: 1}})
			}
			var stdout, stderr bytes.Buffer
			req := execio.Request{Command: []string{"sh", "-c", "x"}, Stdin: []byte("in"), Env: []string{"A=1"}, WorkingDir: "/tmp", TimeoutSeconds: 5}
			res, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Exec(ctx, ns, name, req, &stdout, &stderr)
			Expect(err).NotTo(HaveOccurred())
			Expect(res).To(Equal(execio.Result{ExitCode: 7, DurationMillis: 5, StdoutBytes: 2, StderrBytes: 1}))
			Expect(stdout.String()).To(Equal("ac"))
			Expect(stderr.String()).To(Equal("b"))

			r, body := node.last()
			Expect(r.Method).To(Equal(http.MethodPost))
			Expect(r.URL.Path).To(Equal("/v1/namespaces/team-a/sandboxes/box/exec"))
			Expect(r.Header.Get("Accept")).To(Equal("application/x-ndjson"))
			var sent execio.Request
			Expect(json.Unmarshal(body, &sent)).To(Succeed())
			Expect(sent).To(Equal(req))
		})

		It("returns an ExecError when the stream ends with an error frame", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w, wire.Frame{Stream: "stdout", Data: []byte("x")}, wire.Frame{Error: "docker went away"})
			}
			_, err := execHello(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}))
			var ee *sandboxclient.ExecError
			Expect(errors.As(err, &ee)).To(BeTrue())
			Expect(err).To(MatchError("sandbox team-a/box: exec failed: docker went away"))
		})

		It("fails when the stream is cut before the result", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				writeFrames(w, wire.Frame{Stream: "stdout", Data: []byte("x")})
			}
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
			Expect(enc.Encode(wire.Frame{Stream: "stdout", Data: []byte("first")})).To(Succeed())
			Eventually(stdout.String).Should(Equal("first"), "the first frame is written before the stream ends")
			Consistently(done, 100*time.Millisecond).ShouldNot(Receive())
			Expect(enc.Encode(wire.Frame{Result: &execio.Result{ExitCode: 1}})).To(Succeed())
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

		It("streams an upload archive", func() {
			node.answer = answerStats
			pr, pw := io.Pipe()
			go func() {
				tw := tar.NewWriter(pw)
				_ = tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
				_, _ = tw.Write([]byte("abc"))
				pw.CloseWithError(tw.Close())
			}()
			stats, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Upload(ctx, ns, name, "/app/src", pr)
			Expect(err).NotTo(HaveOccurred())
			Expect(stats.Files).To(Equal(1))
			r, body := node.last()
			Expect(r.Method).To(Equal(http.MethodPut))
			Expect(r.URL.Path).To(Equal("/v1/namespaces/team-a/sandboxes/box/files"))
			Expect(r.URL.Query().Get("path")).To(Equal("/app/src"))
			Expect(r.Header.Get("Content-Type")).To(Equal("application/x-tar"))
			tr := tar.NewReader(bytes.NewReader(body))
			hdr, err := tr.Next()
			Expect(err).NotTo(HaveOccurred())
			Expect(hdr.Name).To(Equal("a.txt"))
		})

		It("uploads one file with its length and mode", func() {
			node.answer = answerStats
			stats, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, ns, name, "bin/run.sh", 0o755, strings.NewReader("#!/bin/sh\n"))
			Expect(err).NotTo(HaveOccurred())
			Expect(stats.Bytes).To(BeEquivalentTo(10))
			r, _ := node.last()
			Expect(r.ContentLength).To(BeEquivalentTo(10))
			Expect(r.Header.Get("Content-Type")).To(Equal("application/octet-stream"))
			Expect(r.URL.Query().Get("path")).To(Equal("bin/run.sh"))
			Expect(r.URL.Query().Get("mode")).To(Equal("0755"))
		})

		It("uploads the rest of a file from its current offset", func() {
			node.answer = answerStats
			f, err := os.CreateTemp(GinkgoT().TempDir(), "src")
			Expect(err).NotTo(HaveOccurred())
			defer f.Close()
			_, err = f.WriteString("skip-keep")
			Expect(err).NotTo(HaveOccurred())
			_, err = f.Seek(5, io.SeekStart)
			Expect(err).NotTo(HaveOccurred())
			_, err = newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, ns, name, "x", 0o600, f)
			Expect(err).NotTo(HaveOccurred())
			r, body := node.last()
			Expect(r.ContentLength).To(BeEquivalentTo(4))
			Expect(string(body)).To(Equal("keep"))
		})

		It("gives content of unknown length a Content-Length by spooling it", func() {
			node.answer = answerStats
			pr, pw := io.Pipe()
			go func() {
				_, _ = pw.Write([]byte("streamed"))
				pw.Close()
			}()
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, ns, name, "x", 0o644, pr)
			Expect(err).NotTo(HaveOccurred())
			r, body := node.last()
			Expect(r.ContentLength).To(BeEquivalentTo(8))
			Expect(string(body)).To(Equal("streamed"))
		})

		It("uploads an empty file", func() {
			node.answer = answerStats
			_, err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).UploadFile(ctx, ns, name, "empty", 0o644, strings.NewReader(""))
			Expect(err).NotTo(HaveOccurred())
			r, _ := node.last()
			Expect(r.ContentLength).To(BeZero())
		})

		It("downloads an archive", func() {
			node.answer = func(w http.ResponseWriter, r *http.Request, _ []byte) {
				Expect(r.URL.Query().Get("path")).To(Equal("/app/out"))
				w.Header().Set("Trailer", "Sandbox-Transfer-Error")
				w.Header().Set("Content-Type", "application/x-tar")
				_, _ = w.Write([]byte("archive bytes"))
			}
			var out bytes.Buffer
			Expect(newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Download(ctx, ns, name, "/app/out", &out)).To(Succeed())
			Expect(out.String()).To(Equal("archive bytes"))
		})

		It("fails a download whose trailer reports an error", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				w.Header().Set("Trailer", "Sandbox-Transfer-Error")
				_, _ = w.Write([]byte("partial"))
				w.(http.Flusher).Flush()
				w.Header().Set("Sandbox-Transfer-Error", "too large: big.bin takes the download past its 8388608-byte limit")
			}
			var out bytes.Buffer
			err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Download(ctx, ns, name, "/app", &out)
			var te *sandboxclient.TransferError
			Expect(errors.As(err, &te)).To(BeTrue(), "%v", err)
			Expect(sandboxclient.IsTooLarge(err)).To(BeTrue())
			Expect(err.Error()).To(ContainSubstring("sandbox team-a/box: download of /app failed part-way"))
			Expect(out.String()).To(Equal("partial"))
		})
	})

	Describe("logs and history", func() {
		It("streams logs with tail and follow", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				_, _ = w.Write([]byte("line 1\nline 2\n"))
			}
			var out bytes.Buffer
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			Expect(c.Logs(ctx, ns, name, sandboxclient.LogOptions{Tail: 2, Follow: true}, &out)).To(Succeed())
			Expect(out.String()).To(Equal("line 1\nline 2\n"))
			r, _ := node.last()
			Expect(r.URL.Path).To(Equal("/v1/namespaces/team-a/sandboxes/box/log"))
			Expect(r.URL.Query().Get("tail")).To(Equal("2"))
			Expect(r.URL.Query().Get("follow")).To(Equal("true"))

			Expect(c.Logs(ctx, ns, name, sandboxclient.LogOptions{}, io.Discard)).To(Succeed())
			r, _ = node.last()
			Expect(r.URL.RawQuery).To(BeEmpty(), "no tail means everything")
		})

		It("decodes history records until the stream ends, or fn says stop", func() {
			node.answer = func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				enc := json.NewEncoder(w)
				_ = enc.Encode(history.Record{ID: "1", Command: []string{"ls"}, ExitCode: 0})
				_ = enc.Encode(history.Record{ID: "2", Shell: "exit 3", ExitCode: 3})
			}
			c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
			var ids []string
			Expect(c.History(ctx, ns, name, sandboxclient.LogOptions{}, func(r history.Record) error {
				ids = append(ids, r.ID)
				return nil
			})).To(Succeed())
			Expect(ids).To(Equal([]string{"1", "2"}))
			r, _ := node.last()
			Expect(r.URL.Path).To(Equal("/v1/namespaces/team-a/sandboxes/box/history"))

			stop := errors.New("stop")
			Expect(c.History(ctx, ns, name, sandboxclient.LogOptions{}, func(history.Record) error { return stop })).To(MatchError(stop))
		})

		It("returns the context's error when a follow is cancelled", func() {
			node.answer = func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}
			lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			err := newClient(cluster.RESTConfig("t"), sandboxclient.Options{}).Logs(lctx, ns, name, sandboxclient.LogOptions{Follow: true}, io.Discard)
			Expect(err).To(MatchError(context.DeadlineExceeded))
		})
	})

	It("reuses connections to a node", func() {
		c := newClient(cluster.RESTConfig("t"), sandboxclient.Options{})
		for range 3 {
			_, err := execHello(c)
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(node.count()).To(Equal(3))
		var remotes []string
		node.mu.Lock()
		for _, r := range node.requests {
			remotes = append(remotes, r.RemoteAddr)
		}
		node.mu.Unlock()
		Expect(remotes[1]).To(Equal(remotes[0]))
		Expect(remotes[2]).To(Equal(remotes[0]))
	})
})

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
