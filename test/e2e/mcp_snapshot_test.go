//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// Snapshots and forks through the MCP tools on the Docker backend
// (issue 27): the files of a sandbox reach every child, a child's writes
// stay its own, a snapshot is deleted with its data, and another client
// cannot use one.
var _ = Describe("code-sandbox-mcp snapshots and forks", Ordered, func() {
	var (
		srv  *mcpServer
		sess *mcp.ClientSession
	)
	BeforeAll(func(ctx SpecContext) {
		srv = startStdioSession(ctx, nil, nil)
		sess = srv.session
		DeferCleanup(func() { srv.stop() })
	})

	It("snapshots, forks into 3 children and deletes the snapshot", func(ctx SpecContext) {
		id := initSandbox(ctx, sess, nil)
		execOK(ctx, sess, id, "mkdir -p /app/proj && echo 'print(42)' >/app/proj/main.py && echo tmp >/tmp/t")

		res := call(ctx, sess, "sandbox_snapshot", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), text(res))
		snapID, _ := structured(res)["snapshot_id"].(string)
		Expect(snapID).To(MatchRegexp(`^snap-[0-9a-f]{16}$`))

		res = call(ctx, sess, "sandbox_fork", map[string]any{"snapshot_id": snapID, "count": 3})
		Expect(res.IsError).To(BeFalse(), text(res))
		kids := structured(res)["sandboxes"].([]any)
		Expect(kids).To(HaveLen(3))
		var ids []string
		for _, k := range kids {
			ids = append(ids, k.(map[string]any)["container_id"].(string))
		}
		for _, k := range ids {
			Expect(execOK(ctx, sess, k, "cat /app/proj/main.py /tmp/t")).To(ContainSubstring("print(42)\ntmp"))
		}
		execOK(ctx, sess, ids[0], "echo mine >/app/proj/only-0")
		for _, other := range append([]string{id}, ids[1:]...) {
			res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": other, "commands": []string{"test -e /app/proj/only-0 && echo LEAKED || echo absent"}})
			Expect(text(res)).To(ContainSubstring("absent"))
		}

		// Straight from a sandbox, and bad requests.
		res = call(ctx, sess, "sandbox_fork", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), text(res))
		for _, args := range []map[string]any{
			{"container_id": id, "count": 17},
			{"container_id": id, "snapshot_id": snapID},
			{},
			{"snapshot_id": "../../etc/passwd"},
		} {
			res := call(ctx, sess, "sandbox_fork", args)
			Expect(res.IsError).To(BeTrue(), "%v", args)
		}

		res = call(ctx, sess, "list_snapshots", nil)
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["snapshots"]).To(HaveLen(1))
		res = call(ctx, sess, "delete_snapshot", map[string]any{"snapshot_id": snapID})
		Expect(res.IsError).To(BeFalse(), text(res))
		res = call(ctx, sess, "delete_snapshot", map[string]any{"snapshot_id": snapID})
		Expect(res.IsError).To(BeTrue())
		Expect(strings.ToLower(text(res))).To(ContainSubstring("snapshot not found"))
	})
})
