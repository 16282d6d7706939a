package hostfs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
)

// Junctions (directory mount points) are the Windows link that needs no
// privilege: any user can plant one with `mklink /J`. These specs are
// compiled in CI (GOOS=windows go test -c) and run only on Windows.
var _ = Describe("junctions on Windows", Label("unit"), func() {
	var (
		base    string
		outside string
		root    *os.Root
	)
	BeforeEach(func() {
		base = GinkgoT().TempDir()
		outside = GinkgoT().TempDir()
		var err error
		root, err = os.OpenRoot(base)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(root.Close)
	})
	extract := func(dest, src string, archive io.Reader, opts Options) (Result, error) {
		return Extract(root, dest, archive, ParseSource(src), opts)
	}

	It("are reported as links by the root's Lstat (what isLink relies on)", func() {
		Expect(os.Mkdir(filepath.Join(base, "real"), 0o755)).To(Succeed())
		junction(filepath.Join(base, "real"), filepath.Join(base, "j"))
		fi, err := root.Lstat("j")
		Expect(err).NotTo(HaveOccurred())
		Expect(isLink(fi.Mode())).To(BeTrue(), fi.Mode().String())
		Expect(fi.IsDir()).To(BeFalse())
	})

	It("never lead a download out of the root, whether in DEST's parents or as DEST", func() {
		junction(outside, filepath.Join(base, "escape"))
		for _, c := range []struct {
			dest, src string
			archive   *bytes.Buffer
			opts      Options
		}{
			{"escape/f", "/app/f", tarOf(fileE("f", "x")), Options{}},
			{"escape/t", "/app/t/", tarOf(dirE("t/"), fileE("t/f", "x")), Options{}},
			{"escape", "/app/f", tarOf(fileE("f", "x")), Options{DestIsDir: true}},
			{"escape", "/app/t/", tarOf(dirE("t/"), fileE("t/f", "x")), Options{Overwrite: true}},
			{"escape", "/app/escape", tarOf(fileE("escape", "x")), Options{Overwrite: true}},
		} {
			_, err := extract(c.dest, c.src, c.archive, c.opts)
			Expect(err).To(MatchError(ContainSubstring("junction")), c.dest+" "+c.src)
		}
		Expect(fstree.List(outside)).To(HaveLen(1), "something was written through the junction")
	})

	It("are not followed inside the root either", func() {
		Expect(os.Mkdir(filepath.Join(base, "real"), 0o755)).To(Succeed())
		junction(filepath.Join(base, "real"), filepath.Join(base, "alias"))
		_, err := extract("alias/f", "/app/f", tarOf(fileE("f", "x")), Options{})
		Expect(err).To(MatchError(ErrWrongType))
		_, err = extract("alias", "/app/f", tarOf(fileE("f", "x")), Options{DestIsDir: true})
		Expect(err).To(MatchError(ErrExists))
		Expect(fstree.List(filepath.Join(base, "real"))).To(HaveLen(1))
	})

	It("are skipped by uploads, never followed", func() {
		Expect(os.MkdirAll(filepath.Join(base, "proj"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644)).To(Succeed())
		junction(outside, filepath.Join(base, "proj", "j"))
		st, err := WriteTree(io.Discard, root, "proj", TreeLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(st).To(Equal(TreeStats{Skipped: []string{"j"}}))
	})
})
