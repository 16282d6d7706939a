package mcpserver

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/mark3labs/mcp-go/mcp"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
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

// downloadBackend answers Download with a fixed archive; every other
// Backend method is left nil (the tool calls only Get and Download).
type downloadBackend struct {
	contract.Backend
	archive func() []byte
	paths   []string
}

func (b *downloadBackend) Get(context.Context, contract.Caller, string) (contract.Sandbox, error) {
	return contract.Sandbox{}, nil
}

func (b *downloadBackend) Download(_ context.Context, _ contract.Caller, _ string, src string, w io.Writer, _ int64) (execio.TransferStats, error) {
	b.paths = append(b.paths, src)
	_, err := w.Write(b.archive())
	return execio.TransferStats{}, err
}

func tarBytes(entries ...*tar.Header) []byte {
	GinkgoHelper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = "content of " + h.Name
			h.Size = int64(len(body))
		}
		Expect(tw.WriteHeader(h)).To(Succeed())
		_, err := tw.Write([]byte(body))
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(tw.Close()).To(Succeed())
	return buf.Bytes()
}

var _ = Describe("copy_file_from_sandbox", Label("unit"), func() {
	var (
		allowed string
		backend *downloadBackend
		call    func(args map[string]any) (string, bool)
	)
	BeforeEach(func() {
		old := syscall.Umask(0o022)
		DeferCleanup(func() { syscall.Umask(old) })
		var roots *HostRoots
		roots, allowed, _ = hostFixture()
		backend = &downloadBackend{}
		d := &deps{cfg: Config{HostRoots: roots}.withDefaults(), backend: backend, log: slog.New(slog.DiscardHandler)}
		_, handler := copyFileFromSandboxTool(d)
		call = func(args map[string]any) (string, bool) {
			GinkgoHelper()
			args["container_id"] = "sbx-1"
			var req mcp.CallToolRequest
			req.Params.Name = "copy_file_from_sandbox"
			req.Params.Arguments = args
			res, err := handler(context.Background(), req)
			Expect(err).NotTo(HaveOccurred())
			return resultText(res), res.IsError
		}
	})

	It("refuses a directory planted where the file was, writing nothing into the destination", func() {
		backend.archive = func() []byte {
			return tarBytes(
				&tar.Header{Typeflag: tar.TypeDir, Name: "report.txt/", Mode: 0o755},
				&tar.Header{Typeflag: tar.TypeDir, Name: "report.txt/.git/hooks/", Mode: 0o755},
				&tar.Header{Typeflag: tar.TypeReg, Name: "report.txt/.git/hooks/pre-commit", Mode: 0o755},
				&tar.Header{Typeflag: tar.TypeReg, Name: "report.txt/.envrc", Mode: 0o644},
				&tar.Header{Typeflag: tar.TypeReg, Name: "report.txt/Makefile", Mode: 0o644},
			)
		}
		proj := filepath.Join(allowed, "proj")
		Expect(os.MkdirAll(filepath.Join(proj, ".git", "hooks"), 0o755)).To(Succeed())
		before := fstree.List(allowed)
		for _, args := range []map[string]any{
			{"container_src_path": "/app/report.txt", "local_dest_path": proj},
			{"container_src_path": "/app/report.txt", "local_dest_path": filepath.Join(proj, "report.txt"), "overwrite": true, "keep_exec_bits": true},
		} {
			text, isErr := call(args)
			Expect(isErr).To(BeTrue(), text)
			Expect(text).To(ContainSubstring("/app/report.txt is a directory in the sandbox, but a file was asked for"))
			Expect(fstree.List(allowed)).To(Equal(before))
		}
	})

	It("replaces an existing file only with overwrite, and keeps exec bits only with keep_exec_bits", func() {
		backend.archive = func() []byte {
			return tarBytes(&tar.Header{Typeflag: tar.TypeReg, Name: "a.txt", Mode: 0o777})
		}
		target := filepath.Join(allowed, "proj", "a.txt")
		text, isErr := call(map[string]any{"container_src_path": "a.txt", "local_dest_path": filepath.Join(allowed, "proj")})
		Expect(isErr).To(BeTrue(), text)
		Expect(text).To(HavePrefix("Invalid arguments: "))
		Expect(text).To(ContainSubstring("proj/a.txt exists; ask to overwrite it"))
		Expect(os.ReadFile(target)).To(Equal([]byte("a")))

		text, isErr = call(map[string]any{"container_src_path": "a.txt", "local_dest_path": filepath.Join(allowed, "proj"), "overwrite": true})
		Expect(isErr).To(BeFalse(), text)
		Expect(text).To(ContainSubstring("to " + target))
		Expect(os.ReadFile(target)).To(Equal([]byte("content of a.txt")))
		fi, err := os.Stat(target)
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode()).To(Equal(os.FileMode(0o644)))

		text, isErr = call(map[string]any{"container_src_path": "a.txt", "local_dest_path": filepath.Join(allowed, "tool"), "keep_exec_bits": true})
		Expect(isErr).To(BeFalse(), text)
		fi, err = os.Stat(filepath.Join(allowed, "tool"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode()).To(Equal(os.FileMode(0o755)))
	})

	It("copies a directory asked for with a trailing / as a new directory, never merging", func() {
		backend.archive = func() []byte {
			return tarBytes(&tar.Header{Typeflag: tar.TypeDir, Name: "out/", Mode: 0o755}, &tar.Header{Typeflag: tar.TypeReg, Name: "out/r.txt", Mode: 0o644})
		}
		text, isErr := call(map[string]any{"container_src_path": "out/", "local_dest_path": filepath.Join(allowed, "proj")})
		Expect(isErr).To(BeFalse(), text)
		Expect(text).To(ContainSubstring("to " + filepath.Join(allowed, "proj", "out")))
		Expect(os.ReadFile(filepath.Join(allowed, "proj", "out", "r.txt"))).To(Equal([]byte("content of out/r.txt")))
		Expect(backend.paths).To(Equal([]string{"out/"}))

		text, isErr = call(map[string]any{"container_src_path": "out/", "local_dest_path": filepath.Join(allowed, "proj"), "overwrite": true})
		Expect(isErr).To(BeTrue(), text)
		Expect(text).To(ContainSubstring("never merged"))

		text, isErr = call(map[string]any{"container_src_path": "out", "local_dest_path": filepath.Join(allowed, "new")})
		Expect(isErr).To(BeTrue(), text)
		Expect(text).To(ContainSubstring("out is a directory in the sandbox, but a file was asked for"))
		Expect(filepath.Join(allowed, "new")).NotTo(BeADirectory())
	})
})

var _ = Describe("HostRoots shared by several identities", Label("unit"), func() {
	It("give each identity its own subdirectory, so that none reads or plants another's files", func() {
		base, err := filepath.EvalSymlinks(GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		roots, err := NewHostRoots([]string{base})
		Expect(err).NotTo(HaveOccurred())
		roots.SeparateIdentities()
		h := newToolHarness(Config{HostRoots: roots})
		aliceDir := filepath.Join(base, contract.IdentityHash("alice"))
		aliceSbx, bobSbx := h.fake.add("alice"), h.fake.add("bob")
		h.fake.putFile(aliceSbx, "/app/secret.txt", "alice's secret\n")
		h.fake.putFile(bobSbx, "/app/plant.txt", "bob's plant\n")
		from := func(caller, id, src, dest string) toolResult {
			return h.call(caller, "copy_file_from_sandbox", jsonArgs(map[string]any{"container_id": id, "container_src_path": src, "local_dest_path": dest}))
		}

		By("alice copies out into her own directory, and only there")
		res := from("alice", aliceSbx, "/app/secret.txt", filepath.Join(aliceDir, "secret.txt"))
		Expect(res.IsError).To(BeFalse(), res.Text)
		Expect(os.ReadFile(filepath.Join(aliceDir, "secret.txt"))).To(Equal([]byte("alice's secret\n")))
		st, err := os.Stat(aliceDir)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o700)))
		res = from("alice", aliceSbx, "/app/secret.txt", filepath.Join(base, "shared.txt"))
		Expect(res.IsError).To(BeTrue())
		Expect(res.Text).To(And(ContainSubstring("outside the allowed"), ContainSubstring(aliceDir)))

		By("bob can neither read alice's file nor plant one where she reads")
		res = h.call("bob", "copy_file", jsonArgs(map[string]any{"container_id": bobSbx, "local_src_file": filepath.Join(aliceDir, "secret.txt")}))
		Expect(res.IsError).To(BeTrue())
		Expect(res.Text).To(ContainSubstring("outside the allowed"))
		Expect(h.fake.file(bobSbx, "/app/secret.txt")).To(Equal(noFile))
		res = from("bob", bobSbx, "/app/plant.txt", filepath.Join(aliceDir, "plant.txt"))
		Expect(res.IsError).To(BeTrue())
		Expect(filepath.Join(aliceDir, "plant.txt")).NotTo(BeAnExistingFile())
		res = h.call("bob", "copy_project", jsonArgs(map[string]any{"container_id": bobSbx, "local_src_dir": aliceDir}))
		Expect(res.IsError).To(BeTrue())

		By("the local (stdio) identity keeps the roots themselves")
		local, err := roots.ForCaller(contract.Caller{ID: contract.LocalIdentity})
		Expect(err).NotTo(HaveOccurred())
		Expect(local.Roots()).To(Equal([]string{base}))
	})
})
