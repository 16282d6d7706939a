package transport

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// What MCP 2026-07-28 requires of this server, over the real HTTP transport
// in front of the real mcpserver (no backend: nothing here reaches a
// sandbox). mcp-go implements most of it; these specs hold the server to
// it, so that an mcp-go upgrade or a change of ours that breaks it fails
// here.

const modern = "2026-07-28"

// modernMeta is the per-request _meta a 2026-07-28 client sends.
func modernMeta(version string) string {
	return `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + version + `","io.modelcontextprotocol/clientCapabilities":{}}`
}

// modernBody is a 2026-07-28 request with id, method and params (a JSON
// object's members, without braces; the _meta is added).
func modernBody(id int, method, params string) string {
	if params != "" {
		params += ","
	}
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{%s%s}}`, id, method, params, modernMeta(modern))
}

// modernRequest is a POST as a 2026-07-28 client sends it: the version,
// Mcp-Method and (when name is not "") Mcp-Name headers, and no session.
func modernRequest(body, method, name string) *http.Request {
	r := mcpRequest("192.0.2.1:1", aliceToken, "", strings.NewReader(body))
	r.Header.Set("MCP-Protocol-Version", modern)
	if method != "" {
		r.Header.Set("Mcp-Method", method)
	}
	if name != "" {
		r.Header.Set("Mcp-Name", name)
	}
	return r
}

// rpcReply is a JSON-RPC response, read from a JSON body or from the last
// event of an SSE one.
type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result map[string]any  `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
	Method string         `json:"method"`
	Params map[string]any `json:"params"`
}

// sseMessages decodes the data lines of an SSE body, or a JSON body as one
// message.
func sseMessages(w *httptest.ResponseRecorder) []rpcReply {
	GinkgoHelper()
	var out []rpcReply
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		var m rpcReply
		Expect(json.Unmarshal(w.Body.Bytes(), &m)).To(Succeed(), "%d %s", w.Code, w.Body.String())
		return []rpcReply{m}
	}
	sc := bufio.NewScanner(strings.NewReader(w.Body.String()))
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var m rpcReply
			Expect(json.Unmarshal([]byte(data), &m)).To(Succeed(), data)
			out = append(out, m)
		}
	}
	return out
}

func reply(w *httptest.ResponseRecorder) rpcReply {
	GinkgoHelper()
	msgs := sseMessages(w)
	Expect(msgs).NotTo(BeEmpty(), "%d %s", w.Code, w.Body.String())
	return msgs[len(msgs)-1]
}

func sandboxMCP() http.Handler {
	GinkgoHelper()
	s, err := mcpserver.New(mcpserver.Config{}, nil, slog.New(slog.DiscardHandler))
	Expect(err).NotTo(HaveOccurred())
	return newTestHTTP(s, HTTPOptions{MaxMessageBytes: 4 << 10})
}

var _ = Describe("MCP 2026-07-28 on the HTTP endpoint", Label("unit"), func() {
	var h http.Handler
	BeforeEach(func() { h = sandboxMCP() })

	It("answers server/discover with both revisions, its capabilities, identity and cache hints", func() {
		w := serve(h, modernRequest(modernBody(1, "server/discover", ""), "server/discover", ""))
		Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
		Expect(w.Header().Get("Mcp-Session-Id")).To(BeEmpty(), "2026-07-28 has no sessions")
		res := reply(w).Result
		Expect(res["supportedVersions"]).To(ContainElements(modern, "2025-11-25"))
		Expect(res["capabilities"]).To(And(HaveKey("tools"), HaveKey("resources"), HaveKey("logging")))
		Expect(res["resultType"]).To(Equal("complete"))
		Expect(res["_meta"]).To(HaveKeyWithValue("io.modelcontextprotocol/serverInfo", HaveKeyWithValue("name", mcpserver.ServerName)))
		Expect(res["ttlMs"]).To(BeNumerically("==", mcpserver.ListCacheTTL.Milliseconds()))
		Expect(res["cacheScope"]).To(Equal("public"))
	})

	It("lists tools in one fixed order, and every list with ttlMs and cacheScope", func() {
		var orders [][]string
		for i := range 5 {
			w := serve(h, modernRequest(modernBody(i+1, "tools/list", ""), "tools/list", ""))
			Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
			res := reply(w).Result
			Expect(res["ttlMs"]).To(BeNumerically("==", 300000))
			Expect(res["cacheScope"]).To(Equal("public"))
			var names []string
			for _, t := range res["tools"].([]any) {
				names = append(names, t.(map[string]any)["name"].(string))
			}
			orders = append(orders, names)
		}
		Expect(orders[0]).To(ContainElements("sandbox_initialize", "sandbox_exec", "write_file", "sandbox_stop"))
		Expect(slices.IsSorted(orders[0])).To(BeTrue(), "tools/list order: %v", orders[0])
		for _, o := range orders[1:] {
			Expect(o).To(Equal(orders[0]))
		}
		for _, method := range []string{"resources/list", "resources/templates/list"} {
			w := serve(h, modernRequest(modernBody(9, method, ""), method, ""))
			Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
			res := reply(w).Result
			Expect(res).To(And(HaveKeyWithValue("ttlMs", BeNumerically("==", 300000)), HaveKeyWithValue("cacheScope", "public")), method)
		}
	})

	It("leaves what a 2025-11-25 session sees as it was: no cache hints, resource not found -32002", func() {
		sid := initSession(h, "192.0.2.1:1", aliceToken)
		w := serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)))
		Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
		Expect(reply(w).Result).NotTo(Or(HaveKey("ttlMs"), HaveKey("cacheScope"), HaveKey("resultType")))
		w = serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"nope://x"}}`)))
		Expect(reply(w).Error).NotTo(BeNil())
		Expect(reply(w).Error.Code).To(Equal(-32002))
	})

	It("answers a resource that does not exist with -32602 and 400, and no result", func() {
		uri := "test://no-such-resource"
		w := serve(h, modernRequest(modernBody(4, "resources/read", `"uri":"`+uri+`"`), "resources/read", uri))
		Expect(w.Code).To(Equal(http.StatusBadRequest), w.Body.String())
		r := reply(w)
		Expect(r.Result).To(BeNil())
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Code).To(Equal(-32602))
		Expect(string(r.ID)).To(Equal("4"))
	})

	DescribeTable("refuses a request whose headers do not match its body, before any tool runs",
		func(body, method, name, version string, wantStatus, wantCode int, wantText string) {
			r := modernRequest(body, method, name)
			if version != "" {
				r.Header.Set("MCP-Protocol-Version", version)
			}
			w := serve(h, r)
			Expect(w.Code).To(Equal(wantStatus), w.Body.String())
			rep := reply(w)
			Expect(rep.Error).NotTo(BeNil(), w.Body.String())
			Expect(rep.Error.Code).To(Equal(wantCode), w.Body.String())
			Expect(rep.Error.Message).To(ContainSubstring(wantText))
			Expect(rep.Result).To(BeNil())
		},
		Entry("no Mcp-Method", modernBody(5, "tools/list", ""), "", "", "", 400, -32020, "Mcp-Method"),
		Entry("Mcp-Method naming another method", modernBody(5, "tools/call", `"name":"sandbox_stop","arguments":{}`), "tools/list", "sandbox_stop", "", 400, -32020, "Mcp-Method"),
		Entry("a tools/call without Mcp-Name", modernBody(5, "tools/call", `"name":"sandbox_stop","arguments":{}`), "tools/call", "", "", 400, -32020, "Mcp-Name"),
		Entry("Mcp-Name naming another tool", modernBody(5, "tools/call", `"name":"sandbox_stop","arguments":{}`), "tools/call", "list_sandboxes", "", 400, -32020, "Mcp-Name"),
		Entry("Mcp-Name naming another resource", modernBody(5, "resources/read", `"uri":"containers://a/logs"`), "resources/read", "containers://b/logs", "", 400, -32020, "Mcp-Name"),
		Entry("Mcp-Name in bad base64", modernBody(5, "tools/call", `"name":"sandbox_stop","arguments":{}`), "tools/call", "=?base64?!!!?=", "", 400, -32020, "Mcp-Name"),
		Entry("a header version the _meta does not state", modernBody(5, "tools/list", ""), "tools/list", "", "2025-11-25", 400, -32020, "does not match"),
		Entry("no protocol version in _meta", `{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}}`, "tools/list", "", "", 400, -32602, "protocolVersion"),
		Entry("no _meta at all", `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`, "tools/list", "", "", 400, -32602, "protocolVersion"),
		Entry("a version this server does not serve", strings.ReplaceAll(modernBody(5, "tools/list", ""), modern, "2099-01-01"), "tools/list", "", "2099-01-01", 400, -32022, ""),
	)

	It("accepts a base64-encoded Mcp-Name that matches the body", func() {
		uri := "test://ünïcode"
		enc := "=?base64?" + base64.StdEncoding.EncodeToString([]byte(uri)) + "?="
		w := serve(h, modernRequest(modernBody(6, "resources/read", `"uri":"`+uri+`"`), "resources/read", enc))
		// Past the header check: the resource itself is not found.
		Expect(reply(w).Error).NotTo(BeNil(), w.Body.String())
		Expect(reply(w).Error.Code).To(Equal(-32602), w.Body.String())
		Expect(reply(w).Error.Message).To(ContainSubstring("not found"))
	})

	It("holds a 2026-07-28 message to its size cap before decoding it, whatever its Mcp-Name says", func() {
		big := strings.Repeat("x", 8<<10)
		call := func(name string) string {
			return modernBody(7, "tools/call", `"name":"`+name+`","arguments":{"container_id":"`+big+`"}`)
		}
		// The header claims the large-body tool; the body is a call of a
		// small one: the cap is the body's tool's.
		w := serve(h, modernRequest(call("sandbox_stop"), "tools/call", "write_file"))
		Expect(w.Code).To(Equal(http.StatusRequestEntityTooLarge), w.Body.String())
		Expect(w.Body.String()).To(ContainSubstring("a call of sandbox_stop is over its limit of 4096 bytes"))
		// A header that names a small tool refuses a large body unread.
		body := &recordingBody{r: strings.NewReader(call("write_file"))}
		r := modernRequest("", "tools/call", "sandbox_stop")
		r.Body, r.ContentLength = body, int64(len(call("write_file")))
		Expect(serve(h, r).Code).To(Equal(http.StatusRequestEntityTooLarge))
		Expect(body.reads.Load()).To(BeZero())
		// _meta counts towards the bounds like the rest of the message.
		deep := strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40)
		w = serve(h, modernRequest(`{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"_meta":`+deep+`}}`, "tools/list", ""))
		Expect(w.Code).To(Equal(http.StatusBadRequest))
		Expect(w.Body.String()).To(ContainSubstring("nested more than"))
	})

	It("answers ping, which 2026-07-28 removed, with 404 and -32601, with or without _meta", func() {
		for _, body := range []string{`{"jsonrpc":"2.0","id":11,"method":"ping"}`, modernBody(11, "ping", "")} {
			w := serve(h, modernRequest(body, "ping", ""))
			Expect(w.Code).To(Equal(http.StatusNotFound), w.Body.String())
			rep := reply(w)
			Expect(string(rep.ID)).To(Equal("11"))
			Expect(rep.Error).NotTo(BeNil())
			Expect(rep.Error.Code).To(Equal(-32601))
		}
		// A session-based client's ping is answered as before.
		sid := initSession(h, "192.0.2.1:1", aliceToken)
		w := serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(`{"jsonrpc":"2.0","id":12,"method":"ping"}`)))
		Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
		Expect(reply(w).Error).To(BeNil())
		// An unknown version is not taken for 2026-07-28: it gets the
		// unsupported-version error that lists the ones served.
		r := modernRequest(`{"jsonrpc":"2.0","id":13,"method":"ping"}`, "ping", "")
		r.Header.Set("MCP-Protocol-Version", "zzzz")
		Expect(serve(h, r).Code).To(Equal(http.StatusBadRequest))
	})

	It("has no GET stream and no DELETE for a 2026-07-28 client", func() {
		for _, verb := range []string{http.MethodGet, http.MethodDelete} {
			r := mcpRequest("192.0.2.1:1", aliceToken, "", nil)
			r.Method = verb
			r.Header.Set("MCP-Protocol-Version", modern)
			w := serve(h, r)
			Expect(w.Code).To(Equal(http.StatusMethodNotAllowed), "%s: %s", verb, w.Body.String())
			Expect(w.Header().Get("Allow")).To(Equal(http.MethodPost))
		}
	})

	It("opens every subscriptions/listen stream with its acknowledgement", func() {
		// mcp-go v1.2.1 races the acknowledgement against the result and
		// often drops it; listenWriter puts it back. Many tries, so that a
		// lost race shows.
		for i := range 200 {
			id := 100 + i
			w := serve(h, modernRequest(modernBody(id, "subscriptions/listen", `"notifications":{"toolsListChanged":true}`), "subscriptions/listen", ""))
			Expect(w.Code).To(Equal(http.StatusOK), w.Body.String())
			msgs := sseMessages(w)
			Expect(msgs).To(HaveLen(2), "try %d: %s", i, w.Body.String())
			Expect(msgs[0].Method).To(Equal("notifications/subscriptions/acknowledged"), "try %d: %s", i, w.Body.String())
			Expect(msgs[0].Params["_meta"]).To(HaveKeyWithValue("io.modelcontextprotocol/subscriptionId", BeNumerically("==", id)))
			Expect(msgs[0].Params["notifications"]).To(BeEmpty(), "this server establishes no subscription")
			Expect(string(msgs[1].ID)).To(Equal(fmt.Sprint(id)))
			Expect(msgs[1].Result["_meta"]).To(HaveKeyWithValue("io.modelcontextprotocol/subscriptionId", BeNumerically("==", id)))
		}
		// A refused listen is answered as mcp-go answers it.
		w := serve(h, modernRequest(modernBody(1, "subscriptions/listen", `"notifications":{}`), "tools/list", ""))
		Expect(w.Code).To(Equal(http.StatusBadRequest))
		Expect(w.Header().Get("Content-Type")).To(HavePrefix("application/json"))
		Expect(reply(w).Error.Code).To(Equal(-32020))
	})
})
