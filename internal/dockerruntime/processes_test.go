/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"errors"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Background processes", dockerLabel, Ordered, ContinueOnFailure, func() {
	var ct, other Container

	BeforeAll(func(ctx SpecContext) {
		ct, _ = startSandbox(ctx, nil)
		other, _ = startSandbox(ctx, nil)
	}, NodeTimeout(60*time.Second))

	It("outlives the client that started it: a new client reads its full output and exit code", func(ctx SpecContext) {
		first, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		h := NewProcessHandle()
		st, err := first.StartProcess(ctx, ct.ID, h, execio.Request{Shell: `echo "start $FOO in $PWD"; sleep 3; echo end; echo oops >&2; exit 5`, Env: []string{"FOO=bar"}, WorkingDir: "/tmp"}, 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Handle).To(Equal(h))
		Expect(st.State).To(Equal(execio.ProcessRunning))
		// The manager restarts: its resident helper's exec ends with it.
		Expect(first.Close()).To(Succeed())

		out, err := rt.WaitProcess(ctx, ct.ID, h, ProcessOffsets{}, 200*time.Millisecond)
		Expect(err).NotTo(HaveOccurred())
		Expect(out.State).To(Equal(execio.ProcessRunning), "a short wait returns while it runs")
		Expect(string(out.Stdout.Data)).To(Equal("start bar in /tmp\n"))
		out, err = rt.WaitProcess(ctx, ct.ID, h, ProcessOffsets{Stdout: out.Stdout.Next}, 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect(out.State).To(Equal(execio.ProcessExited))
		Expect(*out.ExitCode).To(Equal(5))
		Expect(string(out.Stdout.Data)).To(Equal("end\n"))
		Expect(string(out.Stderr.Data)).To(Equal("oops\n"))
		list, err := rt.ListProcesses(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(ContainElement(HaveField("Handle", h)))
	})

	It("kills the whole tree, a grandchild in its own session too", func(ctx SpecContext) {
		h := NewProcessHandle()
		_, err := rt.StartProcess(ctx, ct.ID, h, execio.Request{Shell: "setsid sh -c 'sleep 4011' & sh -c 'sleep 4012 &'; sleep 4013"}, 0)
		Expect(err).NotTo(HaveOccurred())
		sleeps := func() []string {
			var out []string
			for _, line := range survivors(ctx, ct.ID, "sleep 401") {
				if strings.HasPrefix(line, "sleep 401") {
					out = append(out, line)
				}
			}
			return out
		}
		Eventually(sleeps).WithTimeout(10 * time.Second).Should(HaveLen(3))
		st, err := rt.KillProcess(ctx, ct.ID, h)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.State).To(Equal(execio.ProcessExited))
		Expect(*st.ExitCode).To(Equal(helperproto.ExitKilled))
		Expect(survivors(ctx, ct.ID, "sleep 401")).To(BeEmpty(), "the tree, the runner and the supervisor are gone")
		Expect(zombies(ctx, ct.ID)).To(BeZero())
	})

	It("writes stdin", func(ctx SpecContext) {
		h := NewProcessHandle()
		_, err := rt.StartProcess(ctx, ct.ID, h, execio.Request{Command: []string{"sh", "-c", "read a; echo got $a; cat"}}, 0)
		Expect(err).NotTo(HaveOccurred())
		_, err = rt.WriteProcessStdin(ctx, ct.ID, h, []byte("one\n"), false)
		Expect(err).NotTo(HaveOccurred())
		_, err = rt.WriteProcessStdin(ctx, ct.ID, h, []byte("two\n"), true)
		Expect(err).NotTo(HaveOccurred())
		out, err := rt.WaitProcess(ctx, ct.ID, h, ProcessOffsets{}, 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect(*out.ExitCode).To(BeZero())
		Expect(string(out.Stdout.Data)).To(Equal("got one\ntwo\n"))
		_, err = rt.WriteProcessStdin(ctx, ct.ID, h, []byte("late"), false)
		Expect(errors.Is(err, execio.ErrProcessExited)).To(BeTrue(), "%v", err)
	})

	It("refuses another sandbox's handle, garbage and path-looking handles", func(ctx SpecContext) {
		h := NewProcessHandle()
		_, err := rt.StartProcess(ctx, ct.ID, h, execio.Request{Command: []string{"sleep", "30"}}, 0)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { _, _ = rt.KillProcess(ctx, ct.ID, h) })
		for _, bad := range []string{h, "../../etc/passwd", "..", "x/y", "", strings.Repeat("a", 200), "a;b"} {
			_, err := rt.PollProcess(ctx, other.ID, bad, ProcessOffsets{})
			Expect(errors.Is(err, execio.ErrProcessNotFound)).To(BeTrue(), "handle %q: %v", bad, err)
			_, err = rt.KillProcess(ctx, other.ID, bad)
			Expect(errors.Is(err, execio.ErrProcessNotFound)).To(BeTrue(), "handle %q: %v", bad, err)
		}
		out, err := rt.PollProcess(ctx, ct.ID, h, ProcessOffsets{})
		Expect(err).NotTo(HaveOccurred())
		Expect(out.State).To(Equal(execio.ProcessRunning), "the process of the other sandbox is untouched")
	})

	It("refuses stdin in the start request and an unbounded wait", func(ctx SpecContext) {
		_, err := rt.StartProcess(ctx, ct.ID, NewProcessHandle(), execio.Request{Command: []string{"cat"}, Stdin: []byte("x")}, 0)
		Expect(errors.Is(err, execio.ErrInvalidRequest)).To(BeTrue(), "%v", err)
		_, err = rt.WaitProcess(ctx, ct.ID, NewProcessHandle(), ProcessOffsets{}, time.Hour)
		Expect(errors.Is(err, execio.ErrInvalidRequest)).To(BeTrue(), "%v", err)
	})
})

var _ = Describe("Background processes with a timeout", dockerLabel, func() {
	It("kills the tree when the process's own timeout passes", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		h := NewProcessHandle()
		_, err := rt.StartProcess(ctx, ct.ID, h, execio.Request{Shell: "echo started; sleep 600"}, time.Second)
		Expect(err).NotTo(HaveOccurred())
		out, err := rt.WaitProcess(ctx, ct.ID, h, ProcessOffsets{}, 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect(out.State).To(Equal(execio.ProcessExited))
		Expect(*out.ExitCode).To(Equal(helperproto.ExitKilled))
		Expect(string(out.Stdout.Data)).To(Equal("started\n"))
		Expect(string(out.Stderr.Data)).To(ContainSubstring("backstop deadline"))
	})
})
