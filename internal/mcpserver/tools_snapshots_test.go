package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// fakeSnapshots adds contract.SnapshotBackend to the fake backend: it
// records the requests the tools pass on (the backends' behaviour is
// tested against real Docker in dockerbackend and test/e2e).
type fakeSnapshots struct {
	*fakeBackend
	mu    sync.Mutex
	forks []contract.ForkRequest
}

func (f *fakeSnapshots) SnapshotsSupported() bool { return true }

func (f *fakeSnapshots) Snapshot(_ context.Context, _ contract.Caller, id string) (contract.Snapshot, error) {
	return contract.Snapshot{ID: "snap-0123456789abcdef", SourceID: id, Files: 1, Bytes: 2}, nil
}

func (f *fakeSnapshots) Fork(_ context.Context, _ contract.Caller, req contract.ForkRequest) ([]contract.Sandbox, error) {
	f.mu.Lock()
	f.forks = append(f.forks, req)
	f.mu.Unlock()
	out := make([]contract.Sandbox, req.Count)
	for i := range out {
		out[i].ID = fmt.Sprintf("child-%d", i)
	}
	return out, nil
}

func (f *fakeSnapshots) ListSnapshots(context.Context, contract.Caller) ([]contract.Snapshot, error) {
	return nil, nil
}

func (f *fakeSnapshots) DeleteSnapshot(_ context.Context, _ contract.Caller, id string) error {
	return fmt.Errorf("%w: %q", contract.ErrSnapshotNotFound, id)
}

const snapshotToolsGolden = "testdata/snapshot-tools.golden.json"

var _ = Describe("the snapshot tools", Label("unit"), func() {
	var (
		fake *fakeSnapshots
		srv  = func() []byte { return nil }
		call func(tool string, args map[string]any) (bool, string)
	)
	BeforeEach(func() {
		fake = &fakeSnapshots{fakeBackend: newFakeBackend()}
		s, err := New(goldenConfig(), fake, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		srv = func() []byte { return schemaSnapshot(s) }
		call = func(tool string, args map[string]any) (bool, string) {
			params, _ := json.Marshal(map[string]any{"name": tool, "arguments": args})
			var res struct {
				IsError bool `json:"isError"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			}
			Expect(json.Unmarshal(rpc(s, "alice", "tools/call", string(params)), &res)).To(Succeed())
			Expect(res.Content).NotTo(BeEmpty())
			return res.IsError, res.Content[0].Text
		}
	})

	It("are listed, with their schemas pinned in "+snapshotToolsGolden, func() {
		snapshot := srv()
		var tools struct {
			Tools []map[string]any `json:"tools"`
		}
		var doc map[string]json.RawMessage
		Expect(json.Unmarshal(snapshot, &doc)).To(Succeed())
		Expect(json.Unmarshal(doc["tools/list"], &tools)).To(Succeed())
		var ours []map[string]any
		for _, t := range tools.Tools {
			switch t["name"] {
			case "sandbox_snapshot", "sandbox_fork", "list_snapshots", "delete_snapshot":
				ours = append(ours, t)
			}
		}
		Expect(ours).To(HaveLen(4))
		got, err := json.MarshalIndent(ours, "", "  ")
		Expect(err).NotTo(HaveOccurred())
		got = append(got, '\n')
		if *updateGolden || os.Getenv("UPDATE_GOLDEN") != "" {
			Expect(os.MkdirAll(filepath.Dir(snapshotToolsGolden), 0o755)).To(Succeed())
			Expect(os.WriteFile(snapshotToolsGolden, got, 0o644)).To(Succeed())
		}
		want, err := os.ReadFile(snapshotToolsGolden)
		Expect(err).NotTo(HaveOccurred(), "no golden file; create it with: go test ./internal/mcpserver/ -update")
		if !bytes.Equal(want, got) {
			Fail("the snapshot tools' schemas changed (- golden, + now):\n" + lineDiff(string(want), string(got)))
		}
	})

	It("are not listed by a backend that cannot snapshot", func() {
		s, err := New(goldenConfig(), newFakeBackend(), slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(schemaSnapshot(s))).NotTo(ContainSubstring("sandbox_fork"))
	})

	It("pass a fork on with its count, default 1", func() {
		isErr, text := call("sandbox_fork", map[string]any{"container_id": "abc", "count": 3})
		Expect(isErr).To(BeFalse(), text)
		Expect(text).To(Equal("Forked 3 sandboxes: child-0, child-1, child-2."))
		isErr, _ = call("sandbox_fork", map[string]any{"snapshot_id": "snap-0123456789abcdef"})
		Expect(isErr).To(BeFalse())
		Expect(fake.forks).To(Equal([]contract.ForkRequest{{ContainerID: "abc", Count: 3}, {SnapshotID: "snap-0123456789abcdef", Count: 1}}))
	})

	DescribeTable("refuse a bad fork before the backend sees it",
		func(args map[string]any, want string) {
			isErr, text := call("sandbox_fork", args)
			Expect(isErr).To(BeTrue())
			Expect(text).To(ContainSubstring(want))
			Expect(fake.forks).To(BeEmpty())
		},
		Entry("count 0", map[string]any{"container_id": "abc", "count": 0}, "count 0 is out of range: 1 to 16"),
		Entry("count 17", map[string]any{"container_id": "abc", "count": 17}, "count 17 is out of range: 1 to 16"),
		Entry("both", map[string]any{"container_id": "abc", "snapshot_id": "snap-0123456789abcdef"}, "exactly one of container_id and snapshot_id"),
		Entry("neither", map[string]any{}, "exactly one of container_id and snapshot_id"),
		Entry("a bad container_id", map[string]any{"container_id": "../x"}, "is not a sandbox ID"),
		Entry("an unknown argument", map[string]any{"container_id": "abc", "memory": "1Gi"}, "memory"),
	)

	It("say what to do about a snapshot that is not found", func() {
		isErr, text := call("delete_snapshot", map[string]any{"snapshot_id": "snap-ffffffffffffffff"})
		Expect(isErr).To(BeTrue())
		Expect(text).To(ContainSubstring("snapshot not found"))
		Expect(text).To(ContainSubstring("list_snapshots"))
		isErr, text = call("delete_snapshot", map[string]any{})
		Expect(isErr).To(BeTrue())
		Expect(text).To(ContainSubstring(`"snapshot_id" is required`))
	})
})
