//go:build unix

package hostfs

import (
	"os"
	"syscall"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// withUmask sets the process umask for the current spec.
func withUmask(m int) {
	old := syscall.Umask(m)
	DeferCleanup(func() { syscall.Umask(old) })
}

// hostMode is the mode Lstat reports for a file created with m (under a
// umask that leaves m alone).
func hostMode(m os.FileMode) os.FileMode { return m }

// symlink creates newname pointing to oldname.
func symlink(oldname, newname string) {
	GinkgoHelper()
	Expect(os.Symlink(oldname, newname)).To(Succeed())
}
