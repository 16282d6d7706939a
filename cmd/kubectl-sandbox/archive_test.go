package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

type entry struct {
	name     string
	typeflag byte
	body     string
	mode     int64
	linkname string
}

func tarOf(entries ...entry) *bytes.Buffer {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typeflag, Mode: mode, Linkname: e.linkname, ModTime: time.Unix(1700000000, 0)}
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

func dir(name string) entry        { return entry{name: name, typeflag: tar.TypeDir, mode: 0o755} }
func file(name, body string) entry { return entry{name: name, typeflag: tar.TypeReg, body: body} }

func readFile(p string) string {
	GinkgoHelper()
	data, err := os.ReadFile(p)
	Expect(err).NotTo(HaveOccurred())
	return string(data)
}

var _ = Describe("Extracting a download", Label("unit"), func() {
	var (
		base     string
		warnings []string
		warn     = func(s string) { warnings = append(warnings, s) }
	)
	BeforeEach(func() {
		base = GinkgoT().TempDir()
		warnings = nil
	})

	It("puts a tree's contents into DST, creating it", func() {
		dst := filepath.Join(base, "out")
		st, err := extractTree(tarOf(dir("src/"), file("src/a.txt", "A"), dir("src/sub/"), file("src/sub/b.txt", "BB")), dst, warn)
		Expect(err).NotTo(HaveOccurred())
		Expect(st).To(Equal(extractStats{Files: 2, Dirs: 2, Bytes: 3}))
		Expect(readFile(filepath.Join(dst, "a.txt"))).To(Equal("A"))
		Expect(readFile(filepath.Join(dst, "sub", "b.txt"))).To(Equal("BB"))
		fi, err := os.Stat(filepath.Join(dst, "a.txt"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.ModTime().Unix()).To(BeEquivalentTo(1700000000))
	})

	It("writes a single file as DST", func() {
		dst := filepath.Join(base, "renamed.txt")
		_, err := extractTree(tarOf(file("result.txt", "42")), dst, warn)
		Expect(err).NotTo(HaveOccurred())
		Expect(readFile(dst)).To(Equal("42"))
	})

	It("writes a single file inside DST when DST is a directory", func() {
		_, err := extractTree(tarOf(file("result.txt", "42")), base, warn)
		Expect(err).NotTo(HaveOccurred())
		Expect(readFile(filepath.Join(base, "result.txt"))).To(Equal("42"))

		_, err = extractTree(tarOf(file("result.txt", "43")), filepath.Join(base, "new")+"/", warn)
		Expect(err).NotTo(HaveOccurred())
		Expect(readFile(filepath.Join(base, "new", "result.txt"))).To(Equal("43"))
	})

	It("strips setuid, setgid and sticky bits and applies the archive's permissions", func() {
		dst := filepath.Join(base, "out")
		_, err := extractTree(tarOf(dir("d/"), entry{name: "d/tool", typeflag: tar.TypeReg, body: "x", mode: 0o4755}, entry{name: "d/secret", typeflag: tar.TypeReg, body: "s", mode: 0o600}), dst, warn)
		Expect(err).NotTo(HaveOccurred())
		fi, err := os.Stat(filepath.Join(dst, "tool"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode()).To(Equal(os.FileMode(0o755)))
		fi, err = os.Stat(filepath.Join(dst, "secret"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode()).To(Equal(os.FileMode(0o600)))
	})

	DescribeTable("refuses entries that escape DST, writing nothing outside",
		func(entries ...entry) {
			dst := filepath.Join(base, "out")
			_, err := extractTree(tarOf(entries...), dst, warn)
			Expect(err).To(MatchError(ContainSubstring("refusing")))
			Expect(filepath.Join(base, "evil")).NotTo(BeAnExistingFile())
		},
		Entry("a parent reference", dir("src/"), file("src/../../evil", "x")),
		Entry("a parent reference first", file("../evil", "x")),
		Entry("an absolute name", dir("src/"), file("/evil", "x")),
		Entry("an unclean name", dir("src/"), file("src/./a/../../evil", "x")),
		Entry("another top directory", dir("src/"), file("other/evil", "x")),
		Entry("a backslash", dir("src/"), file(`src/..\..\evil`, "x")),
	)

	It("skips symlinks, hard links and devices in the archive with a warning", func() {
		dst := filepath.Join(base, "out")
		st, err := extractTree(tarOf(
			dir("src/"),
			entry{name: "src/link", typeflag: tar.TypeSymlink, linkname: "/etc/passwd"},
			entry{name: "src/hard", typeflag: tar.TypeLink, linkname: "src/a"},
			entry{name: "src/dev", typeflag: tar.TypeChar},
			file("src/a", "A"),
		), dst, warn)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Files).To(Equal(1))
		Expect(warnings).To(HaveLen(3))
		Expect(warnings[0]).To(ContainSubstring("skipping src/link"))
		for _, n := range []string{"link", "hard", "dev"} {
			_, err := os.Lstat(filepath.Join(dst, n))
			Expect(os.IsNotExist(err)).To(BeTrue(), n)
		}
	})

	It("never writes through a symlink already in DST", func() {
		outside := filepath.Join(base, "outside.txt")
		Expect(os.WriteFile(outside, []byte("untouched"), 0o644)).To(Succeed())
		dst := filepath.Join(base, "out")
		Expect(os.MkdirAll(dst, 0o755)).To(Succeed())
		Expect(os.Symlink(outside, filepath.Join(dst, "a.txt"))).To(Succeed())

		_, err := extractTree(tarOf(dir("src/"), file("src/a.txt", "overwritten")), dst, warn)
		Expect(err).To(MatchError(ContainSubstring("symlink")))
		Expect(readFile(outside)).To(Equal("untouched"))
	})

	It("never follows a directory symlink in DST out of it", func() {
		outsideDir := filepath.Join(base, "outside")
		Expect(os.MkdirAll(outsideDir, 0o755)).To(Succeed())
		dst := filepath.Join(base, "out")
		Expect(os.MkdirAll(dst, 0o755)).To(Succeed())
		Expect(os.Symlink(outsideDir, filepath.Join(dst, "sub"))).To(Succeed())

		_, err := extractTree(tarOf(dir("src/"), file("src/sub/x.txt", "x")), dst, warn)
		Expect(err).To(HaveOccurred())
		Expect(filepath.Join(outsideDir, "x.txt")).NotTo(BeAnExistingFile())
	})

	It("does not write a single file through a symlink", func() {
		outside := filepath.Join(base, "outside.txt")
		Expect(os.WriteFile(outside, []byte("untouched"), 0o644)).To(Succeed())
		link := filepath.Join(base, "link.txt")
		Expect(os.Symlink(outside, link)).To(Succeed())
		_, err := extractTree(tarOf(file("result.txt", "x")), link, warn)
		Expect(err).To(MatchError(ContainSubstring("symlink")))
		Expect(readFile(outside)).To(Equal("untouched"))
	})

	It("refuses a download that is itself a symlink", func() {
		dst := filepath.Join(base, "x")
		_, err := extractTree(tarOf(entry{name: "link", typeflag: tar.TypeSymlink, linkname: "/etc"}), dst, warn)
		Expect(err).To(MatchError(ContainSubstring("link is not a regular file or a directory")))
		Expect(dst).NotTo(BeAnExistingFile())
	})

	It("refuses entries after a single file", func() {
		_, err := extractTree(tarOf(file("a.txt", "A"), file("b.txt", "B")), filepath.Join(base, "x"), warn)
		Expect(err).To(MatchError(ContainSubstring(`refusing archive entry "b.txt"`)))
	})

	It("reports an empty archive", func() {
		_, err := extractTree(bytes.NewReader(nil), filepath.Join(base, "x"), warn)
		Expect(err).To(MatchError(ContainSubstring("empty archive")))
	})
})

var _ = Describe("Archiving a local directory", Label("unit"), func() {
	It("archives regular files and directories, skipping symlinks with a warning", func() {
		src := GinkgoT().TempDir()
		Expect(os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o750)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "a.txt"), []byte("A"), 0o640)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "sub", "deep", "b.bin"), []byte{0, 1, 2}, 0o755)).To(Succeed())
		Expect(os.Symlink("/etc/passwd", filepath.Join(src, "link"))).To(Succeed())
		var warnings []string
		var buf bytes.Buffer
		Expect(writeTree(&buf, src, func(s string) { warnings = append(warnings, s) })).To(Succeed())
		Expect(warnings).To(ConsistOf(ContainSubstring("skipping symlink " + filepath.Join(src, "link"))))

		tr := tar.NewReader(&buf)
		got := map[string]string{}
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			Expect(err).NotTo(HaveOccurred())
			body, err := io.ReadAll(tr)
			Expect(err).NotTo(HaveOccurred())
			got[hdr.Name] = os.FileMode(hdr.Mode).String() + " " + string(body)
		}
		Expect(got).To(Equal(map[string]string{
			"a.txt":          "-rw-r----- A",
			"sub/":           "-rwxr-x--- ",
			"sub/deep/":      "-rwxr-x--- ",
			"sub/deep/b.bin": "-rwxr-xr-x \x00\x01\x02",
		}))
	})
})
