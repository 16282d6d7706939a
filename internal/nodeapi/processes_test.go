/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

var _ = Describe("Node API: background processes", Ordered, ContinueOnFailure, func() {
	var (
		ns         string
		sbx, other *sandboxv1alpha1.Sandbox
	)

	BeforeAll(func() {
		ns = newNamespace()
		sbx = createSandbox(ns, uniqueName("procs"))
		other = createSandbox(ns, uniqueName("procs-other"))
		sbx, other = waitReady(sbx), waitReady(other)
	})

	// call POSTs a processes request; it returns the status code and the
	// decoded answer (or the Status of a refusal).
	call := func(ts *testServer, name string, preq execio.ProcessRequest) (int, execio.ProcessResponse, metav1.Status) {
		GinkgoHelper()
		body, err := json.Marshal(preq)
		Expect(err).NotTo(HaveOccurred())
		resp := ts.do(request{method: http.MethodPost, namespace: ns, name: name, subresource: subresource.SubresourceProcesses, body: bytes.NewReader(body)})
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, execio.ProcessResponse{}, statusOf(resp)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		var out execio.ProcessResponse
		Expect(json.Unmarshal(data, &out)).To(Succeed(), string(data))
		return resp.StatusCode, out, metav1.Status{}
	}
	start := func(ts *testServer, name string, req execio.Request) execio.ProcessStatus {
		GinkgoHelper()
		raw, err := json.Marshal(req)
		Expect(err).NotTo(HaveOccurred())
		code, out, st := call(ts, name, execio.ProcessRequest{Action: execio.ProcessActionStart, Command: raw})
		Expect(code).To(Equal(http.StatusOK), "%+v", st)
		Expect(out.Process).NotTo(BeNil())
		return *out.Process
	}

	It("starts a command that outlives the request and the manager, and a restarted manager reads back its full output and exit code", func() {
		// The manager that starts it, with its own Docker client (and so
		// its own resident helper).
		firstRuntime, err := dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		first := newTestServer(serverOptions{node: nodeName, runtime: firstRuntime, reader: k8sClient})
		stopFirst, stopped := context.WithCancel(context.Background())
		firstDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(firstDone)
			Expect(first.Runnable.Start(stopFirst)).To(Succeed())
		}()
		began := time.Now()
		st := start(first, sbx.Name, execio.Request{Shell: `for i in 1 2 3; do echo line $i; sleep 1; done; echo bye >&2; exit 4`, WorkingDir: "/tmp"})
		Expect(time.Since(began)).To(BeNumerically("<", 2*time.Second), "start returns at once")
		Expect(st.State).To(Equal(execio.ProcessRunning))
		Expect(st.Handle).To(HavePrefix("p-"))
		// The manager goes away (its server, its Docker client, its
		// resident helper's exec stream).
		stopped()
		Eventually(firstDone, 10*time.Second).Should(BeClosed())
		Expect(firstRuntime.Close()).To(Succeed())

		secondRuntime, err := dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		defer secondRuntime.Close()
		second := newTestServer(serverOptions{node: nodeName, runtime: secondRuntime, reader: k8sClient}).start()
		code, out, status := call(second, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionWait, Handle: st.Handle, TimeoutMillis: 20000})
		Expect(code).To(Equal(http.StatusOK), "%+v", status)
		Expect(out.Output.State).To(Equal(execio.ProcessExited))
		Expect(*out.Output.ExitCode).To(Equal(4))
		Expect(string(out.Output.Stdout.Data)).To(Equal("line 1\nline 2\nline 3\n"))
		Expect(string(out.Output.Stderr.Data)).To(Equal("bye\n"))
		code, out, _ = call(second, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionList})
		Expect(code).To(Equal(http.StatusOK))
		Expect(out.Processes).To(ContainElement(HaveField("Handle", st.Handle)))
	})

	It("polls new output by offset, writes stdin, and kills the whole tree", func() {
		st := start(api, sbx.Name, execio.Request{Shell: "read x; echo got $x; sh -c 'sleep 3001 &'; setsid sleep 3002 & sleep 3003"})
		code, out, status := call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionStdin, Handle: st.Handle, Stdin: []byte("abc\n")})
		Expect(code).To(Equal(http.StatusOK), "%+v", status)
		Eventually(func() string {
			_, out, _ = call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionPoll, Handle: st.Handle})
			return string(out.Output.Stdout.Data)
		}).WithTimeout(10 * time.Second).Should(Equal("got abc\n"))
		_, out, _ = call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionPoll, Handle: st.Handle, StdoutOffset: out.Output.Stdout.Next})
		Expect(out.Output.Stdout.Data).To(BeEmpty())
		code, out, status = call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionKill, Handle: st.Handle})
		Expect(code).To(Equal(http.StatusOK), "%+v", status)
		Expect(*out.Process.ExitCode).To(Equal(137))
		res := api.exec(ns, sbx.Name, execio.Request{Shell: "ps -o args | grep '[s]leep 300' || true"})
		Expect(res.stdout.String()).To(BeEmpty(), "the tree survived the kill")
		code, _, status = call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionStdin, Handle: st.Handle, Stdin: []byte("x")})
		Expect(code).To(Equal(http.StatusConflict))
		Expect(subresource.HasCause(&status, subresource.CauseProcessExited)).To(BeTrue(), "%+v", status)
	})

	It("refuses another sandbox's handle, garbage and path-like handles with a typed 404", func() {
		st := start(api, sbx.Name, execio.Request{Command: []string{"sleep", "60"}})
		defer call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionKill, Handle: st.Handle})
		for _, h := range []string{st.Handle, "../../../etc", "..", "a/b", strings.Repeat("x", 100), "p-nope"} {
			code, _, status := call(api, other.Name, execio.ProcessRequest{Action: execio.ProcessActionKill, Handle: h})
			Expect(code).To(Equal(http.StatusNotFound), "handle %q: %+v", h, status)
			Expect(status.Reason).To(Equal(metav1.StatusReasonNotFound))
			Expect(subresource.HasCause(&status, subresource.CauseProcessNotFound)).To(BeTrue(), "handle %q: %+v", h, status)
		}
		_, out, _ := call(api, sbx.Name, execio.ProcessRequest{Action: execio.ProcessActionPoll, Handle: st.Handle})
		Expect(out.Output.State).To(Equal(execio.ProcessRunning), "the other sandbox's calls did not touch it")
	})

	It("answers 400 for malformed requests, naming the problem", func() {
		for _, c := range []struct {
			body, want string
		}{
			{`{"action":"explode"}`, "unknown processes action"},
			{`{"action":"start","handle":"p-1","command":{"command":["true"]}}`, "server mints handles"},
			{`{"action":"start"}`, "command is required"},
			{`{"action":"wait","handle":"p-1","timeoutMillis":3600000}`, "timeoutMillis"},
			{`{"action":"poll","handle":"p-1","stdin":"eA=="}`, "only the stdin action"},
			{`{"action":"start","command":{"command":["true"],"stdin":"eA=="}}`, "no stdin"},
			{`{"action":"list","bogus":1}`, "unknown field"},
		} {
			resp := api.do(request{method: http.MethodPost, namespace: ns, name: sbx.Name, subresource: subresource.SubresourceProcesses, body: strings.NewReader(c.body)})
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), c.body)
			Expect(statusOf(resp).Message).To(ContainSubstring(c.want), c.body)
		}
	})

	It("keeps a Sandbox whose background process runs from its idle pause (spec.lifecycle), and pauses it after the process ends", func() {
		idle := waitReady(createSandbox(ns, uniqueName("procs-idle"), func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Lifecycle = &sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](1)}
		}))
		st := start(api, idle.Name, execio.Request{Command: []string{"sleep", "6"}})
		Expect(st.State).To(Equal(execio.ProcessRunning))
		started := time.Now()
		Consistently(func() bool {
			ct, err := docker.Inspect(context.Background(), idle.Status.ContainerID)
			return err == nil && !ct.State.Paused
		}, 5*time.Second, 200*time.Millisecond).Should(BeTrue(), "frozen while its background process ran")
		Eventually(func() string {
			c := meta.FindStatusCondition(getSandbox(idle).Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
			if c == nil {
				return ""
			}
			return string(c.Status) + "/" + c.Reason
		}, 20*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
		Expect(time.Since(started)).To(BeNumerically(">=", 6*time.Second), "paused before the background process ended")
	})

	It("refuses a start past the sandbox's limit with a typed 429", func() {
		var started []string
		defer func() {
			for _, h := range started {
				call(api, other.Name, execio.ProcessRequest{Action: execio.ProcessActionKill, Handle: h})
			}
		}()
		for range execio.MaxProcesses {
			started = append(started, start(api, other.Name, execio.Request{Command: []string{"sleep", "120"}}).Handle)
		}
		raw, _ := json.Marshal(execio.Request{Command: []string{"true"}})
		code, _, status := call(api, other.Name, execio.ProcessRequest{Action: execio.ProcessActionStart, Command: raw})
		Expect(code).To(Equal(http.StatusTooManyRequests))
		Expect(subresource.HasCause(&status, subresource.CauseProcessLimit)).To(BeTrue(), "%+v", status)
		Expect(status.Message).To(ContainSubstring("limit"))
	})
})
