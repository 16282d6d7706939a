package hostfs

import (
	"os"
	"os/exec"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// withUmask does nothing: Windows has no umask.
func withUmask(int) {}

// hostMode is the mode Lstat reports for a file created with m: Windows
// keeps only the read-only attribute, set when m has no owner write bit.
func hostMode(m os.FileMode) os.FileMode {
	if m&0o200 != 0 {
		return 0o666
	}
	return 0o444
}

// symlink creates newname pointing to oldname, or skips the spec: creating
// a symbolic link on Windows needs Developer Mode or
// SeCreateSymbolicLinkPrivilege, which a CI runner may not grant.
// Junctions (junction) need neither.
func symlink(oldname, newname string) {
	GinkgoHelper()
	if err := os.Symlink(oldname, newname); err != nil {
		Skip("this Windows account may not create symbolic links: " + err.Error())
	}
}

// junction creates the directory junction (mount point) link to the
// directory target, the way a user's `mklink /J` does.
func junction(target, link string) {
	GinkgoHelper()
	out, err := exec.Command("cmd", "/c", "mklink", "/J", link, target).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
}
