package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
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

// listing is every path below dir with its mode, and file contents.
var listing = fstree.List

var _ = Describe("Opening a local download destination", Label("unit"), func() {
	var base string
	BeforeEach(func() {
		var err error
		// Resolved, as openLocalDest resolves symlinks (macOS's /var).
		base, err = filepath.EvalSymlinks(GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
	})

	DescribeTable("opens the deepest existing directory and names DST below it",
		func(dst func(base string) string, wantRoot func(base string) string, wantRel string, wantDir bool) {
			Expect(os.MkdirAll(filepath.Join(base, "exists"), 0o755)).To(Succeed())
			Expect(os.Symlink(filepath.Join(base, "exists"), filepath.Join(base, "link"))).To(Succeed())
			root, rel, isDir, err := openLocalDest(dst(base))
			Expect(err).NotTo(HaveOccurred())
			defer root.Close()
			Expect(root.Name()).To(Equal(wantRoot(base)))
			Expect(rel).To(Equal(wantRel))
			Expect(isDir).To(Equal(wantDir))
		},
		Entry("an existing directory", func(b string) string { return filepath.Join(b, "exists") }, func(b string) string { return b }, "exists", false),
		Entry("an existing directory written with /", func(b string) string { return filepath.Join(b, "exists") + "/" }, func(b string) string { return b }, "exists", true),
		Entry("a missing path", func(b string) string { return filepath.Join(b, "exists", "new", "f.txt") }, func(b string) string { return filepath.Join(b, "exists") }, "new/f.txt", false),
		Entry("a symlink the user named, resolved", func(b string) string { return filepath.Join(b, "link") }, func(b string) string { return b }, "exists", false),
		Entry("a path through a symlink the user named", func(b string) string { return filepath.Join(b, "link", "new") }, func(b string) string { return filepath.Join(b, "exists") }, "new", false),
	)

	It("refuses a destination below a file", func() {
		Expect(os.WriteFile(filepath.Join(base, "f"), nil, 0o644)).To(Succeed())
		_, _, _, err := openLocalDest(filepath.Join(base, "f", "x"))
		Expect(err).To(HaveOccurred())
	})
})
