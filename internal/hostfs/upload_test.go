package hostfs

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

var _ = Describe("Archiving a host tree", Label("unit"), func() {
	var root *os.Root
	BeforeEach(func() {
		src := GinkgoT().TempDir()
		Expect(os.MkdirAll(filepath.Join(src, "proj", "sub", "deep"), 0o750)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "proj", "a.txt"), []byte("A"), 0o640)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "proj", "sub", "deep", "b.bin"), []byte{0, 1, 2}, 0o755)).To(Succeed())
		symlink("/etc/passwd", filepath.Join(src, "proj", "link"))
		symlink("/etc", filepath.Join(src, "proj", "sub", "dirlink"))
		var err error
		root, err = os.OpenRoot(src)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(root.Close)
	})

	It("archives regular files and directories below the top, skipping symlinks", func() {
		var buf bytes.Buffer
		st, err := WriteTree(&buf, root, "proj", TreeLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(st).To(Equal(TreeStats{Files: 2, Dirs: 2, Bytes: 4, Skipped: []string{"link", "sub/dirlink"}}))

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
		want := map[string]string{
			"a.txt":          "-rw-r----- A",
			"sub/":           "-rwxr-x--- ",
			"sub/deep/":      "-rwxr-x--- ",
			"sub/deep/b.bin": "-rwxr-xr-x \x00\x01\x02",
		}
		if runtime.GOOS == "windows" {
			// No modes but read-only there: sentMode's fixed ones.
			want = map[string]string{
				"a.txt":          "-rw-r--r-- A",
				"sub/":           "-rwxr-xr-x ",
				"sub/deep/":      "-rwxr-xr-x ",
				"sub/deep/b.bin": "-rw-r--r-- \x00\x01\x02",
			}
		}
		Expect(got).To(Equal(want))

		// The root itself as the top.
		sub, err := root.OpenRoot("proj/sub")
		Expect(err).NotTo(HaveOccurred())
		defer sub.Close()
		st, err = WriteTree(io.Discard, sub, ".", TreeLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Files).To(Equal(1))
		Expect(st.Skipped).To(Equal([]string{"dirlink"}))
	})

	It("counts the tree and enforces the caps before and while sending", func() {
		st, err := ScanTree(root, "proj", TreeLimits{MaxBytes: 1 << 20, MaxEntries: 100})
		Expect(err).NotTo(HaveOccurred())
		Expect(st).To(Equal(TreeStats{Files: 2, Dirs: 2, Bytes: 4, Skipped: []string{"link", "sub/dirlink"}}))
		_, err = ScanTree(root, "proj", TreeLimits{MaxBytes: 3})
		Expect(err).To(MatchError(execio.ErrTooLarge))
		_, err = ScanTree(root, "proj", TreeLimits{MaxEntries: 3})
		Expect(err).To(MatchError(execio.ErrTooLarge))
		_, err = WriteTree(io.Discard, root, "proj", TreeLimits{MaxBytes: 3})
		Expect(err).To(MatchError(execio.ErrTooLarge))
		_, err = ScanTree(root, "proj/a.txt", TreeLimits{})
		Expect(err).To(MatchError(ErrWrongType))
	})
})
