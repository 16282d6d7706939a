/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxhelper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Background processes (a built helper)", unit, Ordered, func() {
	var helper, dir string

	BeforeAll(func() {
		if runtime.GOOS != "linux" {
			Skip("background processes are Linux-only")
		}
		helper = filepath.Join(GinkgoT().TempDir(), "helper")
		build := exec.Command("go", "build", "-o", helper, "github.com/code-sandbox/code-sandbox-operator/cmd/code-sandbox-helper")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
	})
	BeforeEach(func() {
		dir = filepath.Join(GinkgoT().TempDir(), "procs")
		DeferCleanup(func() {
			// Nothing may outlive a spec: kill whatever is still running.
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				_, _, _ = procCmd(helper, dir, nil, "kill", "--id="+e.Name())
			}
		})
	})

	// proc runs `helper proc SUB --dir=dir ARGS` and decodes its JSON into out.
	proc := func(out any, stdin []byte, sub string, args ...string) error {
		GinkgoHelper()
		stdout, stderr, err := procCmd(helper, dir, stdin, sub, args...)
		if err != nil {
			if he, ok := helperproto.ParseError([]byte(stderr)); ok {
				return he
			}
			return fmt.Errorf("%w: %s", err, stderr)
		}
		if out != nil {
			Expect(json.Unmarshal(stdout, out)).To(Succeed(), string(stdout))
		}
		return nil
	}
	start := func(id string, argv ...string) execio.ProcessStatus {
		GinkgoHelper()
		var st execio.ProcessStatus
		Expect(proc(&st, nil, "start", append([]string{"--id=" + id, "--"}, argv...)...)).To(Succeed())
		return st
	}
	wait := func(id string, timeout time.Duration, offsets ...int64) execio.ProcessOutput {
		GinkgoHelper()
		var out execio.ProcessOutput
		args := []string{"--id=" + id, "--timeout-ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)}
		if len(offsets) == 2 {
			args = append(args, "--stdout-offset="+strconv.FormatInt(offsets[0], 10), "--stderr-offset="+strconv.FormatInt(offsets[1], 10))
		}
		Expect(proc(&out, nil, "wait", args...)).To(Succeed())
		return out
	}

	It("runs a command detached from the call that started it and reads back its output and exit code", func() {
		st := start("h1", "sh", "-c", "echo out; echo err >&2; sleep 1; echo late; exit 7")
		Expect(st.State).To(Equal(execio.ProcessRunning))
		Expect(st.Command).To(Equal([]string{"sh", "-c", "echo out; echo err >&2; sleep 1; echo late; exit 7"}))
		// A short wait returns with the process still running.
		out := wait("h1", 100*time.Millisecond)
		Expect(out.State).To(Equal(execio.ProcessRunning))
		Expect(out.ExitCode).To(BeNil())
		out = wait("h1", 20*time.Second)
		Expect(out.State).To(Equal(execio.ProcessExited))
		Expect(*out.ExitCode).To(Equal(7))
		Expect(string(out.Stdout.Data)).To(Equal("out\nlate\n"))
		Expect(string(out.Stderr.Data)).To(Equal("err\n"))
		Expect(out.Stdout.Next).To(Equal(int64(len("out\nlate\n"))))
		// From an offset: only what is new.
		out = wait("h1", 0, 4, 4)
		Expect(string(out.Stdout.Data)).To(Equal("late\n"))
		Expect(out.Stdout.Offset).To(Equal(int64(4)))
		Expect(out.Stderr.Data).To(BeEmpty())
		var list []execio.ProcessStatus
		Expect(proc(&list, nil, "list")).To(Succeed())
		Expect(list).To(HaveLen(1))
		Expect(list[0].Handle).To(Equal("h1"))
		Expect(list[0].StdoutBytes).To(Equal(int64(9)))
		Expect(list[0].Killed).To(BeFalse(), "it exited on its own")
	})

	It("keeps the last RingBytes of a flood and says how much was dropped", func() {
		start("flood", "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; echo END")
		out := wait("flood", 45*time.Second)
		Expect(*out.ExitCode).To(BeZero())
		Expect(out.StdoutBytes).To(Equal(int64(3000004)))
		Expect(out.Stdout.Data).To(HaveLen(helperproto.RingBytes))
		Expect(out.Stdout.Dropped).To(Equal(int64(3000004 - helperproto.RingBytes)))
		Expect(out.Stdout.Offset).To(Equal(out.Stdout.Dropped))
		Expect(strings.HasSuffix(string(out.Stdout.Data), "aaa\nEND\n")).To(BeFalse())
		Expect(strings.HasSuffix(string(out.Stdout.Data), "aEND\n")).To(BeTrue())
		Expect(out.Stdout.Text("stdout")).To(HavePrefix("[code-sandbox: 2475716 bytes of stdout dropped; only the last 512.0 KiB are kept]\n"))
	})

	It("kills the whole tree, a setsid grandchild too, and records 137", func() {
		tag := "sleep 5" + randomDigits()
		start("k1", "sh", "-c", tag+"1 & setsid sh -c '"+tag+"2' & (sh -c '"+tag+"3 &' &); "+tag+"4")
		Eventually(func() bool { return procAlive(tag + "2") }).WithTimeout(5 * time.Second).Should(BeTrue())
		Eventually(func() bool { return procAlive(tag + "3") }).WithTimeout(5 * time.Second).Should(BeTrue())
		var st execio.ProcessStatus
		Expect(proc(&st, nil, "kill", "--id=k1")).To(Succeed())
		Expect(st.State).To(Equal(execio.ProcessExited))
		Expect(*st.ExitCode).To(Equal(helperproto.ExitKilled))
		Expect(st.Killed).To(BeTrue(), "the kill is recorded (a task reads cancelled)")
		Expect(procAlive(tag)).To(BeFalse(), "a process of the tree survived the kill")
		Expect(procAlive("supervise --dir="+dir)).To(BeFalse(), "the supervisor stays")
		// Idempotent.
		Expect(proc(&st, nil, "kill", "--id=k1")).To(Succeed())
		Expect(*st.ExitCode).To(Equal(helperproto.ExitKilled))
	})

	It("writes to a process's stdin and closes it", func() {
		start("cat", "sh", "-c", "cat; echo done")
		Expect(proc(nil, []byte("hello "), "stdin", "--id=cat")).To(Succeed())
		Expect(proc(nil, []byte("world\n"), "stdin", "--id=cat", "--eof")).To(Succeed())
		out := wait("cat", 20*time.Second)
		Expect(*out.ExitCode).To(BeZero())
		Expect(string(out.Stdout.Data)).To(Equal("hello world\ndone\n"))
		err := proc(nil, []byte("more"), "stdin", "--id=cat")
		Expect(errors.Is(err, execio.ErrProcessExited)).To(BeTrue(), "%v", err)
		big := bytes.Repeat([]byte("x"), helperproto.MaxStdinWrite+1)
		start("cat2", "cat")
		err = proc(nil, big, "stdin", "--id=cat2")
		Expect(errors.Is(err, execio.ErrTooLarge)).To(BeTrue(), "%v", err)
	})

	It("refuses more than MaxProcs running and makes room by dropping the oldest finished", func() {
		start("done", "true")
		Expect(*wait("done", 10*time.Second).ExitCode).To(BeZero())
		for i := 1; i < helperproto.MaxProcs; i++ {
			start("s"+strconv.Itoa(i), "sleep", "600")
		}
		// The finished one makes room for one more running.
		start("s-last", "sleep", "600")
		err := proc(nil, nil, "poll", "--id=done")
		Expect(errors.Is(err, execio.ErrProcessNotFound)).To(BeTrue(), "%v", err)
		err = proc(nil, nil, "start", "--id=s-over", "--", "true")
		Expect(errors.Is(err, execio.ErrTooManyProcesses)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("limit"))
		var list []execio.ProcessStatus
		Expect(proc(&list, nil, "list")).To(Succeed())
		Expect(list).To(HaveLen(helperproto.MaxProcs))
	})

	It("refuses garbage and path-looking handles, and unknown ones", func() {
		for _, id := range []string{"", "../x", "..", "a/b", "a b", strings.Repeat("a", 62), "x\n", "%2e%2e"} {
			err := proc(nil, nil, "poll", "--id="+id)
			Expect(errors.Is(err, execio.ErrProcessNotFound)).To(BeTrue(), "handle %q: %v", id, err)
		}
		err := proc(nil, nil, "poll", "--id=nope")
		Expect(errors.Is(err, execio.ErrProcessNotFound)).To(BeTrue(), "%v", err)
		err = proc(nil, nil, "start", "--id=../../etc", "--", "true")
		Expect(errors.Is(err, execio.ErrProcessNotFound)).To(BeTrue(), "%v", err)
		Expect(filepath.Join(dir, "..", "..", "etc", "meta")).NotTo(BeAnExistingFile())
	})

	It("reports a command that cannot be executed as its exit code and error line", func() {
		start("nx", "/no/such/program")
		out := wait("nx", 10*time.Second)
		Expect(*out.ExitCode).To(Equal(helperproto.ExitCommandNotFound))
		Expect(string(out.Stderr.Data)).To(ContainSubstring(helperproto.ErrorPrefix))
	})
})

func procCmd(helper, dir string, stdin []byte, sub string, args ...string) ([]byte, string, error) {
	cmd := exec.Command(helper, append([]string{"proc", sub, "--dir=" + dir}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.String(), err
}

// procAlive reports whether a live process's command line contains s.
func procAlive(s string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(strings.ReplaceAll(string(cmdline), "\x00", " "), s) {
			pid, _ := strconv.Atoi(e.Name())
			if e, ok := readStat(pid); ok && e.state != 'Z' {
				return true
			}
		}
	}
	return false
}
