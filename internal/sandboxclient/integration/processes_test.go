/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package integration_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

var _ = Describe("background processes through the API server and the aggregated API", Ordered, Label("integration"), func() {
	var (
		ns  string
		ctx context.Context
	)

	BeforeAll(func() {
		ns = newNamespace()
		waitReady(createSandbox(ns, "bg"))
		waitReady(createSandbox(ns, "bg-other"))
	})
	BeforeEach(func() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
		DeferCleanup(cancel)
	})

	It("runs a command past a short client timeout and reads it back in full through its handle, with the shipped exec role", func() {
		bind(ns, execRole, saSubject(ns, "agent"))
		c := newClient(serviceAccountConfig(ns, "agent"))
		ref := sandboxclient.Named(ns, "bg")
		var st execio.ProcessStatus
		Eventually(func() error {
			var err error
			st, err = c.StartProcess(ctx, ref, shell("echo begin; sleep 4; echo end; exit 9"), 0)
			return err
		}, 10*time.Second, 500*time.Millisecond).Should(Succeed())
		Expect(st.State).To(Equal(execio.ProcessRunning))

		// A client whose calls last at most 2 s: each wait returns in
		// time, and the handle carries the command past them.
		var out execio.ProcessOutput
		var stdout []byte
		for i := 0; ; i++ {
			Expect(i).To(BeNumerically("<", 30), "the command never ended")
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			out, err = c.WaitProcess(short, ref, st.Handle, int64(len(stdout)), 0, time.Second)
			cancel()
			Expect(err).NotTo(HaveOccurred())
			stdout = append(stdout, out.Stdout.Data...)
			if out.State != execio.ProcessRunning {
				break
			}
		}
		Expect(string(stdout)).To(Equal("begin\nend\n"))
		Expect(*out.ExitCode).To(Equal(9))

		list, err := c.ListProcesses(ctx, ref)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(ContainElement(HaveField("Handle", st.Handle)))
	})

	It("writes stdin, kills the tree, and types its refusals", func() {
		ref := sandboxclient.Named(ns, "bg")
		st, err := admin().StartProcess(ctx, ref, execio.Request{Command: []string{"sh", "-c", "cat; sleep 600"}}, 0)
		Expect(err).NotTo(HaveOccurred())
		_, err = admin().WriteProcessStdin(ctx, ref, st.Handle, []byte("hello\n"), true)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() string {
			out, err := admin().PollProcess(ctx, ref, st.Handle, 0, 0)
			Expect(err).NotTo(HaveOccurred())
			return string(out.Stdout.Data)
		}, 10*time.Second, 100*time.Millisecond).Should(Equal("hello\n"))
		// Another sandbox's handle is nothing there.
		_, err = admin().KillProcess(ctx, sandboxclient.Named(ns, "bg-other"), st.Handle)
		Expect(sandboxclient.IsProcessNotFound(err)).To(BeTrue(), "%v", err)
		_, err = admin().PollProcess(ctx, ref, "../../x", 0, 0)
		Expect(sandboxclient.IsProcessNotFound(err)).To(BeTrue(), "%v", err)
		killed, err := admin().KillProcess(ctx, ref, st.Handle)
		Expect(err).NotTo(HaveOccurred())
		Expect(*killed.ExitCode).To(Equal(137))
		_, err = admin().WriteProcessStdin(ctx, ref, st.Handle, []byte("x"), false)
		Expect(sandboxclient.IsProcessExited(err)).To(BeTrue(), "%v", err)
	})
})

func admin() *sandboxclient.Client { return newClient(cfg) }
