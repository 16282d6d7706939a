package dockerruntime

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// tarIndex maps each entry of a tar to its header.
func tarIndex(b []byte) map[string]*tar.Header {
	GinkgoHelper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		out[h.Name] = h
	}
}

func opener(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

var _ = Describe("Snapshot and Restore", dockerLabel, func() {
	It("copies the writable paths with their modes into fresh sandboxes whose own writes stay their own", func(ctx SpecContext) {
		src, _ := startSandbox(ctx, nil)
		r := sh(ctx, src.ID, `set -e; mkdir -p /app/d/e; echo hello >/app/d/e/f; printf run >/app/run.sh; chmod 700 /app/run.sh;
			echo t >/tmp/t; echo v >/var/tmp/v; ln -s /etc/passwd /app/link; sleep 1000 & echo started`)
		Expect(r.Code).To(Equal(0), r.String())

		var snap bytes.Buffer
		stats, err := rt.Snapshot(ctx, src.ID, SnapshotRoots(""), &snap, 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(stats.Files).To(Equal(4))
		idx := tarIndex(snap.Bytes())
		Expect(idx).To(HaveKey("app/d/e/f"))
		Expect(idx).To(HaveKey("tmp/t"))
		Expect(idx).To(HaveKey("var/tmp/v"))
		Expect(idx["app/run.sh"].Mode & 0o777).To(Equal(int64(0o700)))

		// The source runs on: its background sleep was continued.
		Expect(sh(ctx, src.ID, `ps -o stat,comm | grep sleep`).Stdout).NotTo(ContainSubstring("T"))

		var kids []Container
		for range 2 {
			k, _ := startSandbox(ctx, nil)
			st, err := rt.Restore(ctx, k.ID, SnapshotRoots(""), opener(snap.Bytes()), execio.UploadLimits{})
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Links).To(Equal(1), "the symlink")
			kids = append(kids, k)
		}
		for _, k := range kids {
			r := sh(ctx, k.ID, `cat /app/d/e/f /tmp/t /var/tmp/v; stat -c %a /app/run.sh; readlink /app/link`)
			Expect(r.Code).To(Equal(0), r.String())
			Expect(r.Stdout).To(Equal("hello\nt\nv\n700\n/etc/passwd\n"))
		}
		Expect(sh(ctx, kids[0].ID, `echo mine >/app/only-0`).Code).To(Equal(0))
		Expect(sh(ctx, kids[1].ID, `test -e /app/only-0`).Code).To(Equal(1))
		Expect(sh(ctx, src.ID, `test -e /app/only-0`).Code).To(Equal(1))
	}, SpecTimeout(90*time.Second))

	It("never holds a file caught part way through one write", func(ctx SpecContext) {
		src, _ := startSandbox(ctx, func(s *Spec) { s.Image = pythonImage })
		const size = 8 << 20
		r := sh(ctx, src.ID, `cd /app && nohup python3 -c '
import os
data = b"x" * `+itoa(size)+`
while True:
    fd = os.open("f.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, data)
    os.close(fd)
    os.rename("f.tmp", "f")
' >/dev/null 2>&1 & sleep 0.5; echo ok`)
		Expect(r.Code).To(Equal(0), r.String())
		for range 15 {
			var snap bytes.Buffer
			_, err := rt.Snapshot(ctx, src.ID, SnapshotRoots(""), &snap, 64<<20)
			Expect(err).NotTo(HaveOccurred())
			idx := tarIndex(snap.Bytes())
			Expect(idx).To(HaveKey("app/f"))
			Expect(idx["app/f"].Size).To(Equal(int64(size)))
			if h, ok := idx["app/f.tmp"]; ok {
				Expect(h.Size).To(BeElementOf(int64(0), int64(size)), "a half-written f.tmp")
			}
		}
		// The writer still runs after the snapshots.
		Expect(sh(ctx, src.ID, `ps -o stat,comm | grep python`).Stdout).NotTo(ContainSubstring("T"))
	}, SpecTimeout(120*time.Second))

	It("restores links as links and never writes through one (a -> /etc then a/passwd, a chain, a link in a link's place)", func(ctx SpecContext) {
		type ent struct{ name, link, body string }
		build := func(es ...ent) []byte {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			for _, e := range es {
				h := &tar.Header{Name: e.name, Mode: 0o644}
				switch {
				case e.link != "":
					h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
				case e.body == "":
					h.Typeflag, h.Mode = tar.TypeDir, 0o755
				default:
					h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
				}
				Expect(tw.WriteHeader(h)).To(Succeed())
				_, _ = tw.Write([]byte(e.body))
			}
			Expect(tw.Close()).To(Succeed())
			return b.Bytes()
		}
		k, _ := startSandbox(ctx, nil)
		// A chain (c1 -> c2 -> /etc), a relative link and a link to a
		// file that does not exist are data: they are restored as they are.
		st, err := rt.Restore(ctx, k.ID, SnapshotRoots(""), opener(build(
			ent{name: "app/c1", link: "c2"}, ent{name: "app/c2", link: "/etc"},
			ent{name: "app/d/", body: ""}, ent{name: "app/d/rel", link: "../c1/passwd"},
			ent{name: "tmp/dangling", link: "/nonexistent/x"},
		)), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Links).To(Equal(4))
		r := sh(ctx, k.ID, `for l in /app/c1 /app/c2 /app/d/rel /tmp/dangling; do readlink $l; done; head -1 /app/d/rel`)
		Expect(r.Code).To(Equal(0), r.String())
		Expect(r.Stdout).To(HavePrefix("c2\n/etc\n../c1/passwd\n/nonexistent/x\nroot:"))

		// a -> /etc followed by a/passwd: the file is written into a real
		// directory a of the sandbox's own, and the link then has no place.
		k2, _ := startSandbox(ctx, nil)
		_, err = rt.Restore(ctx, k2.ID, SnapshotRoots(""), opener(build(
			ent{name: "app/a", link: "/etc"}, ent{name: "app/a/passwd", body: "evil\n"},
		)), execio.UploadLimits{})
		Expect(err).To(MatchError(ContainSubstring("cannot create link a over an existing directory")))
		r = sh(ctx, k2.ID, `cat /app/a/passwd; test -L /app/a && echo link; head -c 5 /etc/passwd`)
		Expect(r.Stdout).To(Equal("evil\nroot:"), r.String())

		// A link below a link of the same archive (b -> /tmp, then b/x ->
		// y): refused, never created in /tmp.
		k3, _ := startSandbox(ctx, nil)
		_, err = rt.Restore(ctx, k3.ID, SnapshotRoots(""), opener(build(
			ent{name: "app/b", link: "/tmp"}, ent{name: "app/b/x", link: "y"},
		)), execio.UploadLimits{})
		Expect(err).To(MatchError(ContainSubstring("not a directory")))
		Expect(sh(ctx, k3.ID, `test -e /tmp/x || test -L /tmp/x`).Code).To(Equal(1))

		// The same with an in-root target (b -> d): nothing lands in d.
		k4, _ := startSandbox(ctx, nil)
		_, err = rt.Restore(ctx, k4.ID, SnapshotRoots(""), opener(build(
			ent{name: "app/d/", body: ""}, ent{name: "app/b", link: "d"}, ent{name: "app/b/x", link: "y"},
		)), execio.UploadLimits{})
		Expect(err).To(MatchError(ContainSubstring("not a directory")))
		Expect(sh(ctx, k4.ID, `ls -A /app/d`).Stdout).To(BeEmpty())

		// Plain uploads still refuse links.
		_, err = rt.CopyIn(ctx, k4.ID, execio.Target{Root: "/app"}, bytes.NewReader(build(ent{name: "l", link: "/etc"})), execio.UploadLimits{})
		Expect(err).To(MatchError(execio.ErrUnsupportedEntry))
	}, SpecTimeout(90*time.Second))

	It("refuses a snapshot entry outside the writable paths and bad roots", func(ctx SpecContext) {
		k, _ := startSandbox(ctx, nil)
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		Expect(tw.WriteHeader(&tar.Header{Name: "etc/evil", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})).To(Succeed())
		_, _ = tw.Write([]byte("x"))
		Expect(tw.Close()).To(Succeed())
		_, err := rt.Restore(ctx, k.ID, SnapshotRoots(""), opener(b.Bytes()), execio.UploadLimits{})
		Expect(err).To(MatchError(execio.ErrInvalidPath))
		Expect(err.Error()).To(ContainSubstring("etc/evil"))

		_, err = rt.Snapshot(ctx, k.ID, []string{"/"}, io.Discard, 0)
		Expect(err).To(MatchError(execio.ErrInvalidPath))
		_, err = rt.Snapshot(ctx, k.ID, []string{"/app/../etc"}, io.Discard, 0)
		Expect(err).To(MatchError(execio.ErrInvalidPath))
	}, SpecTimeout(60*time.Second))

	It("stops at the byte cap and leaves the sandbox running", func(ctx SpecContext) {
		src, _ := startSandbox(ctx, nil)
		Expect(sh(ctx, src.ID, `head -c 3000000 /dev/zero >/app/big; sleep 1000 & true`).Code).To(Equal(0))
		_, err := rt.Snapshot(ctx, src.ID, SnapshotRoots(""), io.Discard, 1<<20)
		Expect(err).To(MatchError(execio.ErrTooLarge))
		Expect(sh(ctx, src.ID, `ps -o stat,comm | grep sleep`).Stdout).NotTo(ContainSubstring("T"))
	}, SpecTimeout(60*time.Second))
})

func itoa(n int) string { return strconv.Itoa(n) }
