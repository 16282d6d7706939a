//go:build unix

package hostfs

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func modeE(name string, mode int64) entry {
	return entry{name: name, typeflag: tar.TypeReg, body: "x", mode: mode}
}

// Unix modes and the umask; Windows keeps only a read-only attribute
// (platform_windows_test.go's hostMode).
var _ = Describe("Extract on Unix", Label("unit"), func() {
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
	extract := func(dest, src string, archive io.Reader, opts Options) (Result, error) {
		return Extract(root, dest, archive, ParseSource(src), opts)
	}

	Describe("modes", func() {
		DescribeTable("are masked: no group/world write, exec bits only on request, then the umask",
			func(umask int, keepExec bool, archived int64, want os.FileMode) {
				withUmask(umask)
				_, err := extract("f", "/app/f", tarOf(modeE("f", archived)), Options{KeepExec: keepExec})
				Expect(err).NotTo(HaveOccurred())
				Expect(mode(filepath.Join(base, "f"))).To(Equal(want))

				_, err = extract("t", "/app/t/", tarOf(dirE("t/"), modeE("t/f", archived)), Options{KeepExec: keepExec})
				Expect(err).NotTo(HaveOccurred())
				Expect(mode(filepath.Join(base, "t", "f"))).To(Equal(want))
				Expect(mode(filepath.Join(base, "t"))).To(Equal(os.ModeDir | 0o755&^os.FileMode(umask)))
			},
			Entry("0777 without exec bits", 0o022, false, int64(0o777), os.FileMode(0o644)),
			Entry("0777 with exec bits", 0o022, true, int64(0o777), os.FileMode(0o755)),
			Entry("0777 with a umask of 0", 0o000, false, int64(0o777), os.FileMode(0o644)),
			Entry("0777 with exec bits and a umask of 0", 0o000, true, int64(0o777), os.FileMode(0o755)),
			Entry("0777 with a umask of 077", 0o077, true, int64(0o777), os.FileMode(0o700)),
			Entry("setuid, setgid, sticky", 0o022, true, int64(0o7777), os.FileMode(0o755)),
			Entry("0600 stays private", 0o022, false, int64(0o600), os.FileMode(0o600)),
		)
	})

})
