package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// loudBackend's Exec writes perStream bytes to stdout and to stderr, in
// 32 KiB writes, each stream ending with a line naming the command.
type loudBackend struct {
	contract.Backend
	perStream int
	calls     int
}

func (b *loudBackend) Exec(_ context.Context, _ contract.Caller, _ string, req execio.Request, out contract.OutputFunc) (execio.Result, error) {
	i := b.calls
	b.calls++
	chunk := bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz012345"), 1<<10)
	for _, stream := range []string{"stdout", "stderr"} {
		end := fmt.Sprintf("END-%s-%d\n", stream, i)
		for left := b.perStream - len(end); left > 0; left -= len(chunk) {
			out(stream, chunk[:min(left, len(chunk))])
		}
		out(stream, []byte(end))
	}
	return execio.Result{StdoutBytes: int64(b.perStream), StderrBytes: int64(b.perStream)}, nil
}

var _ = Describe("sandbox_exec output budget", Label("unit"), func() {
	run := func(cfg Config, commands int, perStream int) (ExecResult, string, uint64) {
		GinkgoHelper()
		d := &deps{cfg: cfg.withDefaults(), backend: &loudBackend{perStream: perStream}, log: slog.New(slog.DiscardHandler)}
		_, handler := sandboxExecTool(d)
		cmds := make([]any, commands)
		for i := range cmds {
			cmds[i] = fmt.Sprintf("cmd %d", i)
		}
		var req mcp.CallToolRequest
		req.Params.Name = "sandbox_exec"
		req.Params.Arguments = map[string]any{"container_id": "sbx-1", "commands": cmds}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		res, err := handler(context.Background(), req)
		runtime.ReadMemStats(&after)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.IsError).To(BeFalse())
		out, ok := res.StructuredContent.(ExecResult)
		Expect(ok).To(BeTrue())
		return out, resultText(res), after.TotalAlloc - before.TotalAlloc
	}

	It("keeps the end of each of 100 commands' output within the call's budget, allocating a bounded amount", func() {
		out, text, alloc := run(Config{}, 100, int(DefaultOutputLimit))
		Expect(out.Results).To(HaveLen(100))
		total := 0
		for i, r := range out.Results {
			total += len(r.Stdout) + len(r.Stderr)
			Expect(r.Stdout).To(HaveSuffix(fmt.Sprintf("END-stdout-%d\n", i)))
			Expect(r.Stderr).To(HaveSuffix(fmt.Sprintf("END-stderr-%d\n", i)))
			Expect(r.Stdout).To(HavePrefix("[code-sandbox: stdout: the first "))
			Expect(r.Truncated).To(BeTrue())
		}
		Expect(total).To(BeNumerically("<=", DefaultExecOutputBudget+100*2*128))
		Expect(len(text)).To(BeNumerically("<", DefaultExecOutputBudget+1<<20))
		// 100 commands × 2 streams × 1 MiB went through; what is kept and
		// copied is a few times the (2 MiB) budget.
		Expect(alloc).To(BeNumerically("<", 64<<20), "one sandbox_exec allocated %d bytes", alloc)
	})

	It("gives a quiet command's share to the next, and a single command the whole budget", func() {
		out, _, _ := run(Config{ExecOutputBudget: 64 << 10}, 1, 16<<10)
		Expect(out.Results[0].Stdout).To(HaveLen(16 << 10))
		Expect(out.Results[0].Truncated).To(BeFalse())

		out, _, _ = run(Config{ExecOutputBudget: 64 << 10}, 2, 64<<10)
		// The first command may keep 32 KiB of its 128 KiB; the second
		// the 32 KiB left.
		Expect(len(out.Results[0].Stdout) + len(out.Results[0].Stderr)).To(BeNumerically("<=", 32<<10+2*128))
		Expect(len(out.Results[1].Stdout) + len(out.Results[1].Stderr)).To(BeNumerically("<=", 32<<10+2*128))
		Expect(out.Results[1].Stderr).To(ContainSubstring("END-stderr-1"))
		Expect(strings.Count(out.Results[1].Stdout, "[code-sandbox:")).To(Equal(1))
	})

	It("rejects a budget below the minimum", func() {
		Expect(Config{ExecOutputBudget: 100}.Validate()).To(MatchError(ContainSubstring("exec output budget")))
	})
})
