/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package execio

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing/iotest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Request", Label("unit"), func() {
	It("fills defaults and keeps what was set", func() {
		r, err := Request{Command: []string{"ls", "-l"}}.Normalize()
		Expect(err).NotTo(HaveOccurred())
		Expect(r.TimeoutSeconds).To(Equal(int64(60)))
		Expect(r.OutputLimitBytes).To(Equal(DefaultOutputLimit))
		Expect(r.Timeout()).To(Equal(DefaultTimeout))
		Expect(r.Argv()).To(Equal([]string{"ls", "-l"}))

		r, err = Request{Shell: "echo $HOME", TimeoutSeconds: 5, OutputLimitBytes: 10, WorkingDir: "/tmp/x", Env: []string{"A_1=x=y", "_B="}}.Normalize()
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Timeout()).To(Equal(5 * time.Second))
		Expect(r.OutputLimitBytes).To(Equal(int64(10)))
		Expect(r.Argv()).To(Equal([]string{"/bin/sh", "-c", "echo $HOME"}))
		Expect(Request{}.Timeout()).To(Equal(DefaultTimeout))
	})

	DescribeTable("rejects with ErrInvalidRequest naming the problem (A7, A17, A18)",
		func(r Request, want string) {
			_, err := r.Normalize()
			Expect(err).To(MatchError(ErrInvalidRequest))
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("neither", Request{}, "both are empty"),
		Entry("both", Request{Command: []string{"a"}, Shell: "a"}, "not both"),
		Entry("empty program", Request{Command: []string{""}}, "command[0]"),
		Entry("NUL in argv", Request{Command: []string{"echo", "a\x00b"}}, "command[1]"),
		Entry("NUL in shell", Request{Shell: "echo\x00"}, "shell"),
		Entry("env without =", Request{Shell: "x", Env: []string{"FOO"}}, `"FOO" is not KEY=VALUE`),
		Entry("env bad name", Request{Shell: "x", Env: []string{"1FOO=x"}}, "not a valid variable name"),
		Entry("env empty name", Request{Shell: "x", Env: []string{"=x"}}, "not a valid variable name"),
		Entry("env dash", Request{Shell: "x", Env: []string{"A-B=x"}}, "A-B"),
		Entry("env NUL", Request{Shell: "x", Env: []string{"A=x\x00"}}, "NUL"),
		Entry("relative workdir", Request{Shell: "x", WorkingDir: "app"}, "clean absolute"),
		Entry("unclean workdir", Request{Shell: "x", WorkingDir: "/app/../etc"}, "clean absolute"),
		Entry("workdir /proc/self/fd/7", Request{Shell: "x", WorkingDir: "/proc/self/fd/7"}, "/proc"),
		Entry("workdir /proc", Request{Shell: "x", WorkingDir: "/proc"}, "/proc"),
		Entry("workdir /dev/fd/7", Request{Shell: "x", WorkingDir: "/dev/fd/7"}, "/dev/fd"),
		Entry("long workdir", Request{Shell: "x", WorkingDir: "/" + strings.Repeat("a", MaxPathLength)}, "bytes long"),
		Entry("negative timeout", Request{Shell: "x", TimeoutSeconds: -1}, "timeoutSeconds -1"),
		Entry("huge timeout", Request{Shell: "x", TimeoutSeconds: 86401}, "timeoutSeconds 86401"),
		Entry("negative output limit", Request{Shell: "x", OutputLimitBytes: -5}, "outputLimitBytes -5"),
		Entry("huge output limit", Request{Shell: "x", OutputLimitBytes: MaxOutputLimit + 1}, "outputLimitBytes"),
		Entry("huge stdin", Request{Shell: "x", Stdin: make([]byte, MaxStdin+1)}, "stdin"),
	)

	It("accepts the edge values", func() {
		_, err := Request{Shell: "x", TimeoutSeconds: int64(MaxTimeout / time.Second), OutputLimitBytes: MaxOutputLimit, Stdin: make([]byte, MaxStdin)}.Normalize()
		Expect(err).NotTo(HaveOccurred())
		_, err = Request{Command: []string{"; rm -rf /", "$(id)", "a\nb"}}.Normalize()
		Expect(err).NotTo(HaveOccurred(), "shell metacharacters are just argv (A18)")
	})
})

var _ = Describe("ResolvePath", Label("unit"), func() {
	It("lists the allowed roots", func() {
		Expect(AllowedRoots("/app")).To(Equal([]string{"/app", "/tmp", "/var/tmp"}))
	})

	DescribeTable("resolves into an allowed root",
		func(wd, p string, want Target) {
			Expect(ResolvePath(wd, p)).To(Equal(want))
		},
		Entry("relative", "/app", "src/main.py", Target{Root: "/app", Rel: "src/main.py"}),
		Entry("dot", "/app", ".", Target{Root: "/app", Rel: ""}),
		Entry("dot slash", "/app", "./a//b/", Target{Root: "/app", Rel: "a/b"}),
		Entry("absolute in the workdir", "/app", "/app/x", Target{Root: "/app", Rel: "x"}),
		Entry("the workdir itself", "/app", "/app", Target{Root: "/app", Rel: ""}),
		Entry("/tmp", "/app", "/tmp/a/b", Target{Root: "/tmp", Rel: "a/b"}),
		Entry("/var/tmp root", "/app", "/var/tmp/", Target{Root: "/var/tmp", Rel: ""}),
		Entry("nested workdir wins", "/tmp/work", "/tmp/work/f", Target{Root: "/tmp/work", Rel: "f"}),
		Entry("beside the nested workdir", "/tmp/work", "/tmp/other", Target{Root: "/tmp", Rel: "other"}),
	)

	DescribeTable("refuses with ErrInvalidPath naming the path and the roots (A8)",
		func(p, reason string) {
			_, err := ResolvePath("/app", p)
			Expect(err).To(MatchError(ErrInvalidPath))
			Expect(err.Error()).To(ContainSubstring(reason))
			Expect(err.Error()).To(ContainSubstring("allowed roots: /app, /tmp, /var/tmp"))
		},
		Entry("../../etc/passwd", "../../etc/passwd", `".."`),
		Entry("/etc/passwd", "/etc/passwd", "outside"),
		Entry("a/../../x", "a/../../x", `".."`),
		Entry("a/../b stays inside but is refused", "a/../b", `".."`),
		Entry("/app/../etc", "/app/../etc", `".."`),
		Entry("/apple is not /app", "/apple/x", "outside"),
		Entry("/", "/", "outside"),
		Entry("empty", "", "empty"),
		Entry("NUL", "a\x00b", "NUL"),
		Entry("4 KB name", strings.Repeat("a", 4096), "component"),
		Entry("too long path", strings.Repeat("a/", 2049), "bytes long"),
	)

	It("refuses a bad working directory", func() {
		for _, wd := range []string{"", "app", "/", "/app/"} {
			_, err := ResolvePath(wd, "x")
			Expect(err).To(MatchError(ErrInvalidPath), wd)
		}
	})

	It("checks targets received from elsewhere", func() {
		Expect(CheckTarget(Target{Root: "/app"})).To(Succeed())
		Expect(CheckTarget(Target{Root: "/tmp", Rel: "a/b"})).To(Succeed())
		for _, t := range []Target{{Root: "app"}, {Root: "/"}, {Root: "/app", Rel: "../x"}, {Root: "/app", Rel: "/x"}, {Root: "/app", Rel: "a//b"}, {Root: "/app", Rel: "a/"}, {Root: "/app", Rel: "."}} {
			Expect(CheckTarget(t)).To(MatchError(ErrInvalidPath), "%+v", t)
		}
	})
})

var _ = Describe("CapWriter", Label("unit"), func() {
	It("passes bytes through up to the limit, then marks once and counts the rest", func() {
		var buf bytes.Buffer
		w := NewCapWriter(&buf, 10, "stdout")
		for _, chunk := range []string{"0123", "4567", "89ab", "cdef", "more"} {
			n, err := w.Write([]byte(chunk))
			Expect(err).NotTo(HaveOccurred())
			Expect(n).To(Equal(len(chunk)))
		}
		Expect(buf.String()).To(Equal("0123456789\n[code-sandbox: stdout truncated after 10 bytes]\n"))
		Expect(w.Written()).To(Equal(int64(20)))
		Expect(w.Truncated()).To(BeTrue())
	})

	It("does not truncate exactly at the limit, and passes binary data unchanged", func() {
		var buf bytes.Buffer
		w := NewCapWriter(&buf, 4, "stderr")
		_, _ = w.Write([]byte{0xff, 0, 0xfe, 'a'})
		Expect(w.Truncated()).To(BeFalse())
		Expect(buf.Bytes()).To(Equal([]byte{0xff, 0, 0xfe, 'a'}))
		_, _ = w.Write([]byte{0})
		Expect(w.Truncated()).To(BeTrue())
		Expect(buf.String()).To(HaveSuffix("[code-sandbox: stderr truncated after 4 bytes]\n"))
	})

	It("formats the marker size and reports writer errors", func() {
		Expect(TruncationMarker("stdout", 1<<20)).To(Equal("\n[code-sandbox: stdout truncated after 1.0 MiB]\n"))
		Expect(TruncationMarker("stdout", 1536)).To(ContainSubstring("1.5 KiB"))
		Expect(TruncationMarker("stdout", 3<<30)).To(ContainSubstring("3.0 GiB"))
		w := NewCapWriter(failingWriter{}, 10, "stdout")
		_, err := w.Write([]byte("x"))
		Expect(err).To(MatchError(ContainSubstring("writing stdout")))
		_, err = w.Write([]byte("x"))
		Expect(err).To(HaveOccurred(), "the first error sticks")
	})
})

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// entry is one header (and body) of a test archive.
type entry struct {
	h    tar.Header
	body string
}

func archive(entries ...entry) []byte {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.h
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		Expect(tw.WriteHeader(&h)).To(Succeed())
		_, err := io.WriteString(tw, e.body)
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(tw.Close()).To(Succeed())
	return buf.Bytes()
}

func headers(data []byte) []*tar.Header {
	GinkgoHelper()
	var out []*tar.Header
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		out = append(out, h)
	}
}

var _ = Describe("SanitizeTar", Label("unit"), func() {
	It("keeps dirs and files with clean names and permission bits only", func() {
		in := archive(
			entry{h: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}},
			entry{h: tar.Header{Name: "./d/", Typeflag: tar.TypeDir, Mode: 0o4755, Uid: 0, Uname: "root"}},
			entry{h: tar.Header{Name: "d//f.txt", Typeflag: tar.TypeReg, Mode: 0o6755, Uid: 1000, Gid: 1000, Uname: "u", Gname: "g", PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "x"}}, body: "hello"},
			entry{h: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "global", PAXRecords: map[string]string{"comment": "x"}}},
			entry{h: tar.Header{Name: "empty", Typeflag: tar.TypeReg, Mode: 0o600}},
		)
		var out bytes.Buffer
		stats, err := SanitizeTar(bytes.NewReader(in), &out, UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(stats).To(Equal(TransferStats{Files: 2, Dirs: 1, Bytes: 5}))
		hs := headers(out.Bytes())
		Expect(hs).To(HaveLen(3))
		Expect(hs[0].Name).To(Equal("d/"))
		Expect(hs[0].Mode).To(Equal(int64(0o755)))
		Expect(hs[1].Name).To(Equal("d/f.txt"))
		Expect(hs[1].Mode).To(Equal(int64(0o755)), "setuid/setgid dropped")
		Expect(hs[1].Uid).To(BeZero())
		Expect(hs[1].Uname).To(BeEmpty())
		Expect(hs[1].PAXRecords).To(BeEmpty())
		Expect(hs[2].Name).To(Equal("empty"))
	})

	DescribeTable("rejects dangerous entries (A10)",
		func(e entry, want error) {
			_, err := SanitizeTar(bytes.NewReader(archive(e)), io.Discard, UploadLimits{})
			Expect(err).To(MatchError(want))
		},
		Entry("../", entry{h: tar.Header{Name: "../x", Typeflag: tar.TypeReg}}, ErrInvalidPath),
		Entry("a/../../x", entry{h: tar.Header{Name: "a/../../x", Typeflag: tar.TypeReg}}, ErrInvalidPath),
		Entry("absolute", entry{h: tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg}}, ErrInvalidPath),
		Entry("long component", entry{h: tar.Header{Name: strings.Repeat("x", 256), Typeflag: tar.TypeReg}}, ErrInvalidPath),
		Entry("long path", entry{h: tar.Header{Name: strings.Repeat("x/", 2048) + "y", Typeflag: tar.TypeReg}}, ErrInvalidPath),
		Entry("file named .", entry{h: tar.Header{Name: ".", Typeflag: tar.TypeReg}}, ErrInvalidPath),
		Entry("symlink", entry{h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}}, ErrUnsupportedEntry),
		Entry("hardlink", entry{h: tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}, ErrUnsupportedEntry),
		Entry("char device", entry{h: tar.Header{Name: "c", Typeflag: tar.TypeChar}}, ErrUnsupportedEntry),
		Entry("block device", entry{h: tar.Header{Name: "b", Typeflag: tar.TypeBlock}}, ErrUnsupportedEntry),
		Entry("fifo", entry{h: tar.Header{Name: "f", Typeflag: tar.TypeFifo}}, ErrUnsupportedEntry),
	)

	It("shares its name rules with the helper through CleanArchiveName", func() {
		// Go's tar reader already refuses a NUL inside PAX names; the rule
		// still stands on its own.
		_, err := CleanArchiveName("a\x00b")
		Expect(err).To(MatchError(ErrInvalidPath))
		Expect(CleanArchiveName("./a/./b/")).To(Equal("a/b"))
		Expect(CleanArchiveName("./")).To(Equal(""))
	})

	It("names the entry type it refuses", func() {
		_, err := SanitizeTar(bytes.NewReader(archive(entry{h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}})), io.Discard, UploadLimits{})
		Expect(err.Error()).To(ContainSubstring(`"l" is a symbolic link`))
	})

	It("enforces caps without reading a bomb's content", func() {
		two := archive(entry{h: tar.Header{Name: "a", Typeflag: tar.TypeReg}, body: "12345"}, entry{h: tar.Header{Name: "b", Typeflag: tar.TypeReg}, body: "67890"})
		_, err := SanitizeTar(bytes.NewReader(two), io.Discard, UploadLimits{MaxBytes: 9})
		Expect(err).To(MatchError(ErrTooLarge))
		_, err = SanitizeTar(bytes.NewReader(two), io.Discard, UploadLimits{MaxEntries: 1})
		Expect(err).To(MatchError(ErrTooLarge))
		_, err = SanitizeTar(bytes.NewReader(two), io.Discard, UploadLimits{MaxBytes: 10, MaxEntries: 2})
		Expect(err).NotTo(HaveOccurred())

		// A header declaring 1 TiB followed by an endless stream: refused
		// at the header, having read only it.
		var hdr bytes.Buffer
		tw := tar.NewWriter(&hdr)
		Expect(tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Size: 1 << 40})).To(Succeed())
		counting := &countingReader{r: io.MultiReader(bytes.NewReader(hdr.Bytes()), endless{})}
		_, err = SanitizeTar(counting, io.Discard, UploadLimits{})
		Expect(err).To(MatchError(ErrTooLarge))
		Expect(counting.n).To(BeNumerically("<", 1<<20))

		_, err = SanitizeTar(bytes.NewReader(two), io.Discard, UploadLimits{MaxBytes: -1})
		Expect(err).To(MatchError(ErrInvalidRequest))
	})

	It("reports a malformed or truncated archive", func() {
		_, err := SanitizeTar(strings.NewReader(strings.Repeat("not a tar", 100)), io.Discard, UploadLimits{})
		Expect(err).To(MatchError(ErrInvalidRequest))
		full := archive(entry{h: tar.Header{Name: "a", Typeflag: tar.TypeReg}, body: strings.Repeat("x", 2000)})
		_, err = SanitizeTar(bytes.NewReader(full[:1000]), io.Discard, UploadLimits{})
		Expect(err).To(HaveOccurred())
		_, err = SanitizeTar(iotest.ErrReader(errors.New("client went away")), io.Discard, UploadLimits{})
		Expect(err).To(MatchError(ContainSubstring("client went away")))
	})

	It("accepts an empty upload", func() {
		stats, err := SanitizeTar(strings.NewReader(""), io.Discard, UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(stats).To(BeZero())
	})
})

var _ = Describe("WriteSingleFileTar", Label("unit"), func() {
	It("writes one clean regular file", func() {
		var buf bytes.Buffer
		Expect(WriteSingleFileTar(&buf, "./dir/f.bin", 0o4755, 3, strings.NewReader("abc"))).To(Succeed())
		hs := headers(buf.Bytes())
		Expect(hs).To(HaveLen(1))
		Expect(hs[0].Name).To(Equal("dir/f.bin"))
		Expect(hs[0].Mode).To(Equal(int64(0o755)))
		Expect(hs[0].Size).To(Equal(int64(3)))
		stats, err := SanitizeTar(bytes.NewReader(buf.Bytes()), io.Discard, UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(stats.Files).To(Equal(1))
	})

	It("refuses bad names and short content", func() {
		Expect(WriteSingleFileTar(io.Discard, "../x", 0o644, 0, strings.NewReader(""))).To(MatchError(ErrInvalidPath))
		Expect(WriteSingleFileTar(io.Discard, ".", 0o644, 0, strings.NewReader(""))).To(MatchError(ErrInvalidPath))
		Expect(WriteSingleFileTar(io.Discard, "x", 0o644, -1, strings.NewReader(""))).To(MatchError(ErrInvalidRequest))
		Expect(WriteSingleFileTar(io.Discard, "x", 0o644, 10, strings.NewReader("abc"))).To(MatchError(ContainSubstring("got 3 of 10 bytes")))
	})
})

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }

var _ = Describe("ValidEnvName", Label("unit"), func() {
	DescribeTable("accepts portable names only",
		func(name string, valid bool) { Expect(ValidEnvName(name)).To(Equal(valid)) },
		Entry("letters", "PATH", true),
		Entry("underscore first", "_x1", true),
		Entry("digit after the first", "A9", true),
		Entry("empty", "", false),
		Entry("digit first", "1A", false),
		Entry("equals sign", "A=B", false),
		Entry("dash", "A-B", false),
		Entry("NUL", "A\x00", false),
		Entry("multi-byte letter", "É", false),
	)
})
