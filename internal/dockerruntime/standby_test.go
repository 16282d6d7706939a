/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// servePID runs a command that reports the PID of the `helper serve` it ran
// under: the command's parent is its `helper run`, whose parent is serve.
func servePID(ctx context.Context, c *Client, id string) string {
	GinkgoHelper()
	var stdout, stderr bytes.Buffer
	res, err := c.RunCommand(ctx, id, execio.Request{Shell: `s=$(cat /proc/$PPID/stat); s=${s##*) }; set -- $s; echo $2`}, &stdout, &stderr)
	Expect(err).NotTo(HaveOccurred())
	Expect(res.ExitCode).To(BeZero(), stderr.String())
	pid := strings.TrimSpace(stdout.String())
	Expect(pid).NotTo(BeEmpty())
	cmdline := sh(ctx, id, "tr '\\0' ' ' < /proc/"+pid+"/cmdline")
	Expect(cmdline.Stdout).To(Equal(HelperPath+" serve "), "PID %s is not a serve helper", pid)
	return pid
}

// serveHelpers lists the sandbox's serve helpers' PIDs.
func serveHelpers(ctx context.Context, id string) []string {
	GinkgoHelper()
	res := sh(ctx, id, `for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "`+HelperPath+` serve " ] && echo ${p#/proc/}; done; true`)
	Expect(res.Code).To(BeZero(), "%v", res)
	return strings.Fields(res.Stdout)
}

var _ = Describe("The resident helper", dockerLabel, func() {
	It("runs a sandbox's commands one after another in one serve helper, not an exec each", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		first := servePID(ctx, rt, ct.ID)
		for range 3 {
			Expect(servePID(ctx, rt, ct.ID)).To(Equal(first))
		}
		Expect(serveHelpers(ctx, ct.ID)).To(Equal([]string{first}), "one idle helper per sandbox")

		// A command's env and directory do not stay for the next one.
		r := runCmd(ctx, ct.ID, execio.Request{Shell: `echo "$FOO $(pwd)"`, Env: []string{"FOO=bar"}, WorkingDir: "/tmp"})
		Expect(r.Stdout).To(Equal("bar /tmp\n"))
		r = runCmd(ctx, ct.ID, execio.Request{Shell: `echo "${FOO:-unset} $(pwd)"`})
		Expect(r.Stdout).To(Equal("unset /app\n"))

		// A background child that outlives its command belongs to the
		// container's init, never to the resident helper: a later
		// command's kill cannot reach it.
		r = runCmd(ctx, ct.ID, execio.Request{Shell: "sleep 1011 & echo started"})
		Expect(r.Stdout).To(Equal("started\n"))
		r = runCmd(ctx, ct.ID, execio.Request{Command: []string{"sleep", "30"}, TimeoutSeconds: 1})
		Expect(r.Result.TimedOut).To(BeTrue())
		Expect(survivors(ctx, ct.ID, "sleep 1011")).To(HaveLen(1), "the earlier command's background child survives a later kill")
		Expect(survivors(ctx, ct.ID, "sleep 30")).To(BeEmpty())
		Expect(servePID(ctx, rt, ct.ID)).To(Equal(first), "a killed command leaves its helper usable")
	}, SpecTimeout(60*time.Second))

	It("hides the serve and run helpers' /proc fd and environ from sandbox code of the same uid (Low 10)", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		serve := servePID(ctx, rt, ct.ID)
		// The command runs as the helpers' uid: only their non-dumpable
		// flag keeps it out of their frames (stdin carries the next
		// command's env and stdin).
		for _, target := range []string{serve, "$PPID"} {
			r := runCmd(ctx, ct.ID, execio.Request{Shell: `t=` + target + `; echo uid=$(id -u) owner=$(stat -c %u /proc/$t/environ)
cat /proc/$t/environ >/dev/null 2>&1 && echo environ-readable
ls /proc/$t/fd/ >/dev/null 2>&1 && echo fd-listable
: < /proc/$t/fd/0 2>/dev/null && echo stdin-openable
true`})
			Expect(r.Stdout).To(HavePrefix("uid=65534 owner=0\n"), "helper %s", target)
			Expect(r.Stdout).NotTo(ContainSubstring("readable"), "helper %s", target)
			Expect(r.Stdout).NotTo(ContainSubstring("listable"), "helper %s", target)
			Expect(r.Stdout).NotTo(ContainSubstring("openable"), "helper %s", target)
		}
		// The commands themselves are dumpable again (execve resets the
		// flag): tools that read their own /proc keep working.
		r := runCmd(ctx, ct.ID, execio.Request{Shell: "ls /proc/self/fd/ >/dev/null && cat /proc/$$/environ >/dev/null && echo ok"})
		Expect(r.Stdout).To(Equal("ok\n"))
	}, SpecTimeout(60*time.Second))

	It("refuses a command in a paused sandbox at once, and keeps its helper for after the resume", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		// Relative: "at once" is ten trivial commands here now (at least a
		// second), capped well under the 30 s Docker call timeout that a
		// command held for the thaw would run into.
		atOnce := min(promptly(ctx, ct.ID, 0), 20*time.Second)
		first := servePID(ctx, rt, ct.ID)
		Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
		start := time.Now()
		r := runCmd(ctx, ct.ID, execio.Request{Shell: "echo x >> /tmp/ran"})
		Expect(r.Err).To(MatchError(ErrPaused))
		Expect(time.Since(start)).To(BeNumerically("<", atOnce))
		Expect(rt.Unpause(ctx, ct.ID)).To(Succeed())
		Expect(servePID(ctx, rt, ct.ID)).To(Equal(first))
		Expect(sh(ctx, ct.ID, "test -e /tmp/ran").Code).NotTo(BeZero(), "the refused command never ran")
	}, SpecTimeout(60*time.Second))

	It("lets commands and transfers wait for a thaw that BeginUnpause started, instead of refusing them as paused", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		servePID(ctx, rt, ct.ID)
		for range 3 {
			Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
			wait := rt.BeginUnpause(ct.ID)
			r := runCmd(ctx, ct.ID, execio.Request{Command: []string{"echo", "thawed"}})
			Expect(r.Err).NotTo(HaveOccurred())
			Expect(r.Stdout).To(Equal("thawed\n"))
			Expect(wait(ctx)).To(Succeed())

			Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
			wait = rt.BeginUnpause(ct.ID)
			var archive bytes.Buffer
			_, err := rt.CopyOut(ctx, ct.ID, execio.Target{Root: "/etc", Rel: "hostname"}, &archive, 0)
			Expect(err).NotTo(HaveOccurred())
			Expect(wait(ctx)).To(Succeed())
		}
	}, SpecTimeout(60*time.Second))

	It("runs a command exactly once when the idle helper was killed from inside the sandbox", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		first := servePID(ctx, rt, ct.ID)
		Expect(sh(ctx, ct.ID, "kill -9 "+first).Code).To(BeZero())
		r := runCmd(ctx, ct.ID, execio.Request{Shell: "echo x >> /tmp/count; wc -l < /tmp/count"})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(r.Stdout)).To(Equal("1"))
		Expect(servePID(ctx, rt, ct.ID)).NotTo(Equal(first))
	}, SpecTimeout(60*time.Second))

	It("bounds handing a command to a SIGSTOPped idle helper by a Docker call's timeout, not the command's, and runs it in a new helper (High 3)", func(ctx SpecContext) {
		c, err := New(Options{CallTimeout: 3 * time.Second, PullTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		ct, _ := startSandbox(ctx, nil)
		stopped := servePID(ctx, c, ct.ID)
		// Sandbox code stops its idle helper: it no longer reads its stdin.
		Expect(sh(ctx, ct.ID, "kill -STOP "+stopped).Code).To(BeZero())
		stdin := bytes.Repeat([]byte("x"), 8<<20)
		var stdout, stderr bytes.Buffer
		start := time.Now()
		const commandTimeout = 120 * time.Second
		res, err := c.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"wc", "-c"}, Stdin: stdin, TimeoutSeconds: int64(commandTimeout / time.Second)}, &stdout, &stderr)
		elapsed := time.Since(start)
		GinkgoWriter.Printf("handing 8 MiB of stdin past a stopped helper took %v\n", elapsed)
		Expect(err).NotTo(HaveOccurred(), stderr.String())
		Expect(res.ExitCode).To(BeZero())
		Expect(strings.TrimSpace(stdout.String())).To(Equal("8388608"))
		// On 90280d9 the write waited for the command's timeout plus a
		// Docker call's, holding the frame all along.
		Expect(elapsed).To(BeNumerically("<", commandTimeout/6), "the hand-over waited for the command's timeout")
	}, SpecTimeout(90*time.Second))

	It("kills a command through an exec of its own when its serve helper, SIGSTOPped by sandbox code, never acknowledges the kill (Low 10)", func(ctx SpecContext) {
		c, err := New(Options{CallTimeout: 2 * time.Second, PullTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		ct, _ := startSandbox(ctx, nil)
		// The command stops the serve helper it runs under (its parent's
		// parent), so the kill frame is never read, then sleeps. Its own
		// timeout is far away, and so is its run helper's backstop: only
		// the manager's fallback can end it in time.
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type outcome struct {
			res execio.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := c.RunCommand(cctx, ct.ID, execio.Request{
				Shell:          `s=$(cat /proc/$PPID/stat); s=${s##*) }; set -- $s; kill -STOP $2 && touch /tmp/serve-stopped; exec sleep $((1000+17))`,
				TimeoutSeconds: 600,
			}, io.Discard, io.Discard)
			done <- outcome{res, err}
		}()
		Eventually(func() int { return sh(ctx, ct.ID, "test -e /tmp/serve-stopped").Code }, 20*time.Second, 100*time.Millisecond).
			Should(BeZero(), "the command stopped its serve helper")
		Expect(survivors(ctx, ct.ID, "sleep 1017")).To(HaveLen(1))
		cancel()
		var o outcome
		Eventually(done, 30*time.Second).Should(Receive(&o))
		// The serve helper never sent an exit frame: the call gives up on
		// it after the kill deadline.
		Expect(o.err).To(HaveOccurred())
		// Without the fallback `helper kill` exec, the sleep outlives the
		// call (its backstop is ten minutes away).
		Eventually(func() []string { return survivors(ctx, ct.ID, "sleep 1017") }, 10*time.Second, 200*time.Millisecond).
			Should(BeEmpty(), "the command was killed although its helper never read the kill frame")
	}, SpecTimeout(90*time.Second))

	It("leaves concurrent commands one idle helper, and none after RunCommandOnce", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		done := make(chan runOut, 4)
		for range 4 {
			go func() { done <- runCmd(ctx, ct.ID, execio.Request{Shell: "sleep 0.5"}) }()
		}
		for range 4 {
			Expect((<-done).Err).NotTo(HaveOccurred())
		}
		Eventually(func() []string { return serveHelpers(ctx, ct.ID) }).WithContext(ctx).WithTimeout(5 * time.Second).Should(HaveLen(1))

		other, _ := startSandbox(ctx, nil)
		res, err := rt.RunCommandOnce(ctx, other.ID, execio.Request{Command: []string{"true"}}, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(BeZero())
		Eventually(func() []string { return serveHelpers(ctx, other.ID) }).WithContext(ctx).WithTimeout(5 * time.Second).Should(BeEmpty())
	}, SpecTimeout(60*time.Second))

	It("ends its helpers when the client closes or removes the sandbox", func(ctx SpecContext) {
		c, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		ct, _ := startSandbox(ctx, nil)
		servePID(ctx, c, ct.ID)
		Expect(c.Close()).To(Succeed())
		Eventually(func() []string { return serveHelpers(ctx, ct.ID) }).WithContext(ctx).WithTimeout(5*time.Second).Should(BeEmpty(),
			"a closed client's helpers see their stdin end and exit")

		removed, _ := startSandbox(ctx, nil)
		servePID(ctx, rt, removed.ID)
		Expect(rt.Remove(ctx, removed.ID, 0)).To(Succeed())
		rt.standby.mu.Lock()
		_, kept := rt.standby.idle[removed.ID]
		rt.standby.mu.Unlock()
		Expect(kept).To(BeFalse(), "a removed sandbox's idle helper is dropped")
	}, SpecTimeout(60*time.Second))

	It("falls back to an exec per command for a helper without serve (an older tools volume)", func(ctx SpecContext) {
		saved := serveCommand
		// The real helper answers an unknown subcommand exactly as a helper
		// from before serve answers `serve`.
		serveCommand = []string{HelperPath, "serve-unknown-to-this-helper"}
		DeferCleanup(func() { serveCommand = saved })
		c, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		ct, _ := startSandbox(ctx, nil)
		for range 2 {
			var stdout bytes.Buffer
			res, err := c.RunCommand(ctx, ct.ID, execio.Request{Shell: "echo hi; exit 4"}, &stdout, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(Equal(4))
			Expect(stdout.String()).To(Equal("hi\n"))
		}
		Expect(c.isLegacy(ct.ID)).To(BeTrue())
		res, err := c.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"sleep", "30"}, TimeoutSeconds: 1}, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.TimedOut).To(BeTrue())
		Expect(survivors(ctx, ct.ID, "sleep 30")).To(BeEmpty())
	}, SpecTimeout(60*time.Second))

	It("treats a helper's frames as hostile: an oversized frame ends the command with an error, not an allocation", func(ctx SpecContext) {
		saved := serveCommand
		// A helper that is ready, takes the command, then announces a 4 GiB
		// stdout frame.
		// The helper then sleeps: a client that waited for the frame's
		// bytes instead of refusing its header would wait it out.
		const helperSleep = 30 * time.Second
		serveCommand = []string{"/bin/sh", "-c", fmt.Sprintf(`printf 'R\000\000\000\000'; sleep 0.3; printf 'A\000\000\000\000O\377\377\377\377'; sleep %d`, int(helperSleep/time.Second))}
		DeferCleanup(func() { serveCommand = saved })
		c, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		ct, _ := startSandbox(ctx, nil)
		start := time.Now()
		_, err = c.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"true"}}, nil, nil)
		Expect(err).To(MatchError(helperproto.ErrFrameTooLarge))
		Expect(time.Since(start)).To(BeNumerically("<", helperSleep/3), "the client waited for the helper")
	}, SpecTimeout(60*time.Second))
})

var _ = Describe("A slow helper start", dockerLabel, func() {
	It("counts against the command's timeout, not a Docker call's: a helper that takes longer than a call to start still runs the command", func(ctx SpecContext) {
		saved := serveCommand
		// Docker spawning the helper slowly, as 50 concurrent execs on two
		// loaded cores do.
		serveCommand = []string{"/bin/sh", "-c", "sleep 2; exec " + HelperPath + " serve"}
		DeferCleanup(func() { serveCommand = saved })
		c, err := New(Options{CallTimeout: time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		ct, _ := startSandbox(ctx, nil)
		var stdout bytes.Buffer
		// Once: no helper stays for the second part.
		res, err := c.RunCommandOnce(ctx, ct.ID, execio.Request{Command: []string{"echo", "ran"}, TimeoutSeconds: 10}, &stdout, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(BeZero())
		Expect(stdout.String()).To(Equal("ran\n"))

		// A start that outlasts the command's own timeout as well is an
		// error, not a hang.
		const slowStart = 30 * time.Second
		serveCommand = []string{"/bin/sh", "-c", fmt.Sprintf("sleep %d; exec %s serve", int(slowStart/time.Second), HelperPath)}
		start := time.Now()
		_, err = c.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"echo", "never"}, TimeoutSeconds: 1}, nil, nil)
		Expect(err).To(MatchError(ContainSubstring("waiting for the sandbox helper")))
		Expect(time.Since(start)).To(BeNumerically("<", slowStart/3), "the start was waited out instead of the command's 1 s timeout")
	}, SpecTimeout(90*time.Second))
})

var _ = Describe("The health check of a warm pool member", dockerLabel, func() {
	It("passes in a fresh sandbox and leaves no process, no resident helper and no file", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		before := survivors(ctx, ct.ID, "")
		Expect(rt.CheckHealth(ctx, ct.ID)).To(Succeed())
		Expect(serveHelpers(ctx, ct.ID)).To(BeEmpty(), "the check leaves no resident helper")
		Expect(survivors(ctx, ct.ID, "")).To(Equal(before), "the check leaves no process")
		Expect(sh(ctx, ct.ID, "ls -A /app /tmp").Stdout).To(Equal("/app:\n\n/tmp:\n"), "the check leaves no file")
	}, SpecTimeout(60*time.Second))

	It("fails, saying where, when the sandbox user cannot write its working directory; and refuses a paused sandbox", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		Expect(sh(ctx, ct.ID, "chmod 0555 /app").Code).To(BeZero())
		err := rt.CheckHealth(ctx, ct.ID)
		Expect(err).To(MatchError(And(
			ContainSubstring("health check of container "+ShortID(ct.ID)+" failed (exit code"),
			ContainSubstring("cannot write in /app"), ContainSubstring("permission denied"))))
		Expect(serveHelpers(ctx, ct.ID)).To(BeEmpty())

		Expect(sh(ctx, ct.ID, "chmod 0755 /app").Code).To(BeZero())
		Expect(rt.CheckHealth(ctx, ct.ID)).To(Succeed())
		Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
		Expect(rt.CheckHealth(ctx, ct.ID)).To(MatchError(ErrPaused))
		Expect(rt.Unpause(ctx, ct.ID)).To(Succeed())
	}, SpecTimeout(60*time.Second))
})
