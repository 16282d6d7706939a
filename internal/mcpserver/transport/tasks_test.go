/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package transport

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
)

var _ = Describe("taskResultWriter", func() {
	created := func() string {
		b, err := json.Marshal(mcp.JSONRPCResponse{JSONRPC: "2.0", ID: mcp.NewRequestId(1), Result: tasks.Created(tasks.Task{TaskID: "t1.a.b", Status: tasks.StatusWorking})})
		Expect(err).NotTo(HaveOccurred())
		return string(b)
	}
	progress := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1,"message":"tick"}}`

	It("rewrites the response event of an SSE stream and passes the progress before it as it comes", func() {
		rec := httptest.NewRecorder()
		tw := &taskResultWriter{w: rec}
		tw.Header().Set("Content-Type", "text/event-stream")
		tw.WriteHeader(http.StatusOK)
		_, _ = tw.Write([]byte("event: message\ndata: " + progress + "\n\n"))
		Expect(rec.Body.String()).To(ContainSubstring("tick"), "a complete event is not held back")
		// The response arrives in two writes.
		ev := "event: message\ndata: " + created() + "\n\n"
		_, _ = tw.Write([]byte(ev[:20]))
		_, _ = tw.Write([]byte(ev[20:]))
		tw.finish()
		events := strings.Split(strings.TrimSpace(rec.Body.String()), "\n\n")
		Expect(events).To(HaveLen(2))
		data, ok := strings.CutPrefix(strings.Split(events[1], "\n")[1], "data: ")
		Expect(ok).To(BeTrue())
		var resp struct {
			Result map[string]any `json:"result"`
		}
		Expect(json.Unmarshal([]byte(data), &resp)).To(Succeed(), data)
		Expect(resp.Result).To(And(HaveKeyWithValue("resultType", "task"), HaveKeyWithValue("taskId", "t1.a.b")))
		Expect(resp.Result).NotTo(HaveKey("content"))
	})

	It("rewrites a JSON body once it is complete, and leaves any other body as it was", func() {
		for _, c := range []struct {
			body    string
			rewrite bool
		}{{created(), true}, {`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`, false}} {
			rec := httptest.NewRecorder()
			tw := &taskResultWriter{w: rec}
			tw.Header().Set("Content-Type", "application/json")
			tw.Header().Set("Content-Length", "999")
			tw.WriteHeader(http.StatusOK)
			_, _ = tw.Write([]byte(c.body + "\n"))
			Expect(rec.Body.Len()).To(BeZero(), "held until complete")
			tw.finish()
			Expect(rec.Code).To(Equal(http.StatusOK))
			if c.rewrite {
				Expect(rec.Body.String()).To(ContainSubstring(`"resultType":"task"`))
				Expect(rec.Header().Get("Content-Length")).To(BeEmpty())
			} else {
				Expect(rec.Body.String()).To(Equal(c.body + "\n"))
			}
		}
	})
})
