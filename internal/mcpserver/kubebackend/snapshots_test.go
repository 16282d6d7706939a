package kubebackend

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"
)

// The snapshot tools on a real node manager (envtest + Docker): the
// manager takes and restores the SandboxSnapshots this backend creates.
// Commands run through Docker here (no node API is served).
var _ = Describe("Backend snapshots and forks (a real manager)", Label("integration", "snapshots"), Ordered, func() {
	var (
		ctx        context.Context
		ns, node   string
		b          *Backend
		alice, bob contract.Caller
		sh         func(id, script string) string
	)

	BeforeAll(func() {
		ctx = context.Background()
		docker := testenv.RequireDocker(testenv.BusyboxImage)
		ns = cp.NewNamespace("mcp-snap")
		prefix := "mcp-snap-node-"
		node = prefix + randid.Hex(3)
		dir, err := snapshotstore.NewDir(filepath.Join(GinkgoT().TempDir(), "snaps"), 0)
		Expect(err).NotTo(HaveOccurred())
		n := testnode.Start(cp, nil, testnode.NodeOptions{Name: node, Endpoint: "https://127.0.0.1:1",
			Snapshots: &snapshotstore.Node{Dir: dir}})
		DeferCleanup(func() { n.Stop(); testenv.RemoveNodeContainers(docker, prefix) })
		alice, bob = contract.Caller{ID: "alice@example.com"}, contract.Caller{ID: "bob@example.com"}
		b, err = New(Options{Config: cp.Config, Namespace: ns, NodeName: node, MaxSandboxes: 4,
			ReadyTimeout: 90 * time.Second, StopTimeout: 30 * time.Second,
			Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
		Expect(err).NotTo(HaveOccurred())
		bctx, cancel := context.WithCancel(ctx)
		b.Start(bctx)
		DeferCleanup(func() { _ = b.Close(context.Background()); cancel() })
		Eventually(b.Ready).WithArguments(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		sh = func(id, script string) string {
			GinkgoHelper()
			var sbx sandboxv1alpha1.Sandbox
			Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, &sbx)).To(Succeed())
			out, err := exec.Command("docker", "exec", sbx.Status.ContainerID, "sh", "-c", script).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), string(out))
			return strings.TrimSpace(string(out))
		}
	})

	It("snapshots, forks within --max-sandboxes, hides one caller's snapshots from another, and deletes", func() {
		Expect(b.SnapshotsSupported()).To(BeTrue())
		src, err := b.Create(ctx, alice, contract.CreateRequest{Image: testenv.BusyboxImage})
		Expect(err).NotTo(HaveOccurred())
		sh(src.ID, "echo hello > /app/f && echo t > /tmp/t")

		snap, err := b.Snapshot(ctx, alice, src.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(snap.ID).To(HavePrefix(SnapshotPrefix))
		Expect(snap.SourceID).To(Equal(src.ID))
		Expect(snap.Image).To(Equal(testenv.BusyboxImage))
		Expect(snap.Bytes).To(BeNumerically(">", 0))
		var obj sandboxv1alpha1.SandboxSnapshot
		Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: snap.ID}, &obj)).To(Succeed())
		Expect(obj.Labels[LabelOwner]).To(Equal(contract.IdentityHash(alice.ID)))
		Expect(obj.Status.Node).To(Equal(node))

		// Another caller: not found, exactly like a snapshot that never
		// existed; its own list is empty.
		_, err = b.Fork(ctx, bob, contract.ForkRequest{SnapshotID: snap.ID, Count: 1})
		Expect(err).To(MatchError(contract.ErrSnapshotNotFound))
		Expect(b.DeleteSnapshot(ctx, bob, snap.ID)).To(MatchError(contract.ErrSnapshotNotFound))
		list, err := b.ListSnapshots(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
		_, err = b.Snapshot(ctx, bob, src.ID)
		Expect(err).To(MatchError(contract.ErrNotFound))
		for _, bad := range []string{"", "../x", "mcp-snap-UPPER", "other"} {
			_, err = b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: bad, Count: 1})
			Expect(err).To(HaveOccurred(), bad)
		}
		_, err = b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 17})
		Expect(err).To(MatchError(contract.ErrInvalid))

		kids, err := b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 2})
		Expect(err).NotTo(HaveOccurred())
		Expect(kids).To(HaveLen(2))
		for _, k := range kids {
			Expect(k.Status).To(Equal("running"))
			Expect(sh(k.ID, "cat /app/f /tmp/t")).To(Equal("hello\nt"))
		}
		sh(kids[0].ID, "echo mine > /app/f")
		Expect(sh(kids[1].ID, "cat /app/f")).To(Equal("hello"), "a fork's writes stay out of its sibling")

		// 3 of 4 used: a fork of 2 is refused by the reservation, and
		// leaves nothing.
		_, err = b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 2})
		Expect(err).To(MatchError(contract.ErrQuota))
		mine, err := b.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(mine).To(HaveLen(3))

		// From a sandbox: snapshotted for the fork, which removes that
		// snapshot again.
		more, err := b.Fork(ctx, alice, contract.ForkRequest{ContainerID: src.ID, Count: 1})
		Expect(err).NotTo(HaveOccurred())
		Expect(sh(more[0].ID, "cat /app/f")).To(Equal("hello"))
		Eventually(func() []string {
			list, err := b.ListSnapshots(ctx, alice)
			Expect(err).NotTo(HaveOccurred())
			var ids []string
			for _, s := range list {
				ids = append(ids, s.ID)
			}
			return ids
		}).WithTimeout(30 * time.Second).Should(Equal([]string{snap.ID}))

		Expect(b.DeleteSnapshot(ctx, alice, snap.ID)).To(Succeed())
		Eventually(func() bool {
			err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: snap.ID}, &sandboxv1alpha1.SandboxSnapshot{})
			return client.IgnoreNotFound(err) == nil && err != nil
		}).WithTimeout(30*time.Second).Should(BeTrue(), "the manager removed the data and the finalizer")
		_, err = b.Fork(ctx, alice, contract.ForkRequest{SnapshotID: snap.ID, Count: 1})
		Expect(err).To(MatchError(contract.ErrSnapshotNotFound))
	})

	It("holds an identity's snapshots to --max-snapshots: the limit+1-th sandbox_snapshot is an isError result naming the limit, also when they race", func() {
		b.driver.opts.MaxSnapshots = 2
		DeferCleanup(func() { b.driver.opts.MaxSnapshots = DefaultMaxSnapshots })
		mine, err := b.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(mine).NotTo(BeEmpty())
		src := mine[0].ID
		srv, err := mcpserver.New(mcpserver.Config{}, b, slog.New(slog.NewTextHandler(GinkgoWriter, nil)))
		Expect(err).NotTo(HaveOccurred())
		call := func(tool string, args map[string]any) (bool, string) {
			GinkgoHelper()
			params, _ := json.Marshal(map[string]any{"name": tool, "arguments": args})
			msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":%s}`, params)
			out, err := json.Marshal(srv.HandleMessage(contract.WithCaller(ctx, alice), json.RawMessage(msg)))
			Expect(err).NotTo(HaveOccurred())
			var res struct {
				Result struct {
					IsError bool `json:"isError"`
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"result"`
			}
			Expect(json.Unmarshal(out, &res)).To(Succeed(), string(out))
			Expect(res.Result.Content).NotTo(BeEmpty(), string(out))
			return res.Result.IsError, res.Result.Content[0].Text
		}
		for i := range 2 {
			isErr, text := call("sandbox_snapshot", map[string]any{"container_id": src})
			Expect(isErr).To(BeFalse(), "snapshot %d: %s", i+1, text)
		}
		isErr, text := call("sandbox_snapshot", map[string]any{"container_id": src})
		Expect(isErr).To(BeTrue())
		Expect(text).To(ContainSubstring("you already keep 2 snapshots; the limit (--max-snapshots) is 2"))
		// Another identity has its own count.
		other, err := b.Create(ctx, bob, contract.CreateRequest{Image: testenv.BusyboxImage})
		Expect(err).NotTo(HaveOccurred())
		bobSnap, err := b.Snapshot(ctx, bob, other.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(b.DeleteSnapshot(ctx, bob, bobSnap.ID)).To(Succeed())

		// Racing creates are held to the limit too: with one place free,
		// one of three concurrent snapshots passes.
		list, err := b.ListSnapshots(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(2))
		Expect(b.DeleteSnapshot(ctx, alice, list[0].ID)).To(Succeed())
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				defer GinkgoRecover()
				_, errs[i] = b.Snapshot(ctx, alice, src)
			})
		}
		wg.Wait()
		passed := 0
		for _, err := range errs {
			if err == nil {
				passed++
			} else {
				Expect(err).To(MatchError(contract.ErrQuota))
			}
		}
		Expect(passed).To(Equal(1))
		Eventually(func() int {
			var objs sandboxv1alpha1.SandboxSnapshotList
			Expect(cp.Client.List(ctx, &objs, client.InNamespace(ns), client.MatchingLabels{LabelOwner: contract.IdentityHash(alice.ID)})).To(Succeed())
			n := 0
			for _, o := range objs.Items {
				if o.DeletionTimestamp == nil {
					n++
				}
			}
			return n
		}).WithTimeout(30 * time.Second).Should(Equal(2))
	})
})
