package mcpserver

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func hostFixture() (*HostRoots, string, string) {
	GinkgoHelper()
	base := GinkgoT().TempDir()
	allowed := filepath.Join(base, "allowed")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(allowed, "proj", "sub"), outside} {
		Expect(os.MkdirAll(d, 0o755)).To(Succeed())
	}
	Expect(os.WriteFile(filepath.Join(allowed, "proj", "a.txt"), []byte("a"), 0o644)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(allowed, "proj", "sub", "b.txt"), []byte("bb"), 0o644)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)).To(Succeed())
	Expect(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(allowed, "proj", "leak"))).To(Succeed())
	Expect(os.Symlink(outside, filepath.Join(allowed, "escape"))).To(Succeed())
	roots, err := NewHostRoots([]string{allowed})
	Expect(err).NotTo(HaveOccurred())
	return roots, allowed, outside
}

var _ = Describe("HostRoots", Label("unit"), func() {
	It("confines sources and destinations to the allowed directories", func() {
		roots, allowed, outside := hostFixture()
		for _, p := range []string{
			filepath.Join(outside, "secret"),
			filepath.Join(allowed, "proj", "leak"),
			filepath.Join(allowed, "escape", "secret"),
			filepath.Join(allowed, "..", "outside", "secret"),
		} {
			_, _, err := roots.openExisting("local_src_file", p)
			Expect(err).To(MatchError(ContainSubstring("outside the allowed")), "%s: want refusal", p)
		}
		_, _, err := roots.openExisting("local_src_file", "proj/a.txt")
		Expect(err).To(MatchError(ContainSubstring("absolute")), "relative path")
		root, rel, err := roots.openExisting("local_src_file", filepath.Join(allowed, "proj", "a.txt"))
		Expect(err).NotTo(HaveOccurred())
		Expect(rel).To(Equal("proj/a.txt"))
		root.Close()

		for _, p := range []string{filepath.Join(outside, "new"), filepath.Join(allowed, "escape", "new"), filepath.Join(allowed, "escape"), allowed} {
			_, _, err := roots.openDest("local_dest_path", p)
			Expect(err).To(HaveOccurred(), "%s: accepted as a destination", p)
		}
		root, rel, err = roots.openDest("local_dest_path", filepath.Join(allowed, "new", "dir", "f.txt"))
		Expect(err).NotTo(HaveOccurred())
		Expect(rel).To(Equal("new/dir/f.txt"))
		root.Close()

		none, _ := NewHostRoots(nil)
		_, _, err = none.openExisting("local_src_dir", allowed)
		Expect(err).To(MatchError(ContainSubstring("--allow-host-dir")), "no roots")
		_, err = NewHostRoots([]string{"/"})
		Expect(err).To(HaveOccurred(), "the filesystem root was accepted")
	})
})

var _ = Describe("host trees", Label("unit"), func() {
	It("skips symlinks and honours the caps", func() {
		roots, allowed, _ := hostFixture()
		root, rel, err := roots.openExisting("local_src_dir", filepath.Join(allowed, "proj"))
		Expect(err).NotTo(HaveOccurred())
		defer root.Close()
		st, err := scanHostTree(root, rel, 1<<20, 100)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Files).To(Equal(2), "unexpected stats %+v", st)
		Expect(st.Dirs).To(Equal(1), "unexpected stats %+v", st)
		Expect(st.Bytes).To(Equal(int64(3)), "unexpected stats %+v", st)
		Expect(st.Skipped).To(HaveLen(1), "unexpected stats %+v", st)
		_, err = scanHostTree(root, rel, 2, 100)
		Expect(err).To(HaveOccurred(), "byte cap not enforced")
		_, err = scanHostTree(root, rel, 1<<20, 2)
		Expect(err).To(HaveOccurred(), "entry cap not enforced")
		var buf bytes.Buffer
		Expect(writeHostTree(root, rel, &buf, 1<<20)).To(Succeed())
		var names []string
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			Expect(err).NotTo(HaveOccurred())
			names = append(names, h.Name)
		}
		Expect(strings.Join(names, ",")).To(Equal("a.txt,sub/,sub/b.txt"), "tar entries")
	})
})

var _ = Describe("extractToHost", Label("unit"), func() {
	It("writes files and trees inside the root only", func() {
		_, allowed, outside := hostFixture()
		mkTar := func(entries ...[2]string) *bytes.Buffer {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range entries {
				if strings.HasSuffix(e[0], "/") {
					_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: e[0], Mode: 0o755})
					continue
				}
				if e[1] == "->" {
					_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: e[0], Linkname: "/etc/passwd"})
					continue
				}
				_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e[0], Mode: 0o644, Size: int64(len(e[1]))})
				_, _ = tw.Write([]byte(e[1]))
			}
			_ = tw.Close()
			return &buf
		}
		root, err := os.OpenRoot(allowed)
		Expect(err).NotTo(HaveOccurred())
		defer root.Close()
		st, err := extractToHost(root, "out/file.txt", mkTar([2]string{"hello.py", "print()"}), 1<<20)
		Expect(err).NotTo(HaveOccurred(), "%+v", st)
		Expect(st.Files).To(Equal(1), "%+v", st)
		b, _ := os.ReadFile(filepath.Join(allowed, "out", "file.txt"))
		Expect(string(b)).To(Equal("print()"), "content")
		// Into an existing directory.
		_, err = extractToHost(root, "out", mkTar([2]string{"hello.py", "x"}), 1<<20)
		Expect(err).NotTo(HaveOccurred())
		_, err = os.Stat(filepath.Join(allowed, "out", "hello.py"))
		Expect(err).NotTo(HaveOccurred())
		// A tree, with a symlink entry that must not be written.
		st, err = extractToHost(root, "tree", mkTar([2]string{"d/", ""}, [2]string{"d/x", "1"}, [2]string{"d/link", "->"}), 1<<20)
		Expect(err).NotTo(HaveOccurred(), "%+v", st)
		Expect(st.Files).To(Equal(1), "%+v", st)
		Expect(st.Skipped).To(HaveLen(1), "%+v", st)
		_, err = os.Lstat(filepath.Join(allowed, "tree", "link"))
		Expect(err).To(HaveOccurred(), "symlink entry written")
		// Traversal in entry names, and the byte cap.
		_, err = extractToHost(root, "bad", mkTar([2]string{"../../evil", "x"}), 1<<20)
		Expect(err).To(HaveOccurred(), "traversal accepted")
		_, err = extractToHost(root, "big", mkTar([2]string{"big", "0123456789"}), 5)
		Expect(err).To(HaveOccurred(), "cap not enforced")
		// Writing through the escaping symlink is refused by os.Root.
		_, err = extractToHost(root, "escape/new", mkTar([2]string{"f", "x"}), 1<<20)
		Expect(err).To(HaveOccurred(), "wrote through a symlink out of the root")
		_, err = os.Stat(filepath.Join(outside, "new"))
		Expect(err).To(HaveOccurred(), "file created outside the root")
	})
})
