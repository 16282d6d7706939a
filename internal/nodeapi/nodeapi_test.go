/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

var _ = Describe("Node API", Ordered, ContinueOnFailure, func() {
	var (
		ns, otherNS string
		sbx         *sandboxv1alpha1.Sandbox
	)

	BeforeAll(func() {
		ns, otherNS = newNamespace(), newNamespace()
		sbx = waitReady(createSandbox(ns, uniqueName("main")))
	})

	echo := execio.Request{Command: []string{"echo", "hi"}}

	It("publishes the endpoint in the status of a Running Sandbox", func() {
		Expect(sbx.Status.NodeAPIEndpoint).To(Equal(api.Endpoint))
	})

	// The node API serves only the operator's aggregated API server, which
	// authenticated and authorised the end user and names them in the
	// front-proxy headers. Each spec here fails if its check is removed.
	Context("who may call it", func() {
		// guarded is a server for nodeName built exactly as the manager's,
		// which also logs every request that reaches its HTTP layer.
		var guarded *testServer
		BeforeEach(func() {
			guarded = newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient, recordRequests: true}).start()
		})

		// touch is an exec that leaves /app/<marker> behind if it runs.
		touch := func(marker string) request {
			return request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: subresource.SubresourceExec,
				body: strings.NewReader(`{"command":["touch","/app/` + marker + `"]}`)}
		}
		exists := func(marker string) bool {
			GinkgoHelper()
			res := api.exec(ns, sbx.Name, execio.Request{Command: []string{"test", "-e", "/app/" + marker}})
			Expect(res.status).To(Equal(http.StatusOK), res.stdout.String())
			Expect(res.result).NotTo(BeNil(), res.errorFrame)
			return res.result.ExitCode == 0
		}
		// refusedInHandshake: the server aborted the TLS handshake with an
		// alert, and no HTTP request reached it.
		refusedInHandshake := func(err error) {
			GinkgoHelper()
			Expect(err).To(MatchError(ContainSubstring("remote error: tls: ")))
			Expect(guarded.seen.requests()).To(BeEmpty())
		}

		It("fails the handshake of a client without a certificate: no HTTP request reaches the server", func() {
			before := historyLen(sbx)
			for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
				noCert := guarded.as(nil)
				noCert.client.Transport.(*http.Transport).TLSClientConfig.MaxVersion = version
				_, err := noCert.try(touch("no-cert"))
				refusedInHandshake(err)
			}
			Expect(historyLen(sbx)).To(Equal(before))
			Expect(exists("no-cert")).To(BeFalse())
		})

		It("never takes a bearer token instead of a certificate, even a cluster admin's", func() {
			cp.BindCluster("cluster-admin", testenv.ServiceAccountSubject(ns, "admin"))
			token := cp.ServiceAccountToken(ns, "admin")
			r := touch("bearer")
			r.header = http.Header{"Authorization": {"Bearer " + token}}
			_, err := guarded.as(nil).try(r)
			refusedInHandshake(err)

			// Nor does it stand in for the aggregator's certificate or for
			// the user it names: nobody asks the API server about it.
			resp := guarded.as(issueClient(ca, "someone")).do(r)
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
			resp.Body.Close()
			r = touch("bearer")
			r.header, r.as = http.Header{"Authorization": {"Bearer " + token}}, anonymous
			resp = guarded.do(r)
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
			resp.Body.Close()
			Expect(exists("bearer")).To(BeFalse())
		})

		DescribeTable("fails the handshake of a certificate that is not an operator CA client certificate",
			func(cert func() *tls.Certificate) {
				before := historyLen(sbx)
				_, err := guarded.as(cert()).try(touch("foreign-cert"))
				refusedInHandshake(err)
				Expect(historyLen(sbx)).To(Equal(before))
				Expect(exists("foreign-cert")).To(BeFalse())
			},
			Entry("self-signed, with the aggregator's name", func() *tls.Certificate {
				return selfSignedClient(operatorca.AggregatorCommonName)
			}),
			Entry("from another CA that has the operator CA's name, with the aggregator's name", func() *tls.Certificate {
				rogue, err := operatorca.NewCA(ca.Certificate().Subject.CommonName, time.Hour, time.Now())
				Expect(err).NotTo(HaveOccurred())
				return issueClient(rogue, operatorca.AggregatorCommonName)
			}),
			Entry("from the operator CA, but a node's serving certificate (server auth only)", func() *tls.Certificate {
				c, err := ca.IssueNode(nodeName, time.Hour)
				Expect(err).NotTo(HaveOccurred())
				return c
			}),
			Entry("from the operator CA, but a serving certificate with the aggregator's name", func() *tls.Certificate {
				c, err := ca.IssueServing([]string{operatorca.AggregatorCommonName, "localhost"}, time.Hour)
				Expect(err).NotTo(HaveOccurred())
				return c
			}),
		)

		DescribeTable("answers 401 to an operator CA client certificate issued to anyone but the aggregated API server, and runs nothing",
			func(commonName string) {
				before := historyLen(sbx)
				resp := guarded.as(issueClient(ca, commonName)).do(touch("other-cn"))
				Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
				Expect(statusOf(resp).Reason).To(Equal(metav1.StatusReasonUnauthorized))
				// It passed the handshake (the chain is good) and was
				// refused by name.
				Expect(guarded.seen.requests()).To(ConsistOf(HaveField("ClientCN", commonName)))
				Expect(historyLen(sbx)).To(Equal(before))
				Expect(exists("other-cn")).To(BeFalse())
			},
			Entry("a stranger", "someone"),
			Entry("a node's name", operatorca.NodeCommonName(nodeName)),
			Entry("kube-apiserver's front proxy", testenv.FrontProxyClientName),
			Entry("the aggregator's name and more", operatorca.AggregatorCommonName+"-not"),
		)

		It("runs a command for the user that the aggregated API server names, and records that user", func() {
			alice := &caller{user: "alice@example.com", uid: "alice-uid", groups: []string{"devs", "system:authenticated"},
				extra: map[string][]string{"scopes": {"sandbox"}}}
			body, err := json.Marshal(execio.Request{Command: []string{"echo", "as-alice"}})
			Expect(err).NotTo(HaveOccurred())
			// An impersonation header means nothing here.
			resp := guarded.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: subresource.SubresourceExec, as: alice,
				header: http.Header{"Impersonate-User": {"system:admin"}, "Impersonate-Group": {"system:masters"}}, body: bytes.NewReader(body)})
			Expect(resp.StatusCode).To(Equal(http.StatusOK), lazyBody(resp))
			Expect(readAll(resp)).To(ContainSubstring(`"result":{`))
			recs, err := hist.Tail(string(sbx.UID), 1)
			Expect(err).NotTo(HaveOccurred())
			Expect(recs).To(HaveLen(1))
			Expect(recs[0].Command).To(Equal([]string{"echo", "as-alice"}))
			Expect(recs[0].Caller).To(Equal(alice.user))
			Expect(guarded.seen.requests()).To(ConsistOf(HaveField("ClientCN", operatorca.AggregatorCommonName)))

			res := guarded.exec(ns, sbx.Name, echo)
			Expect(res.status).To(Equal(http.StatusOK))
			recs, err = hist.Tail(string(sbx.UID), 1)
			Expect(err).NotTo(HaveOccurred())
			Expect(recs[0].Caller).To(Equal(runner.user))
		})

		It("needs no Authorization header from the aggregator, ignores one, and strips it before serving", func() {
			token := cp.ServiceAccountToken(ns, "bystander")
			for i, authz := range []string{"", "Bearer " + token, "Bearer garbage"} {
				r := request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: subresource.SubresourceExec,
					body: strings.NewReader(fmt.Sprintf(`{"command":["echo","authz-%d"]}`, i))}
				if authz != "" {
					r.header = http.Header{"Authorization": {authz}}
				}
				resp := guarded.do(r)
				Expect(resp.StatusCode).To(Equal(http.StatusOK), lazyBody(resp))
				Expect(readAll(resp)).To(ContainSubstring(`"exitCode":0`))
				recs, err := hist.Tail(string(sbx.UID), 1)
				Expect(err).NotTo(HaveOccurred())
				Expect(recs[0].Command).To(Equal([]string{"echo", fmt.Sprintf("authz-%d", i)}))
				Expect(recs[0].Caller).To(Equal(runner.user), "the token's owner is not the caller")
			}
			Eventually(guarded.seen.requests).Should(HaveEach(HaveField("Done", true)))
			seen := guarded.seen.requests()
			Expect(seen).To(HaveLen(3))
			for i, s := range seen[1:] {
				Expect(s.AuthBefore).NotTo(BeEmpty(), "request %d", i+1)
				Expect(s.AuthAfter).To(BeEmpty(), "request %d kept its Authorization header", i+1)
			}
		})

		It("answers 401 to the aggregated API server when it names no user, and runs nothing", func() {
			before := historyLen(sbx)
			for _, as := range []*caller{anonymous, {groups: []string{"system:masters"}}, {uid: "someone", extra: map[string][]string{"scopes": {"all"}}}} {
				r := touch("no-user")
				r.as = as
				resp := guarded.do(r)
				Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), "as %+v", *as)
				Expect(statusOf(resp).Reason).To(Equal(metav1.StatusReasonUnauthorized))
			}
			Expect(guarded.seen.requests()).To(HaveLen(3))
			Expect(historyLen(sbx)).To(Equal(before))
			Expect(exists("no-user")).To(BeFalse())
		})

		It("serves a certificate from the operator CA that names its node, and only that node", func() {
			dial := func(endpoint string, verify func(tls.ConnectionState) error) (tls.ConnectionState, error) {
				conn, err := tls.Dial("tcp", strings.TrimPrefix(endpoint, "https://"), &tls.Config{
					MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*aggregatorCert},
					InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
					VerifyConnection:   verify,
				})
				if err != nil {
					return tls.ConnectionState{}, err
				}
				defer conn.Close()
				return conn.ConnectionState(), nil
			}
			// The manager's server.
			state, err := dial(api.Endpoint, operatorca.VerifyNode(ca.Pool, nodeName))
			Expect(err).NotTo(HaveOccurred())
			leaf := state.PeerCertificates[0]
			Expect(leaf.Subject.CommonName).To(Equal(operatorca.NodeCommonName(nodeName)))
			Expect(ca.Signed(leaf)).To(BeTrue())
			_, err = dial(api.Endpoint, operatorca.VerifyNode(ca.Pool, testNodePrefix+"elsewhere"))
			Expect(err).To(MatchError(ContainSubstring("names %q", operatorca.NodeCommonName(nodeName))))
			rogue, err := operatorca.NewCA(ca.Certificate().Subject.CommonName, time.Hour, time.Now())
			Expect(err).NotTo(HaveOccurred())
			_, err = dial(api.Endpoint, operatorca.VerifyNode(rogue.Pool, nodeName))
			Expect(err).To(MatchError(ContainSubstring("not from the operator CA")))

			// A client that expects another node sends it nothing.
			_, err = wrapServer(guarded.NodeAPI, testNodePrefix+"elsewhere").try(touch("wrong-node"))
			Expect(err).To(MatchError(ContainSubstring("names")))
			Expect(guarded.seen.requests()).To(BeEmpty())
			Expect(exists("wrong-node")).To(BeFalse())
		})
	})

	Context("which Sandboxes it serves", func() {
		It("answers 404 for a missing Sandbox", func() {
			res := api.exec(ns, "does-not-exist", echo)
			Expect(res.status).To(Equal(http.StatusNotFound))
			Expect(res.stdout.String()).To(ContainSubstring("not found"))
			st := expectStatus(res, metav1.StatusReasonNotFound)
			Expect(st.Details.Name).To(Equal("does-not-exist"))
			Expect(st.Details.Group).To(Equal(subresource.StatusGroup))
			Expect(st.Details.Kind).To(Equal(subresource.StatusKind))
			Expect(st.Details.Causes).To(BeEmpty())
		})

		It("serves the Sandbox of the path's namespace, not another of the same name", func() {
			other := waitReady(createSandbox(otherNS, sbx.Name))
			res := api.exec(otherNS, other.Name, execio.Request{Shell: "echo other > /app/which && echo ok"})
			Expect(res.stdout.String()).To(Equal("ok\n"), res.stderr.String())
			res = api.exec(ns, sbx.Name, execio.Request{Shell: "cat /app/which 2>/dev/null || echo none"})
			Expect(res.stdout.String()).To(Equal("none\n"))
			res = api.exec(otherNS, other.Name, execio.Request{Command: []string{"cat", "/app/which"}})
			Expect(res.stdout.String()).To(Equal("other\n"))
			recs, err := hist.Tail(string(other.UID), 0)
			Expect(err).NotTo(HaveOccurred())
			Expect(recs).To(HaveLen(2))
		})

		It("answers 404 for a Sandbox on another node, even one claiming our container", func() {
			other := createSandbox(ns, uniqueName("elsewhere"), func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = "" + testNodePrefix + "nobody" })
			setStatus(other, testNodePrefix+"nobody", sbx.Status.ContainerID)
			// The server reads through the manager's cache, which may not
			// have the status yet ("not bound to any node"): 404 either way,
			// and then the node it names.
			Eventually(func(g Gomega) {
				res := api.exec(ns, other.Name, echo)
				g.Expect(res.status).To(Equal(http.StatusNotFound))
				g.Expect(res.stdout.String()).To(ContainSubstring("runs on node " + testNodePrefix + "nobody"))
				g.Expect(subresource.HasCause(expectStatus(res, metav1.StatusReasonNotFound), subresource.CauseSandboxNotOnNode)).To(BeTrue())
			}, 5*time.Second, 100*time.Millisecond).Should(Succeed())
		})

		It("answers 409 with the reason for a Sandbox that is not Ready, and runs nothing", func() {
			broken := createSandbox(ns, uniqueName("broken"), func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Image = "code-sandbox-test/does-not-exist:1"
				s.Spec.ImagePullPolicy = sandboxv1alpha1.PullNever
			})
			Eventually(readyReason(broken), 30*time.Second).Should(Equal("False/ImageNotFound"))
			// The server reads through the manager's cache, which may be a
			// moment behind (still Provisioning): 409 either way.
			Eventually(func(g Gomega) {
				res := api.exec(ns, broken.Name, echo)
				g.Expect(res.status).To(Equal(http.StatusConflict))
				g.Expect(res.stdout.String()).To(ContainSubstring("ImageNotFound"))
				g.Expect(subresource.HasCause(expectStatus(res, metav1.StatusReasonConflict), subresource.CauseSandboxNotReady)).To(BeTrue())
			}, 5*time.Second, 100*time.Millisecond).Should(Succeed())
			Expect(historyLen(broken)).To(BeZero())
		})

		It("answers 409 SandboxPaused for a paused Sandbox, runs nothing, and serves it again once resumed", func() {
			paused := waitReady(createSandbox(ns, uniqueName("paused")))
			setPausedSpec(paused, true)
			Eventually(readyReason(paused), 30*time.Second).Should(Equal("False/Paused"))
			Eventually(func(g Gomega) {
				res := api.exec(ns, paused.Name, execio.Request{Command: []string{"touch", "/app/while-paused"}})
				g.Expect(res.status).To(Equal(http.StatusConflict))
				g.Expect(res.stdout.String()).To(ContainSubstring("paused"))
				g.Expect(subresource.HasCause(expectStatus(res, metav1.StatusReasonConflict), subresource.CauseSandboxPaused)).To(BeTrue())
			}, 5*time.Second, 100*time.Millisecond).Should(Succeed())
			Expect(historyLen(paused)).To(BeZero())

			setPausedSpec(paused, false)
			Eventually(readyReason(paused), 30*time.Second).Should(Equal("True/Running"))
			Eventually(func(g Gomega) {
				res := api.exec(ns, paused.Name, execio.Request{Command: []string{"ls", "/app"}})
				g.Expect(res.status).To(Equal(http.StatusOK))
				g.Expect(res.result.ExitCode).To(BeZero())
				g.Expect(res.stdout.String()).NotTo(ContainSubstring("while-paused"))
			}, 5*time.Second, 100*time.Millisecond).Should(Succeed())
		})

		It("serves a container frozen behind the manager's back again once the manager thaws it (spec.paused is the truth)", func() {
			frozen := waitReady(createSandbox(ns, uniqueName("frozen")))
			Expect(api.exec(ns, frozen.Name, echo).status).To(Equal(http.StatusOK))
			// The raw API, not the runtime's Pause: that one waits to see
			// Docker record the pause, and the manager may thaw the
			// container before it looks (the very behaviour under test).
			// runc's cgroup v1 freezer may give up under load ("unable to
			// freeze"), so a refused pause is tried again.
			Eventually(func() error {
				return rawDocker.ContainerPause(context.Background(), frozen.Status.ContainerID)
			}, 20*time.Second, 200*time.Millisecond).Should(Succeed())
			DeferCleanup(func() { _ = docker.Unpause(context.Background(), frozen.Status.ContainerID) })
			// Docker's pause event wakes the manager, which unpauses a
			// container whose Sandbox does not ask to be paused. Until then
			// an exec is refused as SandboxPaused, never hung.
			Eventually(func(g Gomega) {
				ct, err := docker.Inspect(context.Background(), frozen.Status.ContainerID)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(ct.State.Paused).To(BeFalse())
			}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
			Eventually(func(g Gomega) {
				res := api.exec(ns, frozen.Name, echo)
				if res.status == http.StatusConflict {
					g.Expect(subresource.HasCause(expectStatus(res, metav1.StatusReasonConflict), subresource.CauseSandboxPaused)).To(BeTrue(), res.stdout.String())
				}
				g.Expect(res.status).To(Equal(http.StatusOK))
			}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
		})

		It("thaws a Sandbox the manager paused for idleness (spec.lifecycle) and runs the exec in it, its processes and files kept", func() {
			idle := waitReady(createSandbox(ns, uniqueName("idle"), func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Command = []string{"sh", "-c", "echo kept > /app/f; exec sleep 3600"}
				s.Spec.Lifecycle = &sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](1)}
			}))
			idlePaused := func() string {
				c := meta.FindStatusCondition(getSandbox(idle).Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
				if c == nil {
					return ""
				}
				return string(c.Status) + "/" + c.Reason
			}
			before := api.exec(ns, idle.Name, execio.Request{Command: []string{"pidof", "sleep"}})
			Expect(before.status).To(Equal(http.StatusOK), before.stdout.String())
			Expect(before.stdout.String()).NotTo(BeEmpty())
			Eventually(idlePaused, 30*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
			ct, err := docker.Inspect(context.Background(), idle.Status.ContainerID)
			Expect(err).NotTo(HaveOccurred())
			Expect(ct.State.Paused).To(BeTrue())

			res := api.exec(ns, idle.Name, execio.Request{Command: []string{"cat", "/app/f"}})
			Expect(res.status).To(Equal(http.StatusOK), res.stdout.String())
			Expect(res.result.ExitCode).To(BeZero())
			Expect(res.stdout.String()).To(Equal("kept\n"))
			Expect(getSandbox(idle).Status.ContainerID).To(Equal(idle.Status.ContainerID), "the same container, not a new one")
			res = api.exec(ns, idle.Name, execio.Request{Command: []string{"pidof", "sleep"}})
			Expect(res.status).To(Equal(http.StatusOK), res.stdout.String())
			Expect(res.stdout.String()).To(Equal(before.stdout.String()), "the sandbox's main process did not survive the idle pause")
			// The exec is the Sandbox's last activity, persisted by the manager.
			Eventually(func() *metav1.Time { return getSandbox(idle).Status.LastActivityTime }, 10*time.Second, 100*time.Millisecond).ShouldNot(BeNil())
			// Left alone, it idles out again, and the next exec thaws it again.
			Eventually(idlePaused, 30*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
			res = api.exec(ns, idle.Name, execio.Request{Command: []string{"echo", "again"}})
			Expect(res.status).To(Equal(http.StatusOK), res.stdout.String())
			Expect(res.stdout.String()).To(Equal("again\n"))
		})

		It("refuses a container that is not the Sandbox's own, whatever status.containerID says", func() {
			// A server for a node without a manager, so that nothing fixes
			// the forged status behind the test's back.
			ghostNode := testNodePrefix + "ghost"
			ghost := newTestServer(serverOptions{node: ghostNode, runtime: docker, reader: k8sClient}).start()
			forged := createSandbox(ns, uniqueName("forged"), func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = ghostNode })
			setStatus(forged, ghostNode, sbx.Status.ContainerID)
			before := historyLen(sbx)
			res := ghost.exec(ns, forged.Name, execio.Request{Command: []string{"touch", "/app/forged"}})
			Expect(res.status).To(Equal(http.StatusConflict))
			Expect(res.stdout.String()).To(ContainSubstring("not the sandbox's own container"))
			Expect(subresource.HasCause(expectStatus(res, metav1.StatusReasonConflict), subresource.CauseContainerNotRunning)).To(BeTrue())
			Expect(historyLen(sbx)).To(Equal(before))
		})

		It("answers 503 quickly when Docker is unavailable, and the manager keeps serving", func() {
			// A missing socket fails at once; "quickly" is well before the
			// call timeout, which a server that retried would wait out.
			const callTimeout = 30 * time.Second
			dead, err := dockerruntime.New(dockerruntime.Options{Host: "unix:///nonexistent/docker.sock", CallTimeout: callTimeout})
			Expect(err).NotTo(HaveOccurred())
			defer dead.Close()
			down := newTestServer(serverOptions{node: nodeName, runtime: dead, reader: k8sClient}).start()
			start := time.Now()
			resp := down.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec",
				body: strings.NewReader(`{"command":["true"]}`)})
			Expect(time.Since(start)).To(BeNumerically("<", callTimeout/2), "the server waited for Docker's call timeout")
			Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable))
			Expect(resp.Header.Get("Retry-After")).NotTo(BeEmpty())
			st := statusOf(resp)
			Expect(st.Message).To(ContainSubstring("Docker Engine is unavailable"))
			Expect(st.Reason).To(Equal(metav1.StatusReasonServiceUnavailable))
			Expect(subresource.HasCause(&st, subresource.CauseRuntimeUnavailable)).To(BeTrue())
			Expect(st.Details.RetryAfterSeconds).To(BeNumerically(">", 0))
			Expect(st.Details.Name).To(Equal(sbx.Name))
			for _, sub := range []string{"log", "files"} {
				resp := down.do(request{method: http.MethodGet, namespace: ns, name: sbx.Name, subresource: sub, query: "path=."})
				Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable), sub)
				resp.Body.Close()
			}
			Expect(api.exec(ns, sbx.Name, echo).status).To(Equal(http.StatusOK))
		})

		It("refuses more concurrent commands than the per-Sandbox limit with 429", func() {
			limited := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient, maxExecsPerSandbox: 1}).start()
			body, _ := json.Marshal(execio.Request{Shell: "echo started; sleep 2"})
			resp := limited.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: bytes.NewReader(body)})
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			defer resp.Body.Close()
			frames := make(chan subresource.Frame, 10)
			go func() {
				defer GinkgoRecover()
				defer close(frames)
				readFrames(resp.Body, func(f subresource.Frame) { frames <- f })
			}()
			Eventually(frames, 5*time.Second).Should(Receive(HaveField("Stream", subresource.StreamStdout)))
			// The first command holds the only slot until it ends.
			busy := limited.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: strings.NewReader(`{"command":["true"]}`)})
			Expect(busy.StatusCode).To(Equal(http.StatusTooManyRequests))
			Expect(busy.Header.Get("Retry-After")).To(Equal("1"))
			busyStatus := statusOf(busy)
			Expect(busyStatus.Message).To(ContainSubstring("limit"))
			Expect(busyStatus.Reason).To(Equal(metav1.StatusReasonTooManyRequests))
			Expect(subresource.HasCause(&busyStatus, subresource.CauseExecLimit)).To(BeTrue())
			Eventually(frames, 5*time.Second).Should(Receive(HaveField("Result.ExitCode", 0)))
			Expect(limited.exec(ns, sbx.Name, echo).status).To(Equal(http.StatusOK))
		})

		It("answers 400 for invalid requests, naming the problem", func() {
			res := api.exec(ns, sbx.Name, execio.Request{Command: []string{"echo"}, Shell: "echo"})
			Expect(res.status).To(Equal(http.StatusBadRequest))
			Expect(res.stdout.String()).To(ContainSubstring("exactly one of command and shell"))
			res = api.exec(ns, sbx.Name, execio.Request{Command: []string{"true"}, WorkingDir: "/proc/self/fd/7"})
			Expect(res.status).To(Equal(http.StatusBadRequest))
			resp := api.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: strings.NewReader("{not json")})
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
			resp.Body.Close()
			resp = api.do(request{method: http.MethodGet, namespace: ns, name: sbx.Name, subresource: "exec"})
			Expect(resp.StatusCode).To(Equal(http.StatusMethodNotAllowed))
			resp.Body.Close()
			// Uploads are POST; PUT is not an upload.
			resp = api.do(request{method: http.MethodPut, namespace: ns, name: sbx.Name, subresource: "files", query: "path=put",
				header: http.Header{"Content-Type": {subresource.ContentTypeBinary}}, body: strings.NewReader("x")})
			Expect(resp.StatusCode).To(Equal(http.StatusMethodNotAllowed))
			Expect(statusOf(resp).Message).To(ContainSubstring("POST"))
		})
	})

	Context("exec", func() {
		It("streams output as it arrives, in order, and reports the exit code", func() {
			res := api.exec(ns, sbx.Name, execio.Request{Shell: "echo one; sleep 1.5; echo two >&2; echo three; exit 3"})
			Expect(res.status).To(Equal(http.StatusOK))
			Expect(res.stdout.String()).To(Equal("one\nthree\n"))
			Expect(res.stderr.String()).To(Equal("two\n"))
			Expect(res.result.ExitCode).To(Equal(3))
			Expect(res.result.TimedOut).To(BeFalse())
			// The first line came before the command slept: most of its 1.5 s
			// sleep separates the first frame from the end (relative, so a
			// slow start does not fail it).
			Expect(res.total).To(BeNumerically(">", 1500*time.Millisecond))
			Expect(res.total-res.firstFrame).To(BeNumerically(">=", time.Second), "the first frame arrived only at the end")
		})

		It("kills the whole tree on timeout and says so", func() {
			baseline := api.exec(ns, sbx.Name, execio.Request{Command: []string{"true"}})
			Expect(baseline.status).To(Equal(http.StatusOK))
			res := api.exec(ns, sbx.Name, execio.Request{Shell: "sleep 1000 & sleep 1000", TimeoutSeconds: 1})
			Expect(res.status).To(Equal(http.StatusOK))
			Expect(res.result).NotTo(BeNil(), "error frame: %s", res.errorFrame)
			Expect(res.result.TimedOut).To(BeTrue())
			// Relative to a trivial exec just measured: the 1 s timeout plus
			// ten of those (at least 2 s); a tree not killed runs 1000 s.
			Expect(res.total).To(BeNumerically("<", time.Second+max(2*time.Second, 10*baseline.total)))
			recs, err := hist.Tail(string(sbx.UID), 1)
			Expect(err).NotTo(HaveOccurred())
			Expect(recs[0].Shell).To(Equal("sleep 1000 & sleep 1000"))
			Expect(recs[0].TimedOut).To(BeTrue())
			Eventually(sleepers(ns, sbx.Name), 5*time.Second).Should(Equal("0"))
		})

		It("caps a 100 MiB flood at the output limit with bounded memory", func() {
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			var peak uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					var m runtime.MemStats
					runtime.ReadMemStats(&m)
					peak = max(peak, m.HeapInuse)
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
			res := api.exec(ns, sbx.Name, execio.Request{Shell: "head -c 104857600 /dev/zero"})
			close(stop)
			<-sampled
			Expect(res.status).To(Equal(http.StatusOK))
			Expect(res.result.StdoutTruncated).To(BeTrue())
			Expect(res.result.StdoutBytes).To(BeNumerically("==", 100<<20))
			Expect(int64(res.stdout.Len())).To(BeNumerically("<=", execio.DefaultOutputLimit+4096))
			Expect(res.stdout.String()).To(ContainSubstring("truncated"))
			growth := int64(peak) - int64(before.HeapInuse)
			GinkgoWriter.Printf("heap in use grew by %d KiB during the flood\n", growth>>10)
			// The test itself keeps the capped 1 MiB of output.
			Expect(growth).To(BeNumerically("<", 8<<20))
		})

		It("refuses 8.8 M empty arguments with a typed 400 and bounded memory, before decoding them whole (High 3)", func() {
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			var peak uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					var m runtime.MemStats
					runtime.ReadMemStats(&m)
					peak = max(peak, m.HeapInuse)
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
			}()
			// {"command":["true","","",...]}: 26 MB on the wire, generated
			// as it is sent. On 90280d9 it decoded to over 250 MB of heap.
			const n = 8_800_000
			body := io.MultiReader(strings.NewReader(`{"command":["true"`),
				io.LimitReader(emptyArgs{}, 3*n), strings.NewReader(`]}`))
			resp := api.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: body})
			close(stop)
			<-sampled
			growth := int64(peak) - int64(before.HeapInuse)
			GinkgoWriter.Printf("heap in use grew by %d KiB for 8.8 M empty arguments\n", growth>>10)
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
			st := statusOf(resp)
			Expect(st.Reason).To(Equal(metav1.StatusReasonBadRequest))
			Expect(st.Message).To(ContainSubstring("command has more than the 4096 entries allowed"))
			Expect(growth).To(BeNumerically("<", 64<<20))
		})

		// High 3: the slot bounds how many requests decode at once, the
		// body budget how many bytes of them (mostly stdin) are held.
		It("takes a node-wide exec body budget before reading a body: one that does not fit gets a typed 429 unread, and the budget comes back after the request (High 3)", func() {
			const budget = 8 << 20
			budgeted := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient, execBodyBudget: budget}).start()
			body := func(stdin int, shell string) []byte {
				b, err := json.Marshal(execio.Request{Shell: shell, Stdin: bytes.Repeat([]byte("x"), stdin)})
				Expect(err).NotTo(HaveOccurred())
				return b
			}
			holder := body(4<<20, "wc -c; echo started; sleep 1000")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := budgeted.do(request{ctx: ctx, method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: bytes.NewReader(holder)})
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			frames := make(chan subresource.Frame, 10)
			go func() {
				defer GinkgoRecover()
				readFrames(resp.Body, func(f subresource.Frame) { frames <- f })
			}()
			Eventually(frames, 10*time.Second).Should(Receive(HaveField("Stream", subresource.StreamStdout)))

			// A declared body that does not fit is refused before a byte
			// of it is read: this one's bytes never come.
			never, neverW := io.Pipe()
			defer neverW.Close()
			refused := budgetedTry(budgeted, request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: never, contentLength: int64(len(holder))})
			Expect(refused.StatusCode).To(Equal(http.StatusTooManyRequests))
			st := statusOf(refused)
			Expect(st.Reason).To(Equal(metav1.StatusReasonTooManyRequests))
			Expect(subresource.HasCause(&st, subresource.CauseExecLimit)).To(BeTrue())
			Expect(st.Message).To(ContainSubstring("budget"))

			// An undeclared (chunked) body is refused as it crosses the
			// budget: these 3 MiB cross it, and the rest never comes.
			partial, partialW := io.Pipe()
			defer partialW.Close()
			go func() { _, _ = partialW.Write(holder[:3<<20]) }()
			// The server stops reading and closes the connection after its
			// 429, so an HTTP/1.1 client still writing may see the close
			// first; either way nothing ran, and the budget comes back
			// (checked below).
			chunked, err := tryWithin(budgeted, request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: partial})
			if err == nil {
				Expect(chunked.StatusCode).To(Equal(http.StatusTooManyRequests), lazyBody(chunked))
				Expect(statusOf(chunked).Message).To(ContainSubstring("budget"))
			} else {
				GinkgoWriter.Printf("the chunked request ended with %v\n", err)
			}

			// A body larger than the whole budget can never fit: 413.
			tooBig := budgeted.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: bytes.NewReader(body(7<<20, "true"))})
			Expect(tooBig.StatusCode).To(Equal(http.StatusRequestEntityTooLarge), lazyBody(tooBig))
			Expect(statusOf(tooBig).Reason).To(Equal(metav1.StatusReasonRequestEntityTooLarge))

			// Small requests still fit beside the holder.
			Expect(budgeted.exec(ns, sbx.Name, echo).status).To(Equal(http.StatusOK))

			// Once the holder ends, every byte comes back: a body of
			// nearly the whole budget fits again.
			cancel()
			resp.Body.Close()
			nearlyAll := body(5<<20+870<<10, "wc -c")
			Expect(len(nearlyAll)).To(BeNumerically(">", budget-(256<<10)))
			Expect(len(nearlyAll)).To(BeNumerically("<=", budget))
			Eventually(func() int {
				r := budgeted.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: bytes.NewReader(nearlyAll)})
				defer r.Body.Close()
				return r.StatusCode
			}, 20*time.Second, 200*time.Millisecond).Should(Equal(http.StatusOK))
		})

		It("holds the manager's heap under a flood of the largest stdin to the exec body budget (High 3)", func() {
			// One body, sent by every request: the client side holds it
			// once. 16 MiB of stdin, as base64 in JSON: about 21 MiB.
			flood := func(ts *testServer, n int) (growth int64, refused int) {
				payload, err := json.Marshal(execio.Request{Shell: "wc -c; sleep 2", Stdin: bytes.Repeat([]byte("x"), int(execio.MaxStdin))})
				Expect(err).NotTo(HaveOccurred())
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				var peak uint64
				stop := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					for {
						var m runtime.MemStats
						runtime.ReadMemStats(&m)
						peak = max(peak, m.HeapInuse)
						select {
						case <-stop:
							return
						case <-time.After(5 * time.Millisecond):
						}
					}
				}()
				var wg sync.WaitGroup
				codes := make([]int, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer GinkgoRecover()
						defer wg.Done()
						resp := ts.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: bytes.NewReader(payload)})
						codes[i] = resp.StatusCode
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}()
				}
				wg.Wait()
				close(stop)
				<-sampled
				for _, c := range codes {
					Expect(c).To(Or(Equal(http.StatusOK), Equal(http.StatusTooManyRequests)))
					if c == http.StatusTooManyRequests {
						refused++
					}
				}
				return int64(peak) - int64(before.HeapInuse), refused
			}
			const n = 8
			unbudgeted := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient}).start()
			budgeted := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient, execBodyBudget: nodeapi.DefaultExecBodyBudget}).start()
			withBudget, refused := flood(budgeted, n)
			GinkgoWriter.Printf("%d exec requests of 16 MiB stdin with the default body budget: heap in use grew by %d MiB at its peak, %d refused with 429; VmHWM %s\n",
				n, withBudget>>20, refused, vmHWM())
			without, _ := flood(unbudgeted, n)
			GinkgoWriter.Printf("%d exec requests of 16 MiB stdin without a body budget: heap in use grew by %d MiB at its peak; VmHWM %s\n",
				n, without>>20, vmHWM())
			Expect(refused).To(BeNumerically(">", 0))
			// Three bodies of about 21 MiB fit in 64 MiB; each is held
			// decoded and once more while it goes to the helper.
			Expect(withBudget).To(BeNumerically("<", 256<<20))
		})

		It("runs 50 commands at once", func() {
			var wg sync.WaitGroup
			results := make([]*execResult, 50)
			for i := range results {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					results[i] = api.exec(ns, sbx.Name, execio.Request{Command: []string{"echo", fmt.Sprint(i)}})
				}()
			}
			wg.Wait()
			for i, res := range results {
				Expect(res.status).To(Equal(http.StatusOK), "exec %d: %s", i, res.stdout.String())
				Expect(res.stdout.String()).To(Equal(fmt.Sprintf("%d\n", i)))
				Expect(res.result.ExitCode).To(Equal(0))
			}
		})

		It("stops the command when the caller disconnects", func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body, _ := json.Marshal(execio.Request{Shell: "echo started; sleep 1000"})
			resp := api.do(request{ctx: ctx, method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "exec", body: bytes.NewReader(body)})
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			line := make([]byte, 4096)
			n, err := resp.Body.Read(line)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(line[:n])).To(ContainSubstring(`"stream":"stdout"`))
			Expect(sleepers(ns, sbx.Name)()).To(Equal("1"))
			cancel()
			resp.Body.Close()
			Eventually(sleepers(ns, sbx.Name), 10*time.Second, 200*time.Millisecond).Should(Equal("0"))
			Eventually(func() string {
				recs, _ := hist.Tail(string(sbx.UID), 10)
				for _, r := range recs {
					if r.Shell == "echo started; sleep 1000" {
						return r.Error
					}
				}
				return ""
			}, 10*time.Second).Should(ContainSubstring("disconnected"))
		})
	})

	Context("files", func() {
		upload := func(path, contentType string, body []byte, extra string) *http.Response {
			q := "path=" + url.QueryEscape(path)
			if extra != "" {
				q += "&" + extra
			}
			return api.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: "files", query: q,
				header: http.Header{"Content-Type": {contentType}}, body: bytes.NewReader(body)})
		}
		get := func(path string) *http.Response {
			return api.do(request{method: http.MethodGet, namespace: ns, name: sbx.Name, subresource: "files", query: "path=" + url.QueryEscape(path)})
		}

		It("round-trips a tar tree byte for byte", func() {
			files := map[string][]byte{"a.txt": []byte("hello\n"), "sub/b.bin": randomBytes(300 << 10), "sub/deeper/c": {}, "sub/deeper/d.bin": randomBytes(4 << 20)}
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			Expect(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "sub/", Mode: 0o755})).To(Succeed())
			Expect(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "sub/deeper/", Mode: 0o755})).To(Succeed())
			for name, data := range files {
				Expect(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o640, Size: int64(len(data))})).To(Succeed())
				_, err := tw.Write(data)
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(tw.Close()).To(Succeed())
			resp := upload("tree", subresource.ContentTypeTar, buf.Bytes(), "")
			Expect(resp.StatusCode).To(Equal(http.StatusOK), lazyBody(resp))
			var stats execio.TransferStats
			Expect(json.NewDecoder(resp.Body).Decode(&stats)).To(Succeed())
			resp.Body.Close()
			Expect(stats.Files).To(Equal(len(files)))

			resp = get("/app/tree")
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			Expect(resp.Header.Get("Content-Type")).To(Equal(subresource.ContentTypeTar))
			got := untar(resp.Body)
			resp.Body.Close()
			Expect(resp.Trailer.Get(subresource.TrailerTransferError)).To(BeEmpty())
			for name, data := range files {
				Expect(got).To(HaveKey("tree/"+name), "entries: %v", keys(got))
				Expect(bytes.Equal(got["tree/"+name], data)).To(BeTrue(), "content of %s differs", name)
			}
		})

		It("writes a single file with its mode and reads it back", func() {
			data := randomBytes(123457)
			resp := upload("single/dir/file.bin", subresource.ContentTypeBinary, data, "mode=0600")
			Expect(resp.StatusCode).To(Equal(http.StatusOK), lazyBody(resp))
			resp.Body.Close()
			res := api.exec(ns, sbx.Name, execio.Request{Command: []string{"stat", "-c", "%a %s", "/app/single/dir/file.bin"}})
			Expect(res.stdout.String()).To(Equal(fmt.Sprintf("600 %d\n", len(data))))
			resp = get("single/dir/file.bin")
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			got := untar(resp.Body)
			resp.Body.Close()
			Expect(got).To(HaveKey("file.bin"))
			Expect(bytes.Equal(got["file.bin"], data)).To(BeTrue())
		})

		DescribeTable("refuses paths outside the sandbox's directories with 400",
			func(path string) {
				resp := get(path)
				Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), path)
				st := statusOf(resp)
				Expect(st.Message).To(ContainSubstring("invalid path"))
				Expect(st.Reason).To(Equal(metav1.StatusReasonBadRequest))
				Expect(subresource.HasCause(&st, subresource.CauseInvalidPath)).To(BeTrue())
				resp = upload(path, subresource.ContentTypeBinary, []byte("x"), "")
				Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), path)
				resp.Body.Close()
			},
			Entry("parent escape", "../etc/passwd"),
			Entry("absolute outside", "/etc/passwd"),
			Entry("nested escape", "a/../../x"),
			Entry("empty", ""),
			Entry("NUL", "a\x00b"),
		)

		It("never follows a symlink out of the sandbox's directories", func() {
			res := api.exec(ns, sbx.Name, execio.Request{Shell: "ln -s / /app/out && ln -s /etc /app/etc-link && echo ok"})
			Expect(res.stdout.String()).To(Equal("ok\n"))
			for _, p := range []string{"out/etc/passwd", "etc-link/passwd"} {
				resp := get(p)
				body := readAll(resp)
				Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "GET %s answered %d: %q", p, resp.StatusCode, body)
				Expect(body).NotTo(ContainSubstring("root:x:0:0"))
			}
			// The link itself may be downloaded, as a link: never its target.
			resp := get("etc-link")
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			tr := tar.NewReader(resp.Body)
			h, err := tr.Next()
			Expect(err).NotTo(HaveOccurred())
			Expect(h.Typeflag).To(Equal(byte(tar.TypeSymlink)))
			_, err = tr.Next()
			Expect(err).To(Equal(io.EOF))
			resp.Body.Close()
			for _, p := range []string{"out/tmp/escaped", "etc-link/escaped"} {
				resp := upload(p, subresource.ContentTypeBinary, []byte("x"), "")
				Expect(resp.StatusCode).To(BeNumerically(">=", 400), "POST %s", p)
				resp.Body.Close()
			}
			res = api.exec(ns, sbx.Name, execio.Request{Shell: "ls /tmp/escaped /etc/escaped 2>&1 | grep -c 'No such file'"})
			Expect(res.stdout.String()).To(Equal("2\n"))
		})

		It("refuses uploads and downloads beyond the transfer limit with 413", func() {
			resp := upload("too-big", subresource.ContentTypeBinary, make([]byte, testTransferLimit+1), "")
			Expect(resp.StatusCode).To(Equal(http.StatusRequestEntityTooLarge))
			resp.Body.Close()
			res := api.exec(ns, sbx.Name, execio.Request{Shell: fmt.Sprintf("head -c %d /dev/zero > /app/big && echo ok", testTransferLimit+(1<<20))})
			Expect(res.stdout.String()).To(Equal("ok\n"))
			resp = get("big")
			if resp.StatusCode == http.StatusOK {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				Expect(resp.Trailer.Get(subresource.TrailerTransferError)).To(ContainSubstring("too large"))
				Expect(resp.Trailer.Get(subresource.TrailerTransferErrorReason)).To(Equal(string(metav1.StatusReasonRequestEntityTooLarge)))
			} else {
				Expect(resp.StatusCode).To(Equal(http.StatusRequestEntityTooLarge))
				resp.Body.Close()
			}
		})

		It("answers 404 for a path that does not exist", func() {
			resp := get("no/such/file")
			Expect(resp.StatusCode).To(Equal(http.StatusNotFound), lazyBody(resp))
			st := statusOf(resp)
			Expect(st.Reason).To(Equal(metav1.StatusReasonNotFound))
			Expect(subresource.HasCause(&st, subresource.CausePathNotFound)).To(BeTrue())
			Expect(st.Details.Name).To(Equal(sbx.Name))
		})
	})

	Context("logs and history", func() {
		It("tails and follows the container's output", func() {
			talker := waitReady(createSandbox(ns, uniqueName("talker"), func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Command = []string{"sh", "-c", `echo first; i=0; while true; do i=$((i+1)); echo "tick $i"; sleep 0.2; done`}
			}))
			Eventually(func() string {
				resp := api.do(request{method: http.MethodGet, namespace: ns, name: talker.Name, subresource: "log"})
				return readAll(resp)
			}, 10*time.Second).Should(ContainSubstring("tick 3"))
			resp := api.do(request{method: http.MethodGet, namespace: ns, name: talker.Name, subresource: "log", query: "tail=1"})
			Expect(strings.Count(readAll(resp), "\n")).To(Equal(1))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp = api.do(request{ctx: ctx, method: http.MethodGet, namespace: ns, name: talker.Name, subresource: "log", query: "tail=1&follow=true"})
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			var seen bytes.Buffer
			buf := make([]byte, 1024)
			Eventually(func() int {
				n, _ := resp.Body.Read(buf)
				seen.Write(buf[:n])
				return strings.Count(seen.String(), "tick")
			}, 10*time.Second).Should(BeNumerically(">=", 4))
			cancel()
			resp.Body.Close()
		})

		It("tails and follows the exec history", func() {
			h := waitReady(createSandbox(ns, uniqueName("hist")))
			for i := range 3 {
				Expect(api.exec(ns, h.Name, execio.Request{Command: []string{"echo", fmt.Sprint(i)}}).status).To(Equal(http.StatusOK))
			}
			resp := api.do(request{method: http.MethodGet, namespace: ns, name: h.Name, subresource: "history", query: "tail=2"})
			Expect(resp.Header.Get("Content-Type")).To(Equal(subresource.ContentTypeNDJSON))
			recs := decodeRecords(resp.Body)
			resp.Body.Close()
			Expect(recs).To(HaveLen(2))
			Expect(recs[0].Command).To(Equal([]string{"echo", "1"}))
			Expect(recs[1].Command).To(Equal([]string{"echo", "2"}))
			Expect(recs[1].Caller).To(Equal(runner.user))
			Expect(recs[1].ExitCode).To(Equal(0))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp = api.do(request{ctx: ctx, method: http.MethodGet, namespace: ns, name: h.Name, subresource: "history", query: "tail=1&follow=true"})
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			lines := make(chan history.Record, 10)
			go func() {
				defer GinkgoRecover()
				dec := json.NewDecoder(resp.Body)
				for {
					var r history.Record
					if dec.Decode(&r) != nil {
						return
					}
					lines <- r
				}
			}()
			Eventually(lines, 5*time.Second).Should(Receive(WithTransform(func(r history.Record) []string { return r.Command }, Equal([]string{"echo", "2"}))))
			Expect(api.exec(ns, h.Name, execio.Request{Command: []string{"false"}}).status).To(Equal(http.StatusOK))
			var next history.Record
			Eventually(lines, 5*time.Second).Should(Receive(&next))
			Expect(next.Command).To(Equal([]string{"false"}))
			Expect(next.ExitCode).To(Equal(1))
			cancel()
			resp.Body.Close()
		})

		// Low 15: a follow lasts until its caller leaves, so followers are
		// counted per Sandbox and per node like execs.
		Context("followers (Low 15)", func() {
			var chatty *sandboxv1alpha1.Sandbox
			BeforeAll(func() {
				chatty = waitReady(createSandbox(ns, uniqueName("followed"), func(s *sandboxv1alpha1.Sandbox) {
					s.Spec.Command = []string{"sh", "-c", "echo hello; exec sleep 3600"}
				}))
			})
			// follow opens a followed stream of subresource (log or
			// history) on ts; cancel ends it.
			follow := func(ts *testServer, name, subresource string) (*http.Response, context.CancelFunc) {
				GinkgoHelper()
				ctx, cancel := context.WithCancel(context.Background())
				DeferCleanup(cancel)
				resp := ts.do(request{ctx: ctx, method: http.MethodGet, namespace: ns, name: name, subresource: subresource, query: "tail=1&follow=true"})
				return resp, func() { cancel(); resp.Body.Close() }
			}
			expectFollowLimit := func(resp *http.Response, scope string) {
				GinkgoHelper()
				Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))
				Expect(resp.Header.Get("Retry-After")).To(Equal("1"))
				st := statusOf(resp)
				Expect(st.Reason).To(Equal(metav1.StatusReasonTooManyRequests))
				Expect(subresource.HasCause(&st, subresource.CauseFollowLimit)).To(BeTrue(), "%+v", st)
				Expect(st.Message).To(ContainSubstring("this " + scope + " already has"))
			}

			It("refuses the follower past the per-Sandbox limit with a typed 429, and frees its slot when a follower disconnects", func() {
				limited := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient, maxFollowersPer: 2}).start()
				logResp, stopLog := follow(limited, chatty.Name, "log")
				Expect(logResp.StatusCode).To(Equal(http.StatusOK))
				histResp, stopHist := follow(limited, chatty.Name, "history")
				Expect(histResp.StatusCode).To(Equal(http.StatusOK))
				defer stopHist()

				for _, sub := range []string{"log", "history"} {
					refused, stop := follow(limited, chatty.Name, sub)
					expectFollowLimit(refused, "sandbox")
					stop()
				}
				// Reading without follow ends by itself and is not limited.
				Expect(readAll(limited.do(request{method: http.MethodGet, namespace: ns, name: chatty.Name, subresource: "log", query: "tail=1"}))).To(Equal("hello\n"))
				// Another Sandbox has slots of its own.
				other, stopOther := follow(limited, sbx.Name, "history")
				Expect(other.StatusCode).To(Equal(http.StatusOK))
				stopOther()

				// The log follower leaves: its slot comes back.
				stopLog()
				Eventually(func() int {
					resp, stop := follow(limited, chatty.Name, "history")
					defer stop()
					return resp.StatusCode
				}, 10*time.Second, 100*time.Millisecond).Should(Equal(http.StatusOK))
			})

			It("refuses the follower past the node-wide limit, and frees the slot of a Sandbox's followers when it is deleted", func() {
				limited := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient, maxFollowers: 1}).start()
				doomed := waitReady(createSandbox(ns, uniqueName("doomed")))
				Expect(api.exec(ns, doomed.Name, echo).status).To(Equal(http.StatusOK))
				held, stopHeld := follow(limited, doomed.Name, "history")
				defer stopHeld()
				Expect(held.StatusCode).To(Equal(http.StatusOK))
				refused, stop := follow(limited, sbx.Name, "history")
				expectFollowLimit(refused, "node")
				stop()

				// Deleting the Sandbox deletes its history, which ends the
				// follower with a NotFound Status line and frees its slot.
				lines := make(chan string, 10)
				go func() {
					defer GinkgoRecover()
					defer close(lines)
					sc := bufio.NewScanner(held.Body)
					for sc.Scan() {
						lines <- sc.Text()
					}
				}()
				Expect(k8sClient.Delete(context.Background(), doomed)).To(Succeed())
				var last string
				Eventually(func() bool {
					for {
						select {
						case l, ok := <-lines:
							if !ok {
								return true
							}
							last = l
						default:
							return false
						}
					}
				}, 60*time.Second, 100*time.Millisecond).Should(BeTrue(), "the follower's stream ends with its Sandbox")
				var st metav1.Status
				Expect(json.Unmarshal([]byte(last), &st)).To(Succeed())
				Expect(st.Reason).To(Equal(metav1.StatusReasonNotFound), last)
				Expect(st.Message).To(ContainSubstring("was deleted"))
				Eventually(func() int {
					resp, stop := follow(limited, sbx.Name, "history")
					defer stop()
					return resp.StatusCode
				}, 10*time.Second, 100*time.Millisecond).Should(Equal(http.StatusOK))
			})
		})

		It("deletes the history when the Sandbox is deleted", func() {
			h := waitReady(createSandbox(ns, uniqueName("gone")))
			Expect(api.exec(ns, h.Name, echo).status).To(Equal(http.StatusOK))
			Expect(hist.Tail(string(h.UID), 0)).To(HaveLen(1))
			Expect(k8sClient.Delete(context.Background(), h)).To(Succeed())
			Eventually(func() bool {
				err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(h), &sandboxv1alpha1.Sandbox{})
				return client.IgnoreNotFound(err) == nil && err != nil
			}, 30*time.Second).Should(BeTrue())
			Expect(hist.Tail(string(h.UID), 0)).To(BeEmpty())
		})
	})

	It("keeps the endpoint of a Sandbox that stopped running, serving its logs and history but not exec", func() {
		h := waitReady(createSandbox(ns, uniqueName("exits"), func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sh", "-c", "echo last words; sleep 3; exit 4"}
		}))
		Expect(h.Status.NodeAPIEndpoint).To(Equal(api.Endpoint))
		Expect(api.exec(ns, h.Name, echo).status).To(Equal(http.StatusOK))
		Eventually(readyReason(h), 30*time.Second).Should(Equal("False/ContainerExited"))
		// The endpoint is the node's: the aggregated API server still needs
		// it to reach the logs and history of the dead container.
		latest := getSandbox(h)
		Expect(latest.Status.NodeAPIEndpoint).To(Equal(api.Endpoint))
		Expect(api.exec(ns, h.Name, echo).status).To(Equal(http.StatusConflict))
		resp := api.do(request{method: http.MethodGet, namespace: ns, name: h.Name, subresource: "log"})
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(readAll(resp)).To(ContainSubstring("last words"))
		resp = api.do(request{method: http.MethodGet, namespace: ns, name: h.Name, subresource: "history"})
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		recs := decodeRecords(resp.Body)
		resp.Body.Close()
		Expect(recs).To(HaveLen(1))
		Expect(recs[0].Command).To(Equal(echo.Command))
	})
})

// setStatus forges a Sandbox's status as if nodeName ran it with
// containerID, Ready.
func setStatus(sbx *sandboxv1alpha1.Sandbox, node, containerID string) {
	GinkgoHelper()
	Eventually(func() error {
		latest := getSandbox(sbx)
		latest.Status.NodeName = node
		latest.Status.ContainerID = containerID
		meta.SetStatusCondition(&latest.Status.Conditions, metav1.Condition{
			Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionTrue,
			Reason: sandboxv1alpha1.SandboxReasonRunning, Message: "forged by the test",
		})
		return k8sClient.Status().Update(context.Background(), latest)
	}, 10*time.Second).Should(Succeed())
	// The servers read through their caches or the API directly; wait
	// until the API shows it.
	Eventually(func() string { return getSandbox(sbx).Status.NodeName }).Should(Equal(node))
}

// sleepers counts `sleep 1000` processes in the sandbox.
// setPausedSpec writes spec.paused, retrying on conflicts with the
// manager's writes.
func setPausedSpec(sbx *sandboxv1alpha1.Sandbox, paused bool) {
	GinkgoHelper()
	Eventually(func() error {
		s := getSandbox(sbx)
		s.Spec.Paused = paused
		return k8sClient.Update(context.Background(), s)
	}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
}

func sleepers(ns, name string) func() string {
	return func() string {
		res := api.exec(ns, name, execio.Request{Shell: "ps -o args | grep -c '^[s]leep 1000'"})
		return strings.TrimSpace(res.stdout.String())
	}
}

func historyLen(sbx *sandboxv1alpha1.Sandbox) int {
	GinkgoHelper()
	recs, err := hist.Tail(string(sbx.UID), 0)
	Expect(err).NotTo(HaveOccurred())
	return len(recs)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// lazyBody describes a failed expectation with the response body, read only
// when the expectation fails.
func lazyBody(resp *http.Response) func() string {
	return func() string { return readAll(resp) }
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

func untar(r io.Reader) map[string][]byte {
	GinkgoHelper()
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			Expect(err).NotTo(HaveOccurred())
			out[strings.TrimPrefix(h.Name, "./")] = data
		}
	}
}

func keys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func decodeRecords(r io.Reader) []history.Record {
	GinkgoHelper()
	var recs []history.Record
	dec := json.NewDecoder(r)
	for {
		var rec history.Record
		if err := dec.Decode(&rec); err != nil {
			Expect(err).To(Equal(io.EOF))
			return recs
		}
		recs = append(recs, rec)
	}
}

// budgetedTry sends r and returns the response, which may come before
// r's body was sent at all.
func budgetedTry(ts *testServer, r request) *http.Response {
	GinkgoHelper()
	resp, err := tryWithin(ts, r)
	Expect(err).NotTo(HaveOccurred())
	return resp
}

// tryWithin is ts.try, failing the spec rather than hanging if no answer
// comes within 10 s (r's body may never end).
func tryWithin(ts *testServer, r request) (*http.Response, error) {
	GinkgoHelper()
	type out struct {
		resp *http.Response
		err  error
	}
	got := make(chan out, 1)
	go func() {
		resp, err := ts.try(r)
		got <- out{resp, err}
	}()
	var o out
	Eventually(got, 10*time.Second).Should(Receive(&o), "the server waited for a body it should have refused")
	return o.resp, o.err
}

// vmHWM is this process's peak resident set size, from /proc/self/status.
func vmHWM() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// emptyArgs reads as an endless ,"",""... without holding it.
type emptyArgs struct{}

func (emptyArgs) Read(p []byte) (int, error) {
	n := len(p) - len(p)%3
	for i := 0; i < n; i += 3 {
		p[i], p[i+1], p[i+2] = ',', '"', '"'
	}
	return n, nil
}
