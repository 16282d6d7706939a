/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// runOut is one RunCommand call's outcome.
type runOut struct {
	Stdout, Stderr string
	Result         execio.Result
	Err            error
}

func runCmd(ctx context.Context, id string, req execio.Request) runOut {
	var stdout, stderr bytes.Buffer
	res, err := rt.RunCommand(ctx, id, req, &stdout, &stderr)
	return runOut{Stdout: stdout.String(), Stderr: stderr.String(), Result: res, Err: err}
}

// survivors lists the command lines of the sandbox's processes that match
// pattern, leaving out the listing itself.
func survivors(ctx context.Context, id, pattern string) []string {
	GinkgoHelper()
	res := sh(ctx, id, `for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); [ -n "$c" ] && echo "$c"; done`)
	Expect(res.Code).To(BeZero(), "%v", res)
	var out []string
	for _, line := range strings.Split(res.Stdout, "\n") {
		if strings.Contains(line, pattern) {
			out = append(out, line)
		}
	}
	return out
}

// zombies counts processes in state Z in the sandbox.
func zombies(ctx context.Context, id string) int {
	GinkgoHelper()
	res := sh(ctx, id, `n=0; for p in /proc/[0-9]*; do s=$(cat $p/stat 2>/dev/null) || continue; s=${s##*) }; [ "${s%% *}" = Z ] && n=$((n+1)); done; echo $n`)
	Expect(res.Code).To(BeZero(), "%v", res)
	var n int
	_, err := fmt.Sscan(res.Stdout, &n)
	Expect(err).NotTo(HaveOccurred())
	return n
}

// recorder records which stream each chunk arrived on, in arrival order,
// and closes first (if set) on the first chunk.
type recorder struct {
	mu     sync.Mutex
	events []string
	first  chan struct{}
	once   sync.Once
}

func (r *recorder) stream(name string) io.Writer { return recordStream{r, name} }

func (r *recorder) joined() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, "|")
}

type recordStream struct {
	r    *recorder
	name string
}

func (s recordStream) Write(p []byte) (int, error) {
	s.r.mu.Lock()
	s.r.events = append(s.r.events, s.name+":"+string(p))
	s.r.mu.Unlock()
	if s.r.first != nil {
		s.r.once.Do(func() { close(s.r.first) })
	}
	return len(p), nil
}

// treeKillScript starts a tree that tries every way out of a process group:
// a plain background child, a setsid escapee and a double fork.
const treeKillScript = `sleep 1001 & setsid sh -c "sleep 1002" & (sh -c "sleep 1003 &" &) ; sleep 1000`

// promptly bounds "right after d" in container id: d plus ten times what a
// trivial exec there takes now, measured here (the fixed cost any command
// pays on this machine at this load), and at least d plus a second. The
// failures these bounds catch wait for a tree's sleeps (1000 s and more),
// so the margin costs them nothing.
func promptly(ctx context.Context, id string, d time.Duration) time.Duration {
	GinkgoHelper()
	start := time.Now()
	r := runCmd(ctx, id, execio.Request{Shell: "true"})
	Expect(r.Err).NotTo(HaveOccurred())
	baseline := time.Since(start)
	AddReportEntry("trivial exec baseline", baseline.String())
	return d + max(time.Second, 10*baseline)
}

var _ = Describe("RunCommand", dockerLabel, Ordered, ContinueOnFailure, func() {
	var ct Container

	BeforeAll(func(ctx SpecContext) {
		ct, _ = startSandbox(ctx, nil)
	}, NodeTimeout(60*time.Second))

	It("separates stdout and stderr, keeps their order and propagates the exit code", func(ctx SpecContext) {
		rec := &recorder{}
		res, err := rt.RunCommand(ctx, ct.ID, execio.Request{Shell: "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c; exit 3"}, rec.stream("out"), rec.stream("err"))
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(Equal(3))
		Expect(rec.joined()).To(Equal("out:a\n|err:b\n|out:c\n"))
		Expect(res.StdoutBytes).To(Equal(int64(4)))
		Expect(res.StderrBytes).To(Equal(int64(2)))
		Expect(res.Truncated()).To(BeFalse())

		Expect(runCmd(ctx, ct.ID, execio.Request{Command: []string{"false"}}).Result.ExitCode).To(Equal(1))
		Expect(runCmd(ctx, ct.ID, execio.Request{Shell: "kill -9 $$"}).Result.ExitCode).To(Equal(137))
		r := runCmd(ctx, ct.ID, execio.Request{Command: []string{"no-such-program"}})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Result.ExitCode).To(Equal(127))
		Expect(r.Stderr).To(ContainSubstring(`cannot execute \"no-such-program\"`))
	}, SpecTimeout(30*time.Second))

	It("streams output as it is produced, not when the command ends", func(ctx SpecContext) {
		rec := &recorder{first: make(chan struct{})}
		done := make(chan runOut, 1)
		// Event-based: the command waits for a file that is created only once
		// its first line has arrived, so the first line cannot be the end's.
		release := "/tmp/release-" + randid.Hex(4)
		go func() {
			res, err := rt.RunCommand(ctx, ct.ID, execio.Request{Shell: "echo early; while [ ! -e " + release + " ]; do sleep 0.05; done; echo late"}, rec.stream("out"), io.Discard)
			done <- runOut{Result: res, Err: err}
		}()
		Eventually(rec.first).WithTimeout(20 * time.Second).Should(BeClosed())
		Expect(done).NotTo(Receive(), "the command is still waiting")
		Expect(sh(ctx, ct.ID, "touch "+release).Code).To(BeZero())
		var r runOut
		Eventually(done).WithTimeout(10 * time.Second).Should(Receive(&r))
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(rec.joined()).To(Equal("out:early\n|out:late\n"))
	}, SpecTimeout(30*time.Second))

	It("kills the whole tree on timeout, setsid and double-fork escapees included (A6)", func(ctx SpecContext) {
		bound := promptly(ctx, ct.ID, 2*time.Second)
		start := time.Now()
		r := runCmd(ctx, ct.ID, execio.Request{Shell: treeKillScript, TimeoutSeconds: 2})
		elapsed := time.Since(start)
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Result.TimedOut).To(BeTrue())
		Expect(r.Result.ExitCode).To(Equal(137))
		Expect(elapsed).To(BeNumerically("<", bound), "right after the timeout, not after the tree's sleeps")
		Expect(r.Result.Duration()).To(BeNumerically(">=", 2*time.Second))
		Expect(survivors(ctx, ct.ID, "sleep")).To(BeEmpty())
		Expect(survivors(ctx, ct.ID, HelperPath+" run")).To(BeEmpty())
	}, SpecTimeout(30*time.Second))

	It("kills the whole tree when the caller's context ends", func(ctx SpecContext) {
		bound := promptly(ctx, ct.ID, time.Second)
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(time.Second, cancel)
		start := time.Now()
		r := runCmd(cctx, ct.ID, execio.Request{Shell: treeKillScript, TimeoutSeconds: 60})
		Expect(r.Err).To(MatchError(context.Canceled))
		Expect(r.Err).NotTo(MatchError(ErrUnavailable))
		Expect(time.Since(start)).To(BeNumerically("<", bound), "right after the cancel, not after the timeout or the tree's sleeps")
		Expect(survivors(ctx, ct.ID, "sleep")).To(BeEmpty())
	}, SpecTimeout(30*time.Second))

	It("caps a 100 MiB flood with a marker, counts it, and keeps the manager's memory bounded (A5)", func(ctx SpecContext) {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			var m runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				runtime.ReadMemStats(&m)
				if m.HeapAlloc > peak.Load() {
					peak.Store(m.HeapAlloc)
				}
			}
		}()
		var stdout bytes.Buffer
		res, err := rt.RunCommand(ctx, ct.ID, execio.Request{Shell: "head -c 104857600 /dev/zero"}, &stdout, io.Discard)
		close(stop)
		<-sampled
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(BeZero())
		Expect(res.StdoutTruncated).To(BeTrue())
		Expect(res.StdoutBytes).To(Equal(int64(100 << 20)))
		marker := execio.TruncationMarker("stdout", execio.DefaultOutputLimit)
		Expect(marker).To(Equal("\n[code-sandbox: stdout truncated after 1.0 MiB]\n"))
		Expect(stdout.Len()).To(Equal(int(execio.DefaultOutputLimit) + len(marker)))
		Expect(strings.HasSuffix(stdout.String(), marker)).To(BeTrue())
		growth := int64(peak.Load()) - int64(before.HeapAlloc)
		GinkgoWriter.Printf("heap growth during a 100 MiB flood: %s\n", FormatBytes(growth))
		Expect(growth).To(BeNumerically("<", 8<<20), "the flood must be streamed, not buffered")

		// `yes` never ends: the timeout kills it while its output is drained.
		r := runCmd(ctx, ct.ID, execio.Request{Command: []string{"yes"}, TimeoutSeconds: 1, OutputLimitBytes: 1000})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Result.TimedOut).To(BeTrue())
		Expect(r.Result.StdoutTruncated).To(BeTrue())
		Expect(r.Result.StdoutBytes).To(BeNumerically(">", 1000))
		Expect(r.Stdout).To(Equal(strings.Repeat("y\n", 500) + execio.TruncationMarker("stdout", 1000)))
	}, SpecTimeout(60*time.Second))

	It("passes invalid UTF-8 and NUL bytes through byte for byte, up to the cap (A5)", func(ctx SpecContext) {
		r := runCmd(ctx, ct.ID, execio.Request{Command: []string{"printf", `\377\000\376abc\000`}})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect([]byte(r.Stdout)).To(Equal([]byte{0xff, 0, 0xfe, 'a', 'b', 'c', 0}))
		r = runCmd(ctx, ct.ID, execio.Request{Command: []string{"printf", `\377\000\376abc\000`}, OutputLimitBytes: 4})
		Expect([]byte(r.Stdout)).To(Equal(append([]byte{0xff, 0, 0xfe, 'a'}, execio.TruncationMarker("stdout", 4)...)))
		Expect(r.Result.StdoutBytes).To(Equal(int64(7)))
	}, SpecTimeout(30*time.Second))

	It("feeds stdin and closes it; without stdin the command sees EOF", func(ctx SpecContext) {
		r := runCmd(ctx, ct.ID, execio.Request{Command: []string{"cat"}, Stdin: []byte("hello\nworld")})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Stdout).To(Equal("hello\nworld"))
		r = runCmd(ctx, ct.ID, execio.Request{Command: []string{"cat"}, TimeoutSeconds: 5})
		Expect(r.Result.TimedOut).To(BeFalse())
		Expect(r.Stdout).To(BeEmpty())
	}, SpecTimeout(30*time.Second))

	It("honours env and workdir, as the sandbox's user, with argv never going through a shell (A18)", func(ctx SpecContext) {
		r := runCmd(ctx, ct.ID, execio.Request{Shell: `echo "$FOO"; pwd; id -u`, Env: []string{"FOO=bar baz"}, WorkingDir: "/tmp"})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Stdout).To(Equal("bar baz\n/tmp\n65534\n"))
		r = runCmd(ctx, ct.ID, execio.Request{Command: []string{"pwd"}})
		Expect(r.Stdout).To(Equal("/app\n"))
		arg := "; rm -rf /app $(id) `id`\nline2"
		r = runCmd(ctx, ct.ID, execio.Request{Command: []string{"echo", arg}})
		Expect(r.Stdout).To(Equal(arg + "\n"))
	}, SpecTimeout(30*time.Second))

	DescribeTable("rejects an invalid request before touching the sandbox (A7, A17)",
		func(ctx SpecContext, req execio.Request, want string) {
			r := runCmd(ctx, ct.ID, req)
			Expect(r.Err).To(MatchError(execio.ErrInvalidRequest))
			Expect(r.Err.Error()).To(ContainSubstring(want))
		},
		Entry("workdir /proc/self/fd/7", execio.Request{Command: []string{"pwd"}, WorkingDir: "/proc/self/fd/7"}, "/proc/self/fd/7"),
		Entry("negative timeout", execio.Request{Command: []string{"true"}, TimeoutSeconds: -1}, "-1"),
		Entry("bad env", execio.Request{Command: []string{"true"}, Env: []string{"1A=x"}}, "1A"),
		Entry("both command and shell", execio.Request{Command: []string{"true"}, Shell: "true"}, "exactly one"),
	)

	It("leaves no zombies behind after orphaned background children (A16)", func(ctx SpecContext) {
		r := runCmd(ctx, ct.ID, execio.Request{Shell: `for i in 1 2 3 4 5; do (sleep 0.1 &); done; sleep 1; n=0; for p in /proc/[0-9]*; do s=$(cat $p/stat 2>/dev/null) || continue; s=${s##*) }; [ "${s%% *}" = Z ] && n=$((n+1)); done; echo $n`})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Stdout).To(Equal("0\n"), "the helper reaps the orphans it inherits while the command runs")
		Expect(zombies(ctx, ct.ID)).To(BeZero())
	}, SpecTimeout(30*time.Second))

	It("returns when the command exits, leaving a background child that holds the pipes running", func(ctx SpecContext) {
		bound := promptly(ctx, ct.ID, 0)
		start := time.Now()
		r := runCmd(ctx, ct.ID, execio.Request{Shell: "sleep 1004 & echo started"})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Stdout).To(Equal("started\n"))
		Expect(time.Since(start)).To(BeNumerically("<", bound), "when the command exits, not when its child closes the pipes")
		Expect(survivors(ctx, ct.ID, "sleep 1004")).To(HaveLen(1))
		Expect(sh(ctx, ct.ID, "pkill -f 'sleep 1004' || kill $(pidof sleep)").Code).To(BeZero())
	}, SpecTimeout(30*time.Second))

	It("reports a missing container", func(ctx SpecContext) {
		r := runCmd(ctx, "rt-test-no-such-container", execio.Request{Command: []string{"true"}})
		Expect(r.Err).To(MatchError(ErrNotFound))
	}, SpecTimeout(30*time.Second))
})

var _ = Describe("RunCommand under load", dockerLabel, func() {
	It("runs 50 concurrent commands on one sandbox (A20)", func(ctx SpecContext) {
		// Every running command costs its helper's ~6 Go runtime threads
		// plus its own processes against the pids limit; 50 at once need
		// more than the default 256.
		ct, _ := startSandbox(ctx, func(s *Spec) { s.Pids = 1024 })
		var wg sync.WaitGroup
		results := make([]runOut, 50)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				results[i] = runCmd(ctx, ct.ID, execio.Request{Shell: fmt.Sprintf("sleep 0.5; echo %d", i), TimeoutSeconds: 30})
			}()
		}
		wg.Wait()
		for i, r := range results {
			Expect(r.Err).NotTo(HaveOccurred(), "command %d", i)
			Expect(r.Result.ExitCode).To(BeZero(), "command %d: %+v %q", i, r.Result, r.Stderr)
			Expect(r.Stdout).To(Equal(fmt.Sprintf("%d\n", i)))
		}
		Expect(zombies(ctx, ct.ID)).To(BeZero())
	}, SpecTimeout(120*time.Second))
})

var _ = Describe("RunCommand under gVisor", dockerLabel, func() {
	It("runs commands and kills the whole tree under runsc", func(ctx SpecContext) {
		ok, err := rt.HasRuntime(ctx, RuntimeRunsc)
		Expect(err).NotTo(HaveOccurred())
		if !ok {
			Skip("the Docker Engine has no runsc runtime registered")
		}
		ct, _ := startSandbox(ctx, func(s *Spec) { s.Runtime = RuntimeRunsc })
		r := runCmd(ctx, ct.ID, execio.Request{Shell: "echo hi; echo err >&2; exit 4"})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Stdout).To(Equal("hi\n"))
		Expect(r.Stderr).To(Equal("err\n"))
		Expect(r.Result.ExitCode).To(Equal(4))

		// gVisor's ptrace platform is slow on a loaded 2-core machine
		// (3.09 s seen in CI): the bound is relative to an exec there.
		bound := promptly(ctx, ct.ID, 2*time.Second)
		start := time.Now()
		r = runCmd(ctx, ct.ID, execio.Request{Shell: treeKillScript, TimeoutSeconds: 2})
		Expect(r.Err).NotTo(HaveOccurred())
		Expect(r.Result.TimedOut).To(BeTrue())
		Expect(time.Since(start)).To(BeNumerically("<", bound))
		Expect(survivors(ctx, ct.ID, "sleep")).To(BeEmpty())
		Expect(zombies(ctx, ct.ID)).To(BeZero())
	}, SpecTimeout(90*time.Second))
})

// tarEntry describes one entry of a test archive.
type tarEntry struct {
	Name     string
	Type     byte
	Mode     int64
	Body     []byte
	Linkname string
}

func makeTar(entries ...tarEntry) []byte {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Size: int64(len(e.Body)), Linkname: e.Linkname}
		if e.Type != tar.TypeReg {
			h.Size = 0
		}
		Expect(tw.WriteHeader(h)).To(Succeed())
		if h.Size > 0 {
			_, err := tw.Write(e.Body)
			Expect(err).NotTo(HaveOccurred())
		}
	}
	Expect(tw.Close()).To(Succeed())
	return buf.Bytes()
}

func readTar(data []byte) []tarEntry {
	GinkgoHelper()
	var out []tarEntry
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		body, err := io.ReadAll(tr)
		Expect(err).NotTo(HaveOccurred())
		if h.Typeflag != tar.TypeReg {
			body = nil
		}
		out = append(out, tarEntry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, Body: body, Linkname: h.Linkname})
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

var _ = Describe("CopyIn and CopyOut", dockerLabel, Ordered, ContinueOnFailure, func() {
	var ct Container

	BeforeAll(func(ctx SpecContext) {
		ct, _ = startSandbox(ctx, nil)
	}, NodeTimeout(60*time.Second))

	copyIn := func(ctx context.Context, dest execio.Target, archive []byte, lim execio.UploadLimits) (execio.TransferStats, error) {
		return rt.CopyIn(ctx, ct.ID, dest, bytes.NewReader(archive), lim)
	}
	copyOut := func(ctx context.Context, src execio.Target, maxBytes int64) ([]byte, execio.TransferStats, error) {
		var buf bytes.Buffer
		stats, err := rt.CopyOut(ctx, ct.ID, src, &buf, maxBytes)
		return buf.Bytes(), stats, err
	}

	DescribeTable("round-trips a tree byte for byte",
		func(ctx SpecContext, root string) {
			files := []tarEntry{
				{Name: "d/", Type: tar.TypeDir, Mode: 0o750},
				{Name: "d/bin.dat", Type: tar.TypeReg, Mode: 0o640, Body: randomBytes(300 << 10)},
				{Name: "d/empty", Type: tar.TypeReg, Mode: 0o600},
				{Name: "d/sub/deeper/x.sh", Type: tar.TypeReg, Mode: 0o755, Body: []byte("#!/bin/sh\necho hi\n")},
				{Name: "top.txt", Type: tar.TypeReg, Mode: 0o644, Body: []byte("top\n")},
			}
			stats, err := copyIn(ctx, execio.Target{Root: root, Rel: "up"}, makeTar(files...), execio.UploadLimits{})
			Expect(err).NotTo(HaveOccurred())
			Expect(stats).To(Equal(execio.TransferStats{Files: 4, Dirs: 1, Bytes: 300<<10 + 18 + 4}))
			Expect(sh(ctx, ct.ID, "sh "+root+"/up/d/sub/deeper/x.sh").Stdout).To(Equal("hi\n"))
			Expect(sh(ctx, ct.ID, "stat -c '%a %u' "+root+"/up/d "+root+"/up/d/empty "+root+"/up/d/sub/deeper/x.sh").Stdout).
				To(Equal("750 65534\n600 65534\n755 65534\n"))

			data, stats, err := copyOut(ctx, execio.Target{Root: root, Rel: "up"}, 0)
			Expect(err).NotTo(HaveOccurred())
			Expect(stats.Files).To(Equal(4))
			Expect(stats.Bytes).To(Equal(int64(300<<10 + 18 + 4)))
			got := map[string]tarEntry{}
			for _, e := range readTar(data) {
				got[e.Name] = e
			}
			for _, f := range files {
				name := "up/" + f.Name
				Expect(got).To(HaveKey(name))
				Expect(got[name].Type).To(Equal(f.Type), name)
				Expect(got[name].Mode).To(Equal(f.Mode), name)
				if f.Type == tar.TypeReg {
					Expect(bytes.Equal(got[name].Body, f.Body)).To(BeTrue(), "content of %s", name)
				}
			}
			Expect(got).To(HaveKey("up/"))
			Expect(got).To(HaveKey("up/d/sub/"))

			// A single file downloads under its own name.
			data, _, err = copyOut(ctx, execio.Target{Root: root, Rel: "up/top.txt"}, 0)
			Expect(err).NotTo(HaveOccurred())
			Expect(readTar(data)).To(Equal([]tarEntry{{Name: "top.txt", Type: tar.TypeReg, Mode: 0o644, Body: []byte("top\n")}}))
		},
		Entry("into /app", "/app"),
		Entry("into /tmp", "/tmp"),
	)

	It("uploads a single file through WriteSingleFileTar and overwrites it", func(ctx SpecContext) {
		for _, content := range []string{"first version, longer\n", "second\n"} {
			var buf bytes.Buffer
			Expect(execio.WriteSingleFileTar(&buf, "single.txt", 0o600, int64(len(content)), strings.NewReader(content))).To(Succeed())
			_, err := copyIn(ctx, execio.Target{Root: "/app"}, buf.Bytes(), execio.UploadLimits{})
			Expect(err).NotTo(HaveOccurred())
			Expect(sh(ctx, ct.ID, "cat /app/single.txt").Stdout).To(Equal(content))
		}
	}, SpecTimeout(30*time.Second))

	DescribeTable("refuses paths outside the allowed roots (A8)",
		func(ctx SpecContext, p string) {
			_, err := execio.ResolvePath("/app", p)
			Expect(err).To(MatchError(execio.ErrInvalidPath))
		},
		Entry("../../etc/passwd", "../../etc/passwd"),
		Entry("/etc/passwd", "/etc/passwd"),
		Entry("a/../../x", "a/../../x"),
		Entry("empty", ""),
		Entry("NUL", "a\x00b"),
		Entry("4 KB name", strings.Repeat("a", 4096)),
	)

	It("refuses unclean targets before touching the sandbox, and the helper refuses them too", func(ctx SpecContext) {
		for _, t := range []execio.Target{{Root: "/app", Rel: "../etc"}, {Root: "/app", Rel: "/etc"}, {Root: "app", Rel: "x"}, {Root: "/app", Rel: "a/../../x"}} {
			_, err := copyIn(ctx, t, makeTar(), execio.UploadLimits{})
			Expect(err).To(MatchError(execio.ErrInvalidPath), "%+v", t)
			_, _, err = copyOut(ctx, t, 0)
			Expect(err).To(MatchError(execio.ErrInvalidPath), "%+v", t)
		}
		// Bypassing the manager's checks, the helper applies the same rules.
		var stderr bytes.Buffer
		res, err := rt.Exec(ctx, ct.ID, ExecOptions{Cmd: []string{HelperPath, "untar", "--root=/app", "--dest=../etc"}, Stdin: bytes.NewReader(makeTar())}, io.Discard, &stderr)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(Equal(helperproto.ExitInvalidPath))
		he, ok := helperproto.ParseError(stderr.Bytes())
		Expect(ok).To(BeTrue(), stderr.String())
		Expect(he.Kind).To(Equal(helperproto.KindInvalidPath))
	}, SpecTimeout(30*time.Second))

	It("never follows a symlink the sandbox planted out of the root (A9, A11)", func(ctx SpecContext) {
		marker := "escape-" + randid.Hex(6)
		res := sh(ctx, ct.ID, "ln -s / /app/out && ln -s /tmp /app/tmpout && echo victim > /tmp/victim && ln -s /tmp/victim /app/victimlink")
		Expect(res.Code).To(BeZero(), "%v", res)
		file := makeTar(tarEntry{Name: marker, Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")})

		_, err := copyIn(ctx, execio.Target{Root: "/app", Rel: "out/tmp"}, file, execio.UploadLimits{})
		Expect(err).To(MatchError(execio.ErrInvalidPath))
		_, err = copyIn(ctx, execio.Target{Root: "/app", Rel: "tmpout"}, file, execio.UploadLimits{})
		Expect(err).To(MatchError(execio.ErrInvalidPath))
		_, err = copyIn(ctx, execio.Target{Root: "/app"}, makeTar(tarEntry{Name: "tmpout/" + marker, Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")}), execio.UploadLimits{})
		Expect(err).To(MatchError(execio.ErrInvalidPath))
		_, _, err = copyOut(ctx, execio.Target{Root: "/app", Rel: "out/etc/passwd"}, 0)
		Expect(err).To(MatchError(execio.ErrInvalidPath))
		_, _, err = copyOut(ctx, execio.Target{Root: "/app", Rel: "tmpout/victim"}, 0)
		Expect(err).To(MatchError(execio.ErrInvalidPath))

		// Writing over a symlink replaces the link; its target is untouched.
		_, err = copyIn(ctx, execio.Target{Root: "/app"}, makeTar(tarEntry{Name: "victimlink", Type: tar.TypeReg, Mode: 0o644, Body: []byte("mine\n")}), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(sh(ctx, ct.ID, "cat /tmp/victim; [ -L /app/victimlink ] && echo link; cat /app/victimlink").Stdout).To(Equal("victim\nmine\n"))

		// A symlink is downloaded as a link, never followed.
		data, _, err := copyOut(ctx, execio.Target{Root: "/app", Rel: "out"}, 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(readTar(data)).To(Equal([]tarEntry{{Name: "out", Type: tar.TypeSymlink, Mode: 0o777, Linkname: "/"}}))

		Expect(sh(ctx, ct.ID, "ls /tmp/"+marker+" /"+marker+" 2>&1; true").Stdout).To(ContainSubstring("No such file"))
		Expect(sh(ctx, ct.ID, "find / -name "+marker+" 2>/dev/null").Stdout).To(BeEmpty())
		for _, hostPath := range []string{"/" + marker, os.TempDir() + "/" + marker} {
			_, err := os.Lstat(hostPath)
			Expect(os.IsNotExist(err)).To(BeTrue(), "nothing may appear on the host at %s", hostPath)
		}
	}, SpecTimeout(60*time.Second))

	DescribeTable("rejects dangerous archive entries (A10)",
		func(ctx SpecContext, e tarEntry, want error) {
			_, err := copyIn(ctx, execio.Target{Root: "/app", Rel: "bad"}, makeTar(e), execio.UploadLimits{})
			Expect(err).To(MatchError(want))
		},
		Entry("../ name", tarEntry{Name: "../evil", Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")}, execio.ErrInvalidPath),
		Entry("nested ..", tarEntry{Name: "a/../../evil", Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")}, execio.ErrInvalidPath),
		Entry("absolute name", tarEntry{Name: "/tmp/evil", Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")}, execio.ErrInvalidPath),
		Entry("symlink", tarEntry{Name: "link", Type: tar.TypeSymlink, Linkname: "/etc"}, execio.ErrUnsupportedEntry),
		Entry("hard link to /etc", tarEntry{Name: "hl", Type: tar.TypeLink, Linkname: "/etc/passwd"}, execio.ErrUnsupportedEntry),
		Entry("character device", tarEntry{Name: "dev", Type: tar.TypeChar}, execio.ErrUnsupportedEntry),
		Entry("fifo", tarEntry{Name: "fifo", Type: tar.TypeFifo}, execio.ErrUnsupportedEntry),
		Entry("over-long name", tarEntry{Name: strings.Repeat("n", 300), Type: tar.TypeReg, Mode: 0o644}, execio.ErrInvalidPath),
	)

	It("has the helper reject a symlink entry on its own, with setuid bits masked", func(ctx SpecContext) {
		var stderr bytes.Buffer
		archive := makeTar(tarEntry{Name: "ok", Type: tar.TypeReg, Mode: 0o4755, Body: []byte("x")}, tarEntry{Name: "link", Type: tar.TypeSymlink, Linkname: "/"})
		res, err := rt.Exec(ctx, ct.ID, ExecOptions{Cmd: []string{HelperPath, "untar", "--root=/app", "--dest=raw"}, Stdin: bytes.NewReader(archive)}, io.Discard, &stderr)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(Equal(helperproto.ExitUnsupportedEntry), stderr.String())
		Expect(helperFailure("raw", res.ExitCode, stderr.Bytes())).To(MatchError(execio.ErrUnsupportedEntry))
		Expect(sh(ctx, ct.ID, "stat -c %a /app/raw/ok; [ -e /app/raw/link ] || echo nolink").Stdout).To(Equal("755\nnolink\n"))
	}, SpecTimeout(30*time.Second))

	It("enforces upload and download caps (A10)", func(ctx SpecContext) {
		big := makeTar(tarEntry{Name: "big", Type: tar.TypeReg, Mode: 0o644, Body: randomBytes(2000)})
		_, err := copyIn(ctx, execio.Target{Root: "/app", Rel: "caps"}, big, execio.UploadLimits{MaxBytes: 1000})
		Expect(err).To(MatchError(execio.ErrTooLarge))
		three := makeTar(tarEntry{Name: "a", Type: tar.TypeReg}, tarEntry{Name: "b", Type: tar.TypeReg}, tarEntry{Name: "c", Type: tar.TypeReg})
		_, err = copyIn(ctx, execio.Target{Root: "/app", Rel: "caps"}, three, execio.UploadLimits{MaxEntries: 2})
		Expect(err).To(MatchError(execio.ErrTooLarge))

		_, err = copyIn(ctx, execio.Target{Root: "/app", Rel: "caps"}, big, execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		_, _, err = copyOut(ctx, execio.Target{Root: "/app", Rel: "caps/big"}, 1000)
		Expect(err).To(MatchError(execio.ErrTooLarge))
		_, stats, err := copyOut(ctx, execio.Target{Root: "/app", Rel: "caps/big"}, 2000)
		Expect(err).NotTo(HaveOccurred())
		Expect(stats.Bytes).To(Equal(int64(2000)))

		// A tar bomb's declared size is refused before its content is read.
		var hdr bytes.Buffer
		tw := tar.NewWriter(&hdr)
		Expect(tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40})).To(Succeed())
		_, err = rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/app", Rel: "caps"}, io.MultiReader(bytes.NewReader(hdr.Bytes()), zeroReader{}), execio.UploadLimits{})
		Expect(err).To(MatchError(execio.ErrTooLarge))
	}, SpecTimeout(60*time.Second))

	It("reports a missing path, skips fifos and sockets, and never blocks on them", func(ctx SpecContext) {
		_, _, err := copyOut(ctx, execio.Target{Root: "/app", Rel: "no/such/file"}, 0)
		Expect(err).To(MatchError(execio.ErrPathNotFound))
		Expect(err.Error()).To(ContainSubstring("no/such/file"))

		Expect(sh(ctx, ct.ID, "mkdir -p /app/special && mkfifo /app/special/fifo && echo f > /app/special/file").Code).To(BeZero())
		data, _, err := copyOut(ctx, execio.Target{Root: "/app", Rel: "special"}, 0)
		Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, e := range readTar(data) {
			names = append(names, e.Name)
		}
		sort.Strings(names)
		Expect(names).To(Equal([]string{"special/", "special/file"}))
		_, _, err = copyOut(ctx, execio.Target{Root: "/app", Rel: "special/fifo"}, 0)
		Expect(err).To(MatchError(execio.ErrUnsupportedEntry))
	}, SpecTimeout(30*time.Second))
})

// A sandbox can write into `helper tar`'s stdout (same user, through
// /proc/<pid>/fd/1). A forged GNU sparse header there, whose whole content
// is a 2^60-byte hole, made the manager's forwarder spin on a core forever
// (archive/tar yields holes without reading input).
var _ = Describe("CopyOut with a forged stream", dockerLabel, func() {
	It("refuses a sparse entry the sandbox injects into the helper's stdout, promptly", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		// Empty files: every 512-byte block is a header, so the helper's
		// 64 KiB writes end on entry boundaries and the injected header is
		// read as the next entry's.
		Expect(sh(ctx, ct.ID, "mkdir /app/many && cd /app/many && i=0; while [ $i -lt 4000 ]; do : > f$i; i=$((i+1)); done").Code).To(BeZero())
		_, err := rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(makeTar(tarEntry{Name: "forged.bin", Type: tar.TypeReg, Mode: 0o644, Body: forgedSparseTar()})), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		watch := `i=0; while [ $i -lt 20000 ]; do for p in /proc/[0-9]*; do
  if tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q 'helper tar'; then cat /tmp/forged.bin > $p/fd/1 && echo injected >> /tmp/watch.log; exit 0; fi
done; i=$((i+1)); done`
		Expect(sh(ctx, ct.ID, "echo '"+strings.ReplaceAll(watch, "'", "'\\''")+"' > /tmp/watch.sh").Code).To(BeZero())

		for attempt := 0; attempt < 10; attempt++ {
			Expect(sh(ctx, ct.ID, "rm -f /tmp/watch.log; (sh /tmp/watch.sh > /dev/null 2>&1 &)").Code).To(BeZero())
			time.Sleep(300 * time.Millisecond)
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			done := make(chan error, 1)
			start, cpu0 := time.Now(), processCPU()
			go func() {
				_, err := rt.CopyOut(cctx, ct.ID, execio.Target{Root: "/app", Rel: "many"}, io.Discard, 0)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				cancel()
				Fail(fmt.Sprintf("CopyOut is still running 20 s after the sandbox injected a sparse header: the forwarder spins (%v of this process's CPU)", processCPU()-cpu0))
			}
			cancel()
			injected := sh(ctx, ct.ID, "cat /tmp/watch.log 2>/dev/null").Stdout
			_ = sh(ctx, ct.ID, "pkill -f watch.sh")
			if !strings.Contains(injected, "injected") {
				continue // the helper finished before the watcher found it
			}
			fmt.Fprintf(GinkgoWriter, "attempt %d: injected; CopyOut returned after %v (%v of this process's CPU): %v\n", attempt, time.Since(start), processCPU()-cpu0, err)
			if errors.Is(err, execio.ErrUnsupportedEntry) {
				Expect(err.Error()).To(ContainSubstring("sparse file"))
				return
			}
			// The forged bytes landed inside an entry: a corrupt archive,
			// which fails too; try for an entry boundary again.
		}
		Skip("the injected header never landed on an entry boundary in 10 attempts")
	}, SpecTimeout(5*time.Minute))
})

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// forgedSparseTar is an old-GNU sparse header (type 'S') with no data and a
// 2^60-byte hole, followed by the end-of-archive marker.
func forgedSparseTar() []byte {
	b := make([]byte, 512)
	copy(b[0:], "many/hole")
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], "00000000000\x00")
	copy(b[136:], "00000000000\x00")
	b[156] = tar.TypeGNUSparse
	copy(b[257:], "ustar  \x00")
	b[483] = 0x80
	binary.BigEndian.PutUint64(b[487:495], 1<<60)
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return append(b, make([]byte, 1024)...)
}

// zeroReader is an endless stream of zeros.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
