package mcpserver

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func hostFixture(t *testing.T) (*HostRoots, string, string) {
	t.Helper()
	base := t.TempDir()
	allowed := filepath.Join(base, "allowed")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(allowed, "proj", "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(allowed, "proj", "a.txt"), []byte("a"), 0o644))
	must(os.WriteFile(filepath.Join(allowed, "proj", "sub", "b.txt"), []byte("bb"), 0o644))
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(allowed, "proj", "leak")))
	must(os.Symlink(outside, filepath.Join(allowed, "escape")))
	roots, err := NewHostRoots([]string{allowed})
	must(err)
	return roots, allowed, outside
}

func TestHostRootsConfinement(t *testing.T) {
	roots, allowed, outside := hostFixture(t)
	for _, p := range []string{
		filepath.Join(outside, "secret"),
		filepath.Join(allowed, "proj", "leak"),
		filepath.Join(allowed, "escape", "secret"),
		filepath.Join(allowed, "..", "outside", "secret"),
	} {
		if _, _, err := roots.openExisting("local_src_file", p); err == nil || !strings.Contains(err.Error(), "outside the allowed") {
			t.Errorf("%s: got %v, want refusal", p, err)
		}
	}
	if _, _, err := roots.openExisting("local_src_file", "proj/a.txt"); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("relative path: got %v", err)
	}
	root, rel, err := roots.openExisting("local_src_file", filepath.Join(allowed, "proj", "a.txt"))
	if err != nil || rel != "proj/a.txt" {
		t.Fatalf("got %q %v", rel, err)
	}
	root.Close()

	for _, p := range []string{filepath.Join(outside, "new"), filepath.Join(allowed, "escape", "new"), filepath.Join(allowed, "escape"), allowed} {
		if _, _, err := roots.openDest("local_dest_path", p); err == nil {
			t.Errorf("%s: accepted as a destination", p)
		}
	}
	root, rel, err = roots.openDest("local_dest_path", filepath.Join(allowed, "new", "dir", "f.txt"))
	if err != nil || rel != "new/dir/f.txt" {
		t.Fatalf("got %q %v", rel, err)
	}
	root.Close()

	none, _ := NewHostRoots(nil)
	if _, _, err := none.openExisting("local_src_dir", allowed); err == nil || !strings.Contains(err.Error(), "--allow-host-dir") {
		t.Errorf("no roots: got %v", err)
	}
	if _, err := NewHostRoots([]string{"/"}); err == nil {
		t.Error("the filesystem root was accepted")
	}
}

func TestHostTreeSkipsSymlinksAndHonoursCaps(t *testing.T) {
	roots, allowed, _ := hostFixture(t)
	root, rel, err := roots.openExisting("local_src_dir", filepath.Join(allowed, "proj"))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	st, err := scanHostTree(root, rel, 1<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 2 || st.Dirs != 1 || st.Bytes != 3 || len(st.Skipped) != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
	if _, err := scanHostTree(root, rel, 2, 100); err == nil {
		t.Error("byte cap not enforced")
	}
	if _, err := scanHostTree(root, rel, 1<<20, 2); err == nil {
		t.Error("entry cap not enforced")
	}
	var buf bytes.Buffer
	if err := writeHostTree(root, rel, &buf, 1<<20); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != "a.txt,sub/,sub/b.txt" {
		t.Fatalf("tar entries %v", names)
	}
}

func TestExtractToHost(t *testing.T) {
	_, allowed, outside := hostFixture(t)
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
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	st, err := extractToHost(root, "out/file.txt", mkTar([2]string{"hello.py", "print()"}), 1<<20)
	if err != nil || st.Files != 1 {
		t.Fatalf("%+v %v", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(allowed, "out", "file.txt")); string(b) != "print()" {
		t.Fatalf("content %q", b)
	}
	// Into an existing directory.
	if _, err := extractToHost(root, "out", mkTar([2]string{"hello.py", "x"}), 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(allowed, "out", "hello.py")); err != nil {
		t.Fatal(err)
	}
	// A tree, with a symlink entry that must not be written.
	st, err = extractToHost(root, "tree", mkTar([2]string{"d/", ""}, [2]string{"d/x", "1"}, [2]string{"d/link", "->"}), 1<<20)
	if err != nil || st.Files != 1 || len(st.Skipped) != 1 {
		t.Fatalf("%+v %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(allowed, "tree", "link")); err == nil {
		t.Fatal("symlink entry written")
	}
	// Traversal in entry names, and the byte cap.
	if _, err := extractToHost(root, "bad", mkTar([2]string{"../../evil", "x"}), 1<<20); err == nil {
		t.Fatal("traversal accepted")
	}
	if _, err := extractToHost(root, "big", mkTar([2]string{"big", "0123456789"}), 5); err == nil {
		t.Fatal("cap not enforced")
	}
	// Writing through the escaping symlink is refused by os.Root.
	if _, err := extractToHost(root, "escape/new", mkTar([2]string{"f", "x"}), 1<<20); err == nil {
		t.Fatal("wrote through a symlink out of the root")
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Fatal("file created outside the root")
	}
}
