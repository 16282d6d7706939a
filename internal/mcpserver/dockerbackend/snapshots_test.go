package dockerbackend

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// shIn runs script in the caller's sandbox id and returns its stdout.
func shIn(ctx context.Context, b *Backend, caller contract.Caller, id, script string) (string, int) {
	GinkgoHelper()
	var out bytes.Buffer
	res, err := b.Exec(ctx, caller, id, execio.Request{Shell: script}, func(stream string, p []byte) {
		if stream == "stdout" {
			out.Write(p)
		}
	})
	Expect(err).NotTo(HaveOccurred())
	return out.String(), res.ExitCode
}

// snapshotFiles lists the files under the backend's snapshot directory.
func snapshotFiles(b *Backend) []string {
	GinkgoHelper()
	var out []string
	b.driver.snapMu.Lock()
	dir := b.driver.snaps.dir
	b.driver.snapMu.Unlock()
	Expect(filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})).To(Succeed())
	return out
}

var _ = Describe("Snapshots and forks", func() {
	var (
		b     *Backend
		alice = contract.Caller{ID: "snap-alice"}
		bob   = contract.Caller{ID: "snap-bob"}
		req   = contract.CreateRequest{Image: testenv.BusyboxImage}
	)
	BeforeEach(func() {
		b = poolBackend(0)
		b.driver.opts.SnapshotDir = GinkgoT().TempDir()
		b.driver.opts.MaxSnapshots = 2
	})

	It("forks a sandbox's files into every child, keeps each child's writes its own, and deletes the data", func(ctx SpecContext) {
		src, err := b.Create(ctx, alice, req)
		Expect(err).NotTo(HaveOccurred())
		_, code := shIn(ctx, b, alice, src.ID, `mkdir -p /app/src && echo v1 >/app/src/main.txt && chmod 640 /app/src/main.txt && echo scratch >/tmp/s`)
		Expect(code).To(Equal(0))

		snap, err := b.Snapshot(ctx, alice, src.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(snap.ID).To(MatchRegexp(`^snap-[0-9a-f]{16}$`))
		Expect(snap.Image).To(Equal(testenv.BusyboxImage))
		Expect(snap.Files).To(Equal(2))

		kids, err := b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 3})
		Expect(err).NotTo(HaveOccurred())
		Expect(kids).To(HaveLen(3))
		for i, k := range kids {
			out, code := shIn(ctx, b, alice, k.ID, `cat /app/src/main.txt /tmp/s; stat -c %a /app/src/main.txt`)
			Expect(code).To(Equal(0))
			Expect(out).To(Equal("v1\nscratch\n640\n"), "child %d", i)
		}
		// Children are fresh: each has a hostname of its own, and none has
		// the source's.
		hostnames := map[string]bool{}
		for _, id := range []string{src.ID, kids[0].ID, kids[1].ID, kids[2].ID} {
			out, code := shIn(ctx, b, alice, id, `hostname`)
			Expect(code).To(Equal(0))
			Expect(out).To(MatchRegexp(`^[a-z0-9-]+\n$`))
			Expect(out).NotTo(Equal("sandbox\n"))
			hostnames[out] = true
		}
		Expect(hostnames).To(HaveLen(4), "source and children share a hostname: %v", hostnames)
		_, code = shIn(ctx, b, alice, kids[0].ID, `echo mine >/app/src/only-0`)
		Expect(code).To(Equal(0))
		for _, other := range []string{kids[1].ID, kids[2].ID, src.ID} {
			_, code := shIn(ctx, b, alice, other, `test -e /app/src/only-0`)
			Expect(code).To(Equal(1))
		}
		list, err := b.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(4))

		// Forking the sandbox directly leaves no snapshot behind.
		more, err := b.Fork(ctx, alice, contract.ForkRequest{ContainerID: src.ID, Count: 1})
		Expect(err).NotTo(HaveOccurred())
		out, _ := shIn(ctx, b, alice, more[0].ID, `cat /app/src/main.txt`)
		Expect(out).To(Equal("v1\n"))
		snaps, err := b.ListSnapshots(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(snaps).To(HaveLen(1))

		Expect(snapshotFiles(b)).To(HaveLen(2)) // the tar and its record
		Expect(b.DeleteSnapshot(ctx, alice, snap.ID)).To(Succeed())
		Expect(snapshotFiles(b)).To(BeEmpty())
		Expect(b.DeleteSnapshot(ctx, alice, snap.ID)).To(MatchError(contract.ErrSnapshotNotFound))
		_, err = b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 1})
		Expect(err).To(MatchError(contract.ErrSnapshotNotFound))
	}, SpecTimeout(3*time.Minute))

	It("keeps one caller's snapshots from another, refuses bad IDs and counts, and holds the snapshot limit", func(ctx SpecContext) {
		src, err := b.Create(ctx, alice, req)
		Expect(err).NotTo(HaveOccurred())
		snap, err := b.Snapshot(ctx, alice, src.ID)
		Expect(err).NotTo(HaveOccurred())

		_, err = b.Snapshot(ctx, bob, src.ID)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = b.Fork(ctx, bob, contract.ForkRequest{SnapshotID: snap.ID, Count: 1})
		Expect(err).To(MatchError(contract.ErrSnapshotNotFound))
		Expect(b.DeleteSnapshot(ctx, bob, snap.ID)).To(MatchError(contract.ErrSnapshotNotFound))
		bobs, err := b.ListSnapshots(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(bobs).To(BeEmpty())
		list, err := b.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty(), "a refused fork left a sandbox")

		for _, id := range []string{"../../etc/passwd", "snap-../../x", "snap-0123456789ABCDEF", "", "snap-0123456789abcdef/"} {
			Expect(b.DeleteSnapshot(ctx, alice, id)).To(MatchError(contract.ErrInvalid), id)
		}
		for _, r := range []contract.ForkRequest{
			{SnapshotID: snap.ID, Count: 0}, {SnapshotID: snap.ID, Count: 17},
			{SnapshotID: snap.ID, ContainerID: src.ID, Count: 1}, {Count: 1},
		} {
			_, err := b.Fork(ctx, alice, r)
			Expect(err).To(MatchError(contract.ErrInvalid), "%+v", r)
		}

		_, err = b.Snapshot(ctx, alice, src.ID)
		Expect(err).NotTo(HaveOccurred())
		_, err = b.Snapshot(ctx, alice, src.ID)
		Expect(err).To(MatchError(contract.ErrQuota))
		Expect(err.Error()).To(ContainSubstring("the most one caller may keep is 2"))
		all, err := b.ListSnapshots(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(all).To(HaveLen(2))
	}, SpecTimeout(2*time.Minute))

	It("removes every snapshot when the server closes", func(ctx SpecContext) {
		src, err := b.Create(ctx, alice, req)
		Expect(err).NotTo(HaveOccurred())
		_, err = b.Snapshot(ctx, alice, src.ID)
		Expect(err).NotTo(HaveOccurred())
		dir := b.driver.snaps.dir
		Expect(dir).To(BeADirectory())
		Expect(b.Close(ctx)).To(Succeed())
		Expect(dir).NotTo(BeAnExistingFile())
	}, SpecTimeout(time.Minute))

	It("forks a default sandbox into warm pool members, with the files restored into them", func(ctx SpecContext) {
		pb := poolBackend(2)
		pb.driver.opts.SnapshotDir = GinkgoT().TempDir()
		src, err := pb.Create(ctx, alice, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		run(ctx, pb, alice, src.ID, `echo warm >/app/w`)
		members := waitFull(ctx, pb)
		kids, err := pb.Fork(ctx, alice, contract.ForkRequest{ContainerID: src.ID, Count: 2})
		Expect(err).NotTo(HaveOccurred())
		for _, k := range kids {
			Expect(members).To(ContainElement(refOf(ctx, pb, k.ID)), "child %s is not a pool member", k.ID)
			Expect(run(ctx, pb, alice, k.ID, `cat /app/w`)).To(Equal("warm\n"))
		}
	}, SpecTimeout(2*time.Minute))
})

var _ = Describe("Snapshots in a registry (--snapshot-registry)", func() {
	It("pushes the tar to the registry, forks from it, and deletes it there", func(ctx SpecContext) {
		addr := testenv.StartRegistry(GinkgoT())
		store, err := snapshotstore.NewRegistry(addr+"/sandbox-snapshots", snapshotstore.RegistryOptions{SpoolDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		b := poolBackend(0)
		b.driver.opts.SnapshotDir = GinkgoT().TempDir()
		b.driver.opts.SnapshotStore = store
		alice := contract.Caller{ID: "reg-alice"}
		src, err := b.Create(ctx, alice, contract.CreateRequest{Image: testenv.BusyboxImage})
		Expect(err).NotTo(HaveOccurred())
		_, code := shIn(ctx, b, alice, src.ID, `echo v1 >/app/f && ln -s f /app/l`)
		Expect(code).To(Equal(0))
		snap, err := b.Snapshot(ctx, alice, src.ID)
		Expect(err).NotTo(HaveOccurred())

		// Locally only the record and the ref; the tar is in the registry.
		var refFile string
		for _, f := range snapshotFiles(b) {
			Expect(f).NotTo(HaveSuffix(".tar"))
			if strings.HasSuffix(f, ".ref") {
				refFile = f
			}
		}
		Expect(refFile).NotTo(BeEmpty())
		ref, err := os.ReadFile(refFile)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(ref)).To(HavePrefix(addr + "/sandbox-snapshots/mcp/"))

		kids, err := b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 2})
		Expect(err).NotTo(HaveOccurred())
		for _, k := range kids {
			out, code := shIn(ctx, b, alice, k.ID, `cat /app/l`)
			Expect(code).To(Equal(0))
			Expect(out).To(Equal("v1\n"))
		}

		Expect(b.DeleteSnapshot(ctx, alice, snap.ID)).To(Succeed())
		_, err = store.Open(ctx, string(ref))
		Expect(err).To(MatchError(snapshotstore.ErrNotFound))
	}, SpecTimeout(3*time.Minute))
})
