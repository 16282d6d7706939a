/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package fstree_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
)

func TestFSTree(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "fstree suite (unit)")
}

var _ = Describe("List", func() {
	var dir string
	BeforeEach(func() {
		old := syscall.Umask(0o022)
		DeferCleanup(func() { syscall.Umask(old) })
		dir = GinkgoT().TempDir()
		Expect(os.Chmod(dir, 0o755)).To(Succeed())
		Expect(os.MkdirAll(filepath.Join(dir, "b", "c"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "b", "c", "f.txt"), []byte("hello"), 0o600)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "a.sh"), []byte("#!/bin/sh\n"), 0o755)).To(Succeed())
		Expect(os.Symlink("/etc/passwd", filepath.Join(dir, "link"))).To(Succeed())
	})

	It("lists every path with its type and mode, and file contents, sorted, without following links", func() {
		Expect(fstree.List(dir)).To(Equal([]string{
			". drwxr-xr-x",
			"a.sh -rwxr-xr-x #!/bin/sh\n",
			"b drwxr-xr-x",
			"b/c drwxr-xr-x",
			"b/c/f.txt -rw------- hello",
			"link Lrwxrwxrwx",
		}))
	})

	It("tells apart trees that differ only in a file's content or mode", func() {
		before := fstree.List(dir)
		Expect(fstree.List(dir)).To(Equal(before))
		Expect(os.WriteFile(filepath.Join(dir, "b", "c", "f.txt"), []byte("HELLO"), 0o600)).To(Succeed())
		Expect(fstree.List(dir)).NotTo(Equal(before))
		before = fstree.List(dir)
		Expect(os.Chmod(filepath.Join(dir, "a.sh"), 0o700)).To(Succeed())
		Expect(fstree.List(dir)).NotTo(Equal(before))
	})
})
