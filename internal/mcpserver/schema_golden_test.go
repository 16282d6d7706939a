package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"

	"github.com/mark3labs/mcp-go/server"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The golden file pins what clients see of the server: every tool's name,
// description, argument schema, output schema and annotations, and the
// resource templates. Regenerate it after an intended change with
//
//	go test ./internal/mcpserver/ -run TestMCPServer -update
//
// (or UPDATE_GOLDEN=1 in the environment) and review the diff.
var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden.json from the running code")

const toolsListGolden = "testdata/tools-list.golden.json"

// goldenConfig is the policy the snapshot is taken with: the defaults, so
// that the descriptions show what a default server announces.
// goldenConfig is the docker backend's configuration as the binary makes
// it without flags, as far as the tool descriptions go.
func goldenConfig() Config {
	return Config{Version: "golden", SandboxNanoCPUs: dockerruntime.DefaultNanoCPUs, SandboxMemoryBytes: dockerruntime.DefaultMemoryBytes,
		SandboxWorkingDir: dockerruntime.DefaultWorkingDir, StopGrace: dockerbackend.DefaultStopGrace}
}

// rpc sends one JSON-RPC request to srv as caller and returns the result
// member of the response, failing on a protocol error.
func rpc(srv *server.MCPServer, caller, method, params string) json.RawMessage {
	GinkgoHelper()
	ctx := contract.WithCaller(context.Background(), contract.Caller{ID: caller})
	if params == "" {
		params = "{}"
	}
	msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":%q,"params":%s}`, method, params)
	raw, err := json.Marshal(srv.HandleMessage(ctx, json.RawMessage(msg)))
	Expect(err).NotTo(HaveOccurred())
	var resp struct {
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	Expect(json.Unmarshal(raw, &resp)).To(Succeed())
	Expect(resp.Error).To(BeEmpty(), "%s: protocol error %s", method, resp.Error)
	return resp.Result
}

// schemaSnapshot is tools/list and resources/templates/list, as one
// indented JSON document with sorted keys.
func schemaSnapshot(srv *server.MCPServer) []byte {
	GinkgoHelper()
	var tools, templates struct {
		Tools             []any `json:"tools"`
		ResourceTemplates []any `json:"resourceTemplates"`
	}
	Expect(json.Unmarshal(rpc(srv, "golden", "tools/list", ""), &tools)).To(Succeed())
	Expect(json.Unmarshal(rpc(srv, "golden", "resources/templates/list", ""), &templates)).To(Succeed())
	out, err := json.MarshalIndent(map[string]any{
		"tools/list":               map[string]any{"tools": tools.Tools},
		"resources/templates/list": map[string]any{"resourceTemplates": templates.ResourceTemplates},
	}, "", "  ")
	Expect(err).NotTo(HaveOccurred())
	return append(out, '\n')
}

// lineDiff is a unified-style diff of two texts (- want, + got), with up
// to three lines of context around each change.
func lineDiff(want, got string) string {
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Longest common subsequence, from the end.
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
		n    int // line number in want (for context and removals) or got
	}
	var ops []line
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, line{' ', a[i], i + 1})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, line{'-', a[i], i + 1})
			i++
		default:
			ops = append(ops, line{'+', b[j], j + 1})
			j++
		}
	}
	var out strings.Builder
	lastShown := -1
	for k, op := range ops {
		if op.op == ' ' {
			continue
		}
		for c := max(k-3, lastShown+1); c < k; c++ {
			if c == max(k-3, lastShown+1) && c > lastShown+1 {
				fmt.Fprintf(&out, "@@ line %d @@\n", ops[c].n)
			}
			fmt.Fprintf(&out, "  %s\n", ops[c].text)
		}
		fmt.Fprintf(&out, "%c %s\n", op.op, op.text)
		lastShown = k
		for c := k + 1; c < len(ops) && c <= k+3 && ops[c].op == ' '; c++ {
			fmt.Fprintf(&out, "  %s\n", ops[c].text)
			lastShown = c
		}
	}
	return out.String()
}

var _ = Describe("the tools/list snapshot", Label("unit"), func() {
	var snapshot []byte

	BeforeEach(func() {
		srv, err := New(goldenConfig(), newFakeBackend(), slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		snapshot = schemaSnapshot(srv)
	})

	It("matches "+toolsListGolden, func() {
		if *updateGolden || os.Getenv("UPDATE_GOLDEN") != "" {
			Expect(os.MkdirAll(filepath.Dir(toolsListGolden), 0o755)).To(Succeed())
			Expect(os.WriteFile(toolsListGolden, snapshot, 0o644)).To(Succeed())
			GinkgoWriter.Printf("wrote %s\n", toolsListGolden)
		}
		want, err := os.ReadFile(toolsListGolden)
		Expect(err).NotTo(HaveOccurred(), "no golden file; create it with: go test ./internal/mcpserver/ -update")
		if !bytes.Equal(want, snapshot) {
			Fail(fmt.Sprintf("tools/list or resources/templates/list changed (- golden, + now).\n"+
				"Clients of the seed code-sandbox-mcp depend on these names and schemas. If the change is intended, regenerate with\n"+
				"  go test ./internal/mcpserver/ -update\nand review the diff of %s.\n\n%s", toolsListGolden, lineDiff(string(want), string(snapshot))))
		}
	})

	It("keeps every tool, argument and resource of the seed code-sandbox-mcp", func() {
		var doc struct {
			Tools struct {
				Tools []struct {
					Name        string `json:"name"`
					InputSchema struct {
						Properties map[string]struct {
							Type string `json:"type"`
						} `json:"properties"`
						Required []string `json:"required"`
					} `json:"inputSchema"`
				} `json:"tools"`
			} `json:"tools/list"`
			Templates struct {
				ResourceTemplates []struct {
					URITemplate string `json:"uriTemplate"`
				} `json:"resourceTemplates"`
			} `json:"resources/templates/list"`
		}
		Expect(json.Unmarshal(snapshot, &doc)).To(Succeed())
		type arg struct {
			name, typ string
			required  bool
		}
		// The seed's tools and their arguments (name, JSON type, required).
		seed := map[string][]arg{
			"sandbox_initialize": {{"image", "string", false}},
			"copy_project":       {{"container_id", "string", true}, {"local_src_dir", "string", true}, {"dest_dir", "string", false}},
			"write_file":         {{"container_id", "string", true}, {"file_name", "string", true}, {"file_contents", "string", true}, {"dest_dir", "string", false}},
			"sandbox_exec":       {{"container_id", "string", true}, {"commands", "array", true}},
			"copy_file":          {{"container_id", "string", true}, {"local_src_file", "string", true}, {"dest_path", "string", false}},
			"sandbox_stop":       {{"container_id", "string", true}},
		}
		found := map[string]bool{}
		for _, t := range doc.Tools.Tools {
			args, ok := seed[t.Name]
			if !ok {
				continue
			}
			found[t.Name] = true
			for _, a := range args {
				p, ok := t.InputSchema.Properties[a.name]
				Expect(ok).To(BeTrue(), "%s lost the seed's argument %q", t.Name, a.name)
				Expect(p.Type).To(Equal(a.typ), "%s.%s changed type", t.Name, a.name)
				if a.required {
					Expect(t.InputSchema.Required).To(ContainElement(a.name), "%s.%s is no longer required", t.Name, a.name)
				} else {
					Expect(t.InputSchema.Required).NotTo(ContainElement(a.name), "%s.%s became required: seed clients omit it", t.Name, a.name)
				}
			}
			// Nothing the seed's clients do not send may be required.
			for _, r := range t.InputSchema.Required {
				Expect(args).To(ContainElement(arg{r, t.InputSchema.Properties[r].Type, true}), "%s requires %q, which seed clients do not send", t.Name, r)
			}
		}
		for name := range seed {
			Expect(found).To(HaveKey(name), "the seed's tool %s is gone", name)
		}
		var uris []string
		for _, rt := range doc.Templates.ResourceTemplates {
			uris = append(uris, rt.URITemplate)
		}
		Expect(uris).To(ContainElement("containers://{id}/logs"))
	})

	It("shows a diff that names the changed line", func() {
		d := lineDiff("a\nb\nc\nd\ne\nf\ng\nh\n", "a\nb\nc\nd\nX\nf\ng\nh\n")
		Expect(d).To(ContainSubstring("- e\n+ X\n"))
		Expect(d).To(ContainSubstring("  d\n"))
		Expect(d).NotTo(ContainSubstring("  a\n"))
	})
})

// instructionsOf is the instructions a server made with cfg announces.
func instructionsOf(cfg Config) string {
	GinkgoHelper()
	srv, err := New(cfg, newFakeBackend(), slog.New(slog.DiscardHandler))
	Expect(err).NotTo(HaveOccurred())
	var res struct {
		Instructions string `json:"instructions"`
	}
	Expect(json.Unmarshal(rpc(srv, "alice", "initialize", `{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}`), &res)).To(Succeed())
	return res.Instructions
}

var _ = Describe("the tool descriptions' defaults", Label("unit"), func() {
	// descriptions returns every tool and argument description of a server
	// made with cfg, joined.
	descriptions := func(cfg Config) string {
		GinkgoHelper()
		srv, err := New(cfg, newFakeBackend(), slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		var list struct {
			Tools []struct {
				Description string `json:"description"`
				InputSchema struct {
					Properties map[string]struct {
						Description string `json:"description"`
					} `json:"properties"`
				} `json:"inputSchema"`
			} `json:"tools"`
		}
		Expect(json.Unmarshal(rpc(srv, "alice", "tools/list", ""), &list)).To(Succeed())
		var b strings.Builder
		for _, t := range list.Tools {
			b.WriteString(t.Description + "\n")
			for _, p := range t.InputSchema.Properties {
				b.WriteString(p.Description + "\n")
			}
		}
		return b.String()
	}

	It("state the backend's defaults from the Config, not numbers of their own", func() {
		text := descriptions(Config{SandboxNanoCPUs: 2_500_000_000, SandboxMemoryBytes: 3 << 30, SandboxWorkingDir: "/work", StopGrace: 42 * time.Second})
		Expect(text).To(ContainSubstring("CPU cores (default 2.5)."))
		Expect(text).To(ContainSubstring("(default 3Gi; swap is off)"))
		Expect(text).To(ContainSubstring("its working directory (/work), /tmp"))
		Expect(text).To(ContainSubstring("(SIGTERM, 42 s grace, then SIGKILL)"))
		Expect(instructionsOf(Config{SandboxWorkingDir: "/work"})).To(ContainSubstring("the working directory (default /work), /tmp"))
		Expect(instructionsOf(Config{})).To(ContainSubstring("the working directory, /tmp"))
		Expect(text).NotTo(Or(ContainSubstring("default 1)"), ContainSubstring("512Mi;"), ContainSubstring("10 s"), ContainSubstring("directory (/app)"), ContainSubstring("default /app")))
	})

	It("say no number where the Config gives none", func() {
		text := descriptions(Config{})
		Expect(text).To(ContainSubstring("CPU cores (default the server's default)."))
		Expect(text).To(ContainSubstring("(default the server's default; swap is off)"))
		Expect(text).To(ContainSubstring("its working directory, /tmp"))
		Expect(text).To(ContainSubstring("(SIGTERM, a grace period, then SIGKILL)"))
	})

	DescribeTable("write quantities in the units the arguments take",
		func(bytes int64, want string) { Expect(quantityText(bytes)).To(Equal(want)) },
		Entry("mebibytes", int64(512<<20), "512Mi"),
		Entry("gibibytes", int64(4<<30), "4Gi"),
		Entry("kibibytes", int64(1536<<10), "1536Ki"),
		Entry("bytes", int64(1000), "1000"),
	)
})
