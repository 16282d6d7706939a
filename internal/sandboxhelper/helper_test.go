/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxhelper

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var unit = Label("unit")

// call runs Main in-process and returns its exit code, stdout and stderr.
func call(stdin []byte, args ...string) (int, []byte, string) {
	var stdout, stderr bytes.Buffer
	code := Main(args, bytes.NewReader(stdin), &stdout, &stderr)
	return code, stdout.Bytes(), stderr.String()
}

func tarOf(entries ...*tar.Header) []byte {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		Expect(tw.WriteHeader(h)).To(Succeed())
		_, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(tw.Close()).To(Succeed())
	return buf.Bytes()
}

func names(data []byte) []string {
	GinkgoHelper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		s := h.Name
		if h.Typeflag == tar.TypeSymlink {
			s += " -> " + h.Linkname
		}
		out = append(out, s)
	}
}

var _ = Describe("The error protocol", unit, func() {
	It("round-trips an error line and maps kinds to execio's errors", func() {
		for kind, want := range map[string]error{
			helperproto.KindNotFound: execio.ErrPathNotFound, helperproto.KindInvalidPath: execio.ErrInvalidPath,
			helperproto.KindTooLarge: execio.ErrTooLarge, helperproto.KindUnsupportedEntry: execio.ErrUnsupportedEntry,
		} {
			var stderr bytes.Buffer
			code := report(&stderr, &helperproto.Error{Kind: kind, Message: "m \"quoted\"\nline"})
			Expect(stderr.String()).To(HavePrefix(helperproto.ErrorPrefix))
			Expect(strings.Count(stderr.String(), "\n")).To(Equal(1), "one line")
			he, ok := helperproto.ParseError(append([]byte("noise\n"), stderr.Bytes()...))
			Expect(ok).To(BeTrue())
			Expect(he.Kind).To(Equal(kind))
			Expect(he.Message).To(Equal("m \"quoted\"\nline"))
			Expect(he).To(MatchError(want))
			Expect(code).To(Equal(he.ExitCode()))
		}
		_, ok := helperproto.ParseError([]byte("plain failure"))
		Expect(ok).To(BeFalse())
		_, ok = helperproto.ParseError([]byte(helperproto.ErrorPrefix + "{not json"))
		Expect(ok).To(BeFalse())
	})

	It("classifies errors from execio, the file system and os.Root", func() {
		Expect(classify(os.ErrNotExist).Kind).To(Equal(helperproto.KindNotFound))
		Expect(classify(errors.New("openat x: path escapes from parent")).Kind).To(Equal(helperproto.KindInvalidPath))
		Expect(classify(execio.ErrTooLarge).Kind).To(Equal(helperproto.KindTooLarge))
		Expect(classify(errors.New("boom")).Kind).To(Equal(helperproto.KindOther))
		Expect(classify(errors.New("boom")).ExitCode()).To(Equal(helperproto.ExitOther))
	})
})

var _ = Describe("Argument parsing", unit, func() {
	It("parses run", func() {
		opts, err := parseRun([]string{"--id=abc-1", "--backstop=7", "--", "sh", "-c", "--id=x"})
		Expect(err).NotTo(HaveOccurred())
		Expect(opts).To(Equal(runOptions{id: "abc-1", backstop: 7, argv: []string{"sh", "-c", "--id=x"}}))
		for _, bad := range [][]string{
			{"--", "x"}, {"--id=a b", "--", "x"}, {"--id=a"}, {"--id=a", "--"}, {"--id=a", "--backstop=-1", "--", "x"}, {"--id=a", "--nope", "--", "x"},
		} {
			_, err := parseRun(bad)
			Expect(err).To(HaveOccurred(), "%q", bad)
		}
	})

	It("parses the transfer flags and refuses unknown ones", func() {
		f, err := parseFlags([]string{"--root=/app", "--dest=", "--max-bytes=5", "--max-entries=3"}, "untar")
		Expect(err).NotTo(HaveOccurred())
		Expect(f).To(Equal(transferFlags{root: "/app", rel: "", maxBytes: 5, maxEntries: 3}))
		_, err = parseFlags([]string{"--root=/app", "--path=x", "--max-entries=3"}, "tar")
		Expect(err).To(HaveOccurred())
		_, err = parseFlags([]string{"--root=/app"}, "tar")
		Expect(err).To(HaveOccurred())
		code, _, stderr := call(nil, "bogus")
		Expect(code).To(Equal(helperproto.ExitUsage))
		Expect(stderr).To(ContainSubstring("usage:"))
		code, _, _ = call(nil, "kill", "bad id")
		Expect(code).To(Equal(helperproto.ExitUsage))
	})
})

var _ = Describe("untar and tar", unit, func() {
	var root, outside string

	BeforeEach(func() {
		base := GinkgoT().TempDir()
		root = filepath.Join(base, "root")
		outside = filepath.Join(base, "outside")
		Expect(os.Mkdir(root, 0o755)).To(Succeed())
		Expect(os.Mkdir(outside, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(outside, "victim"), []byte("victim"), 0o644)).To(Succeed())
	})

	It("extracts dirs and files with masked modes and tars them back", func() {
		in := tarOf(
			&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o555},
			&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 3},
			&tar.Header{Name: "e/g/h", Typeflag: tar.TypeReg, Mode: 0o600, Size: 0},
		)
		code, _, stderr := call(in, "untar", "--root="+root, "--dest=up/x")
		Expect(code).To(BeZero(), stderr)
		info, err := os.Stat(filepath.Join(root, "up/x/d/f"))
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Mode()).To(Equal(os.FileMode(0o755)), "setuid dropped, umask ignored")
		info, err = os.Stat(filepath.Join(root, "up/x/d"))
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Mode().Perm()).To(Equal(os.FileMode(0o555)), "a read-only dir still received its file")

		code, out, stderr := call(nil, "tar", "--root="+root, "--path=up")
		Expect(code).To(BeZero(), stderr)
		Expect(names(out)).To(Equal([]string{"up/", "up/x/", "up/x/d/", "up/x/d/f", "up/x/e/", "up/x/e/g/", "up/x/e/g/h"}))
		code, out, _ = call(nil, "tar", "--root="+root, "--path=")
		Expect(code).To(BeZero())
		Expect(names(out)[0]).To(Equal("root/"), "the root itself is named after its base name")
	})

	It("never follows a planted symlink out of the root (A9, A11)", func() {
		Expect(os.Symlink(outside, filepath.Join(root, "out"))).To(Succeed())
		Expect(os.Symlink(filepath.Join(outside, "victim"), filepath.Join(root, "link"))).To(Succeed())
		file := func(name string) []byte {
			return tarOf(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
		}

		code, _, stderr := call(file("x"), "untar", "--root="+root, "--dest=out")
		Expect(code).To(Equal(helperproto.ExitInvalidPath), stderr)
		code, _, stderr = call(file("out/x"), "untar", "--root="+root, "--dest=")
		Expect(code).To(Equal(helperproto.ExitInvalidPath), stderr)
		code, _, stderr = call(nil, "tar", "--root="+root, "--path=out/victim")
		Expect(code).To(Equal(helperproto.ExitInvalidPath), stderr)
		Expect(filepath.Join(outside, "x")).NotTo(BeAnExistingFile())

		// Writing over a symlink replaces it; the target is untouched.
		code, _, stderr = call(file("link"), "untar", "--root="+root, "--dest=")
		Expect(code).To(BeZero(), stderr)
		Expect(os.ReadFile(filepath.Join(outside, "victim"))).To(Equal([]byte("victim")))
		info, err := os.Lstat(filepath.Join(root, "link"))
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Mode().IsRegular()).To(BeTrue())

		// Symlinks are archived as links.
		code, out, _ := call(nil, "tar", "--root="+root, "--path=out")
		Expect(code).To(BeZero())
		Expect(names(out)).To(Equal([]string{"out -> " + outside}))
	})

	It("refuses bad entries, over-cap archives and missing paths", func() {
		code, _, _ := call(tarOf(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}), "untar", "--root="+root, "--dest=")
		Expect(code).To(Equal(helperproto.ExitUnsupportedEntry))
		code, _, _ = call(tarOf(&tar.Header{Name: "../x", Typeflag: tar.TypeReg}), "untar", "--root="+root, "--dest=")
		Expect(code).To(Equal(helperproto.ExitInvalidPath))
		code, _, _ = call(tarOf(&tar.Header{Name: "a", Typeflag: tar.TypeReg, Size: 10}), "untar", "--root="+root, "--dest=", "--max-bytes=5")
		Expect(code).To(Equal(helperproto.ExitTooLarge))
		code, _, _ = call(tarOf(&tar.Header{Name: "a", Typeflag: tar.TypeReg}, &tar.Header{Name: "b", Typeflag: tar.TypeReg}), "untar", "--root="+root, "--dest=", "--max-entries=1")
		Expect(code).To(Equal(helperproto.ExitTooLarge))
		code, _, _ = call(nil, "untar", "--root="+root, "--dest=../x")
		Expect(code).To(Equal(helperproto.ExitInvalidPath))
		code, _, _ = call(nil, "untar", "--root=relative", "--dest=")
		Expect(code).To(Equal(helperproto.ExitInvalidPath))

		Expect(os.WriteFile(filepath.Join(root, "big"), make([]byte, 100), 0o644)).To(Succeed())
		code, _, _ = call(nil, "tar", "--root="+root, "--path=big", "--max-bytes=99")
		Expect(code).To(Equal(helperproto.ExitTooLarge))
		code, _, stderr := call(nil, "tar", "--root="+root, "--path=missing")
		Expect(code).To(Equal(helperproto.ExitNotFound))
		Expect(stderr).To(ContainSubstring("missing"))
	})

	It("skips fifos inside a tree without blocking and refuses one at the top", func() {
		Expect(os.Mkdir(filepath.Join(root, "s"), 0o755)).To(Succeed())
		Expect(syscall.Mkfifo(filepath.Join(root, "s", "fifo"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(root, "s", "f"), []byte("x"), 0o644)).To(Succeed())
		code, out, _ := call(nil, "tar", "--root="+root, "--path=s")
		Expect(code).To(BeZero())
		Expect(names(out)).To(Equal([]string{"s/", "s/f"}))
		code, _, _ = call(nil, "tar", "--root="+root, "--path=s/fifo")
		Expect(code).To(Equal(helperproto.ExitUnsupportedEntry))
	})
})

var _ = Describe("run and kill (a built helper)", unit, Ordered, func() {
	var helper string

	BeforeAll(func() {
		if runtime.GOOS != "linux" {
			Skip("run and kill are Linux-only")
		}
		// kill recognises runs by the binary's name, as in a sandbox.
		helper = filepath.Join(GinkgoT().TempDir(), "helper")
		build := exec.Command("go", "build", "-o", helper, "github.com/code-sandbox/code-sandbox-operator/cmd/code-sandbox-helper")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
	})

	helperCmd := func(args ...string) (int, string, string) {
		cmd := exec.Command(helper, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return exitErr.ExitCode(), stdout.String(), stderr.String()
		}
		Expect(err).NotTo(HaveOccurred())
		return 0, stdout.String(), stderr.String()
	}

	// alive reports whether any process's command line contains s.
	alive := func(s string) bool {
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

	It("propagates exit codes, signals and exec failures, and marks the environment", func() {
		code, stdout, stderr := helperCmd("run", "--id=t1", "--", "sh", "-c", `echo "$`+helperproto.RunIDEnv+`"; echo err >&2; exit 3`)
		Expect(code).To(Equal(3))
		Expect(stdout).To(Equal("t1\n"))
		Expect(stderr).To(Equal("err\n"))
		code, _, _ = helperCmd("run", "--id=t1", "--", "sh", "-c", "kill -9 $$")
		Expect(code).To(Equal(137))
		code, _, stderr = helperCmd("run", "--id=t1", "--", "/no/such/program")
		Expect(code).To(Equal(helperproto.ExitCommandNotFound))
		Expect(stderr).To(ContainSubstring(helperproto.ErrorPrefix))
	})

	It("delivers everything a command wrote before it exited, even to a slow reader", func() {
		// 512 KiB, then a last line. The command exits as soon as its last
		// bytes are in the helper's pipe; the reader here takes about a
		// second more for the rest, far longer than the drain grace.
		cmd := exec.Command(helper, "run", "--id=t5", "--", "sh", "-c", "head -c 524288 /dev/zero | tr '\\0' a; echo END")
		out, err := cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		Expect(cmd.Start()).To(Succeed())
		var got bytes.Buffer
		buf := make([]byte, 4<<10)
		for {
			n, rerr := out.Read(buf)
			got.Write(buf[:n])
			if rerr != nil {
				break
			}
			time.Sleep(8 * time.Millisecond)
		}
		Expect(cmd.Wait()).To(Succeed())
		Expect(got.Len()).To(Equal(524288+len("END\n")), "output lost after the command exited")
		Expect(strings.HasSuffix(got.String(), "END\n")).To(BeTrue())
	})

	It("kills a tree with setsid and double-fork escapees at the backstop", func() {
		tag := "sleep 3" + randomDigits()
		start := time.Now()
		code, _, _ := helperCmd("run", "--id=t2", "--backstop=1", "--", "sh", "-c", tag+"1 & setsid sh -c '"+tag+"2' & (sh -c '"+tag+"3 &' &); "+tag+"4")
		Expect(code).To(Equal(helperproto.ExitKilled))
		// Relative to what it is told apart from: the sleeps last 3e5 s or
		// more, the backstop 1 s; a loaded machine may take a few more.
		Expect(time.Since(start)).To(BeNumerically("<", 30*time.Second), "the backstop did not end the tree")
		Expect(alive(tag)).To(BeFalse())
	})

	// serveSession is a `helper serve` process and its two pipes.
	type serveSession struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   io.Reader
	}
	startServe := func() *serveSession {
		cmd := exec.Command(helper, "serve")
		stdin, err := cmd.StdinPipe()
		Expect(err).NotTo(HaveOccurred())
		out, err := cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		s := &serveSession{cmd: cmd, stdin: stdin, out: out}
		kind, _, err := helperproto.ReadFrame(out, helperproto.MaxReadyPayload)
		Expect(err).NotTo(HaveOccurred())
		Expect(kind).To(Equal(helperproto.FrameReady))
		return s
	}
	send := func(s *serveSession, kind byte, payload []byte) {
		_, err := s.stdin.Write(helperproto.AppendFrame(nil, kind, payload))
		Expect(err).NotTo(HaveOccurred())
	}
	request := func(s *serveSession, req helperproto.ServeRequest) {
		payload, err := json.Marshal(req)
		Expect(err).NotTo(HaveOccurred())
		send(s, helperproto.FrameRequest, payload)
	}
	// outcome reads one command's frames: its stdout, stderr and exit code.
	outcome := func(s *serveSession) (string, string, int) {
		var stdout, stderr strings.Builder
		accepted := false
		for {
			kind, payload, err := helperproto.ReadFrame(s.out, helperproto.MaxOutputFrame)
			Expect(err).NotTo(HaveOccurred())
			switch kind {
			case helperproto.FrameAccepted:
				accepted = true
			case helperproto.FrameStdout:
				stdout.Write(payload)
			case helperproto.FrameStderr:
				stderr.Write(payload)
			case helperproto.FrameExit:
				code, err := helperproto.ParseExit(payload)
				Expect(err).NotTo(HaveOccurred())
				Expect(accepted || code == helperproto.ExitUsage).To(BeTrue(), "only a refused request skips the accepted frame")
				return stdout.String(), stderr.String(), code
			default:
				Fail(fmt.Sprintf("unexpected frame %q", kind))
			}
		}
	}

	It("serves commands one after another, each with its own env, directory and stdin", func() {
		s := startServe()
		dir := GinkgoT().TempDir()
		request(s, helperproto.ServeRequest{ID: "s1", Argv: []string{"sh", "-c", `echo "$FOO $(pwd) $` + helperproto.RunIDEnv + `"; cat; echo err >&2; exit 3`},
			Env: []string{"FOO=bar"}, WorkingDir: dir, Stdin: []byte("in\n")})
		stdout, stderr, code := outcome(s)
		Expect(code).To(Equal(3))
		Expect(stdout).To(Equal("bar " + dir + " s1\nin\n"))
		Expect(stderr).To(Equal("err\n"))

		cwd, err := os.Getwd()
		Expect(err).NotTo(HaveOccurred())
		request(s, helperproto.ServeRequest{ID: "s2", Argv: []string{"sh", "-c", `echo "${FOO:-unset} $(pwd)"; cat`}})
		stdout, _, code = outcome(s)
		Expect(code).To(BeZero())
		Expect(stdout).To(Equal("unset "+cwd+"\n"), "nothing of the first command stays; no stdin is EOF")

		request(s, helperproto.ServeRequest{ID: "s3", Argv: []string{"/no/such/program"}})
		_, stderr, code = outcome(s)
		Expect(code).To(Equal(helperproto.ExitCommandNotFound))
		Expect(stderr).To(ContainSubstring(helperproto.ErrorPrefix))

		request(s, helperproto.ServeRequest{ID: "s4", Argv: []string{"true"}, WorkingDir: "/no/such/dir"})
		_, stderr, code = outcome(s)
		Expect(code).To(Equal(helperproto.ExitCannotExecute))
		Expect(stderr).To(ContainSubstring("cannot change to working directory"))

		request(s, helperproto.ServeRequest{ID: "s5", Argv: []string{"true"}})
		_, _, code = outcome(s)
		Expect(code).To(BeZero(), "still serving after failures")
	})

	It("kills only the command a kill frame names, and everything when its stdin ends", func() {
		s := startServe()
		tag := "sleep 5" + randomDigits()
		request(s, helperproto.ServeRequest{ID: "k1", Argv: []string{"sh", "-c", tag + "1 & setsid sh -c '" + tag + "2' & " + tag + "3"}})
		Eventually(func() bool { return alive(tag + "2") }).WithTimeout(5 * time.Second).Should(BeTrue())
		send(s, helperproto.FrameKill, []byte("another-run"))
		Consistently(func() bool { return alive(tag + "3") }).WithTimeout(300 * time.Millisecond).Should(BeTrue())
		send(s, helperproto.FrameKill, []byte("k1"))
		_, _, code := outcome(s)
		Expect(code).To(Equal(helperproto.ExitKilled))
		Expect(alive(tag)).To(BeFalse())

		// A late kill (after its command ended) is ignored.
		send(s, helperproto.FrameKill, []byte("k1"))
		tag2 := "sleep 6" + randomDigits()
		request(s, helperproto.ServeRequest{ID: "k2", Argv: []string{"sh", "-c", tag2 + "1 & " + tag2 + "2"}})
		Eventually(func() bool { return alive(tag2 + "1") }).WithTimeout(5 * time.Second).Should(BeTrue())
		Expect(s.stdin.Close()).To(Succeed())
		exited := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(exited) }()
		Eventually(exited).WithTimeout(5*time.Second).Should(BeClosed(), "serve exits once its manager is gone")
		Eventually(func() bool { return alive(tag2) }).WithTimeout(5 * time.Second).Should(BeFalse())
	})

	It("leaves a finished command's background child to init, out of a later kill's reach", func() {
		s := startServe()
		tag := "sleep 7" + randomDigits()
		request(s, helperproto.ServeRequest{ID: "b1", Argv: []string{"sh", "-c", tag + " & echo started"}})
		stdout, _, code := outcome(s)
		Expect(code).To(BeZero())
		Expect(stdout).To(Equal("started\n"))
		request(s, helperproto.ServeRequest{ID: "b2", Argv: []string{"sleep", "30"}})
		send(s, helperproto.FrameKill, []byte("b2"))
		_, _, code = outcome(s)
		Expect(code).To(Equal(helperproto.ExitKilled))
		Expect(alive(tag)).To(BeTrue(), "the first command's background child survives")
		out, err := exec.Command("pkill", "-f", tag).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
	})

	It("refuses a malformed request and exits", func() {
		s := startServe()
		send(s, helperproto.FrameRequest, []byte(`{"id":"bad id","argv":["true"]}`))
		_, stderr, code := outcome(s)
		Expect(code).To(Equal(helperproto.ExitUsage))
		Expect(stderr).To(ContainSubstring("run ID"))
		var exitErr *exec.ExitError
		Expect(errors.As(s.cmd.Wait(), &exitErr)).To(BeTrue())
	})

	Describe("its own untar and tar, served in the serve process", func() {
		var root, outside string
		BeforeEach(func() {
			base := GinkgoT().TempDir()
			root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
			Expect(os.Mkdir(root, 0o755)).To(Succeed())
			Expect(os.Mkdir(outside, 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(outside, "victim"), []byte("victim"), 0o644)).To(Succeed())
		})
		untarReq := func(id string, archive []byte, flags ...string) helperproto.ServeRequest {
			return helperproto.ServeRequest{ID: id, Argv: append([]string{helper, "untar", "--root=" + root, "--dest="}, flags...), Stdin: archive}
		}
		// stream sends archive as data frames of chunk bytes, then the end.
		stream := func(s *serveSession, archive []byte, chunk int) {
			for rest := archive; len(rest) > 0; {
				n := min(chunk, len(rest))
				send(s, helperproto.FrameData, rest[:n])
				rest = rest[n:]
			}
			send(s, helperproto.FrameCloseWrite, nil)
		}

		It("announces the feature and forks nothing: it works with the binary gone from its path", func() {
			// A copy of the helper, removed once serve runs: a forked
			// `helper run -- helper untar` could not exec it any more.
			moved := filepath.Join(GinkgoT().TempDir(), "helper")
			data, err := os.ReadFile(helper)
			Expect(err).NotTo(HaveOccurred())
			Expect(os.WriteFile(moved, data, 0o755)).To(Succeed())
			cmd := exec.Command(moved, "serve")
			stdin, err := cmd.StdinPipe()
			Expect(err).NotTo(HaveOccurred())
			out, err := cmd.StdoutPipe()
			Expect(err).NotTo(HaveOccurred())
			Expect(cmd.Start()).To(Succeed())
			DeferCleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			s := &serveSession{cmd: cmd, stdin: stdin, out: out}
			kind, payload, err := helperproto.ReadFrame(out, helperproto.MaxReadyPayload)
			Expect(err).NotTo(HaveOccurred())
			Expect(kind).To(Equal(helperproto.FrameReady))
			Expect(helperproto.ParseReady(payload).Has(helperproto.FeatureStreamedUntar)).To(BeTrue())
			Expect(os.Remove(moved)).To(Succeed())

			request(s, helperproto.ServeRequest{ID: "f1", Argv: []string{moved, "untar", "--root=" + root, "--dest=up/x"},
				Stdin: tarOf(&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o4751, Size: 3})})
			_, stderr, code := outcome(s)
			Expect(code).To(BeZero(), stderr)
			info, err := os.Stat(filepath.Join(root, "up/x/d/f"))
			Expect(err).NotTo(HaveOccurred())
			Expect(info.Mode()).To(Equal(os.FileMode(0o751)), "setuid dropped, umask ignored, as the forked untar")
			Expect(os.ReadFile(filepath.Join(root, "up/x/d/f"))).To(Equal([]byte("xxx")))

			request(s, helperproto.ServeRequest{ID: "f2", Argv: []string{moved, "tar", "--root=" + root, "--path=up"}})
			stdout, stderr, code := outcome(s)
			Expect(code).To(BeZero(), stderr)
			Expect(names([]byte(stdout))).To(Equal([]string{"up/", "up/x/", "up/x/d/", "up/x/d/f"}))

			request(s, helperproto.ServeRequest{ID: "f3", Argv: []string{moved, "tar", "--root=" + root, "--path=missing"}})
			_, stderr, code = outcome(s)
			Expect(code).To(Equal(helperproto.ExitNotFound))
			Expect(stderr).To(ContainSubstring(helperproto.ErrorPrefix))

			request(s, helperproto.ServeRequest{ID: "f4", Argv: []string{moved, "untar", "--root=" + root, "--bogus=1"}})
			_, stderr, code = outcome(s)
			Expect(code).To(Equal(helperproto.ExitUsage))
			Expect(stderr).To(ContainSubstring("unknown flag"))

			request(s, helperproto.ServeRequest{ID: "f5", Argv: []string{"true"}})
			_, _, code = outcome(s)
			Expect(code).To(BeZero(), "still serving commands")
		})

		It("refuses what a hostile archive or request tries, as the forked untar does, and keeps serving", func() {
			s := startServe()
			Expect(os.Symlink(outside, filepath.Join(root, "out"))).To(Succeed())
			reg := func(name string, size int64) *tar.Header {
				return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}
			}
			for _, c := range []struct {
				what    string
				archive []byte
				flags   []string
				code    int
			}{
				{"../x", tarOf(reg("../x", 1)), nil, helperproto.ExitInvalidPath},
				{"an absolute path", tarOf(reg("/etc/x", 1)), nil, helperproto.ExitInvalidPath},
				{"a file through a planted symlink", tarOf(reg("out/x", 1)), nil, helperproto.ExitInvalidPath},
				{"a destination through a planted symlink", tarOf(reg("x", 1)), []string{"--dest=out"}, helperproto.ExitInvalidPath},
				{"a symlink, then a file through it", tarOf(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, reg("l/x", 1)), []string{"--links=1"}, helperproto.ExitInvalidPath},
				{"a symlink without --links", tarOf(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}), nil, helperproto.ExitUnsupportedEntry},
				{"a hard link", tarOf(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside/victim"}), nil, helperproto.ExitUnsupportedEntry},
				{"oversize", tarOf(reg("a", 10)), []string{"--max-bytes=5"}, helperproto.ExitTooLarge},
				{"too many entries", tarOf(reg("a", 0), reg("b", 0), reg("c", 0)), []string{"--max-entries=2"}, helperproto.ExitTooLarge},
				{"a long path", tarOf(reg(strings.Repeat("a/", 3000)+"f", 0)), nil, helperproto.ExitInvalidPath},
				{"garbage", []byte(strings.Repeat("not a tar ", 100)), nil, helperproto.ExitOther},
			} {
				req := untarReq("h", c.archive)
				if len(c.flags) > 0 && strings.HasPrefix(c.flags[0], "--dest=") {
					req.Argv = append(req.Argv[:3], c.flags...)
				} else {
					req.Argv = append(req.Argv, c.flags...)
				}
				request(s, req)
				_, stderr, code := outcome(s)
				Expect(code).To(Equal(c.code), "%s: %s", c.what, stderr)
				Expect(stderr).To(ContainSubstring(helperproto.ErrorPrefix), c.what)
			}
			entries, err := os.ReadDir(outside)
			Expect(err).NotTo(HaveOccurred())
			Expect(entries).To(HaveLen(1), "nothing was written outside the root")
			Expect(os.ReadFile(filepath.Join(outside, "victim"))).To(Equal([]byte("victim")))
			request(s, helperproto.ServeRequest{ID: "ok", Argv: []string{"true"}})
			_, _, code := outcome(s)
			Expect(code).To(BeZero())
		})

		It("never writes outside the root while the sandbox swaps a directory for a symlink", func() {
			s := startServe()
			dir := filepath.Join(root, "d")
			stop := make(chan struct{})
			swapped := make(chan int)
			go func() {
				defer GinkgoRecover()
				n := 0
				for {
					select {
					case <-stop:
						swapped <- n
						return
					default:
					}
					// A real directory, then a symlink to outside, again and again.
					_ = os.RemoveAll(dir)
					_ = os.Mkdir(dir, 0o755)
					_ = os.RemoveAll(dir)
					_ = os.Symlink(outside, dir)
					n++
				}
			}()
			var hs []*tar.Header
			for i := range 200 {
				hs = append(hs, &tar.Header{Name: fmt.Sprintf("d/f%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
			}
			archive := tarOf(hs...)
			for i := range 20 {
				request(s, untarReq(fmt.Sprintf("race%d", i), archive))
				outcome(s) // success or an invalid path: either, never outside
			}
			close(stop)
			Expect(<-swapped).To(BeNumerically(">", 10), "the swap raced the writes")
			entries, err := os.ReadDir(outside)
			Expect(err).NotTo(HaveOccurred())
			Expect(entries).To(HaveLen(1), "a file landed through the swapped symlink")
		})

		It("takes an upload as data frames, and drops the rest of one it refused part way", func() {
			s := startServe()
			big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			Expect(tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o640, Size: int64(len(big))})).To(Succeed())
			_, err := tw.Write(big)
			Expect(err).NotTo(HaveOccurred())
			Expect(tw.Close()).To(Succeed())
			req := untarReq("s1", nil, "--max-bytes=67108864")
			req.StdinFrames = true
			request(s, req)
			stream(s, buf.Bytes(), 256<<10)
			_, stderr, code := outcome(s)
			Expect(code).To(BeZero(), stderr)
			Expect(os.ReadFile(filepath.Join(root, "big"))).To(Equal(big))

			// Refused at its first entry: the exit frame comes before the
			// rest, which is dropped, and the next request is served.
			bad := append(tarOf(&tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}), buf.Bytes()...)
			req = untarReq("s2", nil)
			req.StdinFrames = true
			request(s, req)
			send(s, helperproto.FrameData, bad[:1024])
			_, stderr, code = outcome(s)
			Expect(code).To(Equal(helperproto.ExitInvalidPath), stderr)
			stream(s, bad[1024:], 256<<10)
			request(s, helperproto.ServeRequest{ID: "s3", Argv: []string{"sh", "-c", "echo after"}})
			stdout, _, code := outcome(s)
			Expect(code).To(BeZero())
			Expect(stdout).To(Equal("after\n"))

			// A kill in the middle of one: 137, then the end of the data.
			req = untarReq("s4", nil, "--max-bytes=67108864")
			req.StdinFrames = true
			request(s, req)
			send(s, helperproto.FrameData, buf.Bytes()[:64<<10])
			send(s, helperproto.FrameKill, []byte("s4"))
			_, _, code = outcome(s)
			Expect(code).To(Equal(helperproto.ExitKilled))
			send(s, helperproto.FrameCloseWrite, nil)
			request(s, helperproto.ServeRequest{ID: "s5", Argv: []string{"true"}})
			_, _, code = outcome(s)
			Expect(code).To(BeZero())

			// Streamed stdin is for untar only.
			request(s, helperproto.ServeRequest{ID: "s6", Argv: []string{"cat"}, StdinFrames: true})
			_, stderr, code = outcome(s)
			Expect(code).To(Equal(helperproto.ExitUsage))
			Expect(stderr).To(ContainSubstring("stdinFrames"))
		})
	})

	It("kills a run by ID and is idempotent", func() {
		tag := "sleep 4" + randomDigits()
		cmd := exec.Command(helper, "run", "--id=t3", "--", "sh", "-c", tag+"1 & setsid sh -c '"+tag+"2' & "+tag+"3")
		Expect(cmd.Start()).To(Succeed())
		Eventually(func() bool { return alive(tag + "2") }).WithTimeout(5 * time.Second).Should(BeTrue())
		code, _, stderr := helperCmd("kill", "t3")
		Expect(code).To(BeZero(), stderr)
		err := cmd.Wait()
		var exitErr *exec.ExitError
		Expect(errors.As(err, &exitErr)).To(BeTrue())
		Expect(exitErr.ExitCode()).To(Equal(helperproto.ExitKilled))
		Expect(alive(tag)).To(BeFalse())
		code, _, _ = helperCmd("kill", "t3")
		Expect(code).To(BeZero(), "nothing left to kill is fine")
	})
})

func randomDigits() string {
	return strings.TrimLeft(time.Now().Format(".000000"), ".")
}
