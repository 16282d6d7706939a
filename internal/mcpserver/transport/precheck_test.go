package transport

import (
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"

	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// heapPeak samples the live heap (objects, including garbage not yet
// collected, which is what the process's RSS follows) every millisecond
// until stop is called, and returns the peak over the starting value.
func heapPeak() (stop func() (peak, base uint64)) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	runtime.GC()
	base := read()
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() (uint64, uint64) {
		close(done)
		<-finished
		return peak.Load() - min(peak.Load(), base), base
	}
}

// vmHWM is the process's peak resident set (kB) so far, from /proc.
func vmHWM() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return -1
}

// hugeExecCall is a sandbox_exec call whose commands array has n
// one-letter elements; nameFirst puts the tool's name before the
// arguments, as clients do, or after them, as an attacker may.
func hugeExecCall(n int, nameFirst bool) string {
	var b strings.Builder
	b.Grow(4*n + 200)
	args := func() {
		b.WriteString(`"arguments":{"container_id":"sbx-1","commands":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"a"`)
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{`)
	if nameFirst {
		b.WriteString(`"name":"sandbox_exec",`)
		args()
	} else {
		args()
		b.WriteString(`,"name":"sandbox_exec"`)
	}
	b.WriteString(`}}`)
	return b.String()
}

var _ = Describe("the HTTP transport bounds a message before decoding it", Label("unit"), func() {
	// The attack of the security review: sandbox_exec calls whose commands
	// arrays hold millions of elements, just under the body cap, sent
	// concurrently by one identity to the real HTTP server. Before the
	// pre-check, mcp-go decoded each into an []any and the tool decoded it
	// again before counting the commands.
	It("keeps the server's memory bounded under concurrent calls with huge arrays", func() {
		s, err := mcpserver.New(mcpserver.Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		h := newTestHTTP(s, HTTPOptions{})
		srv := httptest.NewServer(h)
		DeferCleanup(srv.Close)
		sid := initSession(h, "127.0.0.1:1", aliceToken)
		// Just under DefaultMaxBodyBytes (17 MiB): 4 bytes an element.
		n := int(DefaultMaxBodyBytes/4) - 100
		bodies := []string{hugeExecCall(n, false), hugeExecCall(n, true)}
		Expect(int64(len(bodies[0]))).To(BeNumerically("<", DefaultMaxBodyBytes))
		const concurrent = 4
		hwmBefore := vmHWM()
		stop := heapPeak()
		var wg sync.WaitGroup
		codes := make([]int, concurrent)
		texts := make([]string, concurrent)
		for i := range concurrent {
			wg.Go(func() {
				defer GinkgoRecover()
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(bodies[i%2]))
				req.Host = testHost
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Authorization", "Bearer "+aliceToken)
				req.Header.Set("Mcp-Session-Id", sid)
				req.Header.Set("MCP-Protocol-Version", "2025-06-18")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					// The server answered and closed the connection
					// before the client had sent the whole body: a
					// refusal too.
					texts[i] = err.Error()
					return
				}
				defer resp.Body.Close()
				out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				codes[i], texts[i] = resp.StatusCode, string(out)
			})
		}
		wg.Wait()
		peak, base := stop()
		hwmAfter := vmHWM()
		AddReportEntry("memory", fmt.Sprintf("%d concurrent sandbox_exec calls of %d bytes (%d commands): heap peak +%d MiB over %d MiB; VmHWM %d -> %d MiB",
			concurrent, len(bodies[0]), n, peak>>20, base>>20, hwmBefore>>10, hwmAfter>>10))
		GinkgoWriter.Printf("MEMORY: heap peak +%d MiB over %d MiB; VmHWM %d -> %d MiB\n", peak>>20, base>>20, hwmBefore>>10, hwmAfter>>10)
		for i := range concurrent {
			// Refused either way, and naming why.
			if codes[i] != 0 {
				Expect(codes[i]).To(Or(Equal(http.StatusBadRequest), Equal(http.StatusRequestEntityTooLarge), Equal(http.StatusOK)), texts[i])
				Expect(texts[i]).To(Or(ContainSubstring("commands"), ContainSubstring("limit"), ContainSubstring("JSON values")), "response %d (%d)", i, codes[i])
			}
		}
		// Four bodies of 17 MiB are 68 MiB on the wire; decoding them is
		// what must not multiply that.
		Expect(peak).To(BeNumerically("<", 100<<20), "the server's heap grew by %d MiB under %d concurrent calls", peak>>20, concurrent)
	})
})

var _ = Describe("precheck", Label("unit"), func() {
	limits := messageLimits{MaxBodyBytes: 1 << 20, MaxMessageBytes: 4 << 10}
	big := strings.Repeat("x", 8<<10)
	DescribeTable("refuses a message before decoding it, naming why",
		func(msg string, status int, want string) {
			_, _, perr := precheck(strings.NewReader(msg), limits)
			Expect(perr).To(HaveOccurred())
			Expect(perr.status).To(Equal(status))
			Expect(perr.message).To(ContainSubstring(want))
		},
		Entry("a small tool's call over the message cap, name first",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"commands":["`+big+`"]}}}`, 413, "a call of sandbox_exec is over its limit of 4096 bytes"),
		Entry("a small tool's call over the message cap, name last",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"commands":["`+big+`"]},"name":"sandbox_exec"}}`, 413, "a call of sandbox_exec"),
		Entry("another method over the message cap",
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"`+big+`"}}`, 413, "this initialize message is over its limit"),
		Entry("anything over the body cap",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file","arguments":{"file_contents":"`+strings.Repeat("y", 2<<20)+`"}}}`, 413, "over its limit of 1048576 bytes"),
		Entry("more commands than a call may have",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"commands":[`+strings.Repeat(`"a",`, 100)+`"a"]}}}`, 400, "more than 100 commands"),
		Entry("too many values",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file","arguments":{"x":[`+strings.Repeat(`0,`, MaxJSONValues)+`0]}}}`, 400, "more than 10000 JSON values"),
		Entry("too deep",
			`{"a":`+strings.Repeat("[", 40)+strings.Repeat("]", 40)+`}`, 400, "nested more than 32 levels"),
		Entry("a batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, 400, "one JSON-RPC object"),
		Entry("two messages", `{"jsonrpc":"2.0","id":1,"method":"ping"}{}`, 400, "more follows it"),
		Entry("not JSON", `{"jsonrpc":`, 400, "ends before its JSON does"),
		Entry("bad JSON", `{"jsonrpc":]`, 400, "not valid JSON"),
	)

	It("passes a good message through, read once, with its method, tool and id", func() {
		msg := `{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"write_file","arguments":{"file_contents":"` + big + `","commands":["a"]}}}` + "\n"
		body, info, perr := precheck(strings.NewReader(msg), limits)
		Expect(perr).NotTo(HaveOccurred())
		Expect(string(body)).To(Equal(msg))
		Expect(info).To(Equal(messageInfo{Method: "tools/call", Tool: "write_file", ID: []byte(`"abc"`)}))
	})

	It("answers over HTTP with the status, a JSON-RPC error and the request's id", func() {
		h := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{MaxMessageBytes: 4 << 10})
		sid := initSession(h, "192.0.2.1:1", aliceToken)
		w := serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(
			`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"sleep","arguments":{"x":"`+big+`"}}}`)))
		Expect(w.Code).To(Equal(http.StatusRequestEntityTooLarge))
		Expect(w.Body.String()).To(And(ContainSubstring(`"id":42`), ContainSubstring(`"code":-32600`), ContainSubstring("a call of sleep is over its limit of 4096 bytes")))
		// A 2026 client's Mcp-Name header lets it be refused unread.
		body := &recordingBody{r: strings.NewReader(big)}
		r := mcpRequest("192.0.2.1:1", aliceToken, sid, body)
		r.ContentLength = int64(len(big))
		r.Header.Set("Mcp-Name", "sleep")
		Expect(serve(h, r).Code).To(Equal(http.StatusRequestEntityTooLarge))
		Expect(body.reads.Load()).To(BeZero())
	})

	It("caps the tool calls one identity has in flight with 429, before decoding them", func() {
		started, release := make(chan struct{}, 10), make(chan struct{})
		h := newTestHTTP(testMCP(started, release, 0), HTTPOptions{MaxToolCallsPerIdentity: 2})
		sid := initSession(h, "192.0.2.1:1", aliceToken)
		done := make(chan int, 2)
		for range 2 {
			go func() {
				done <- serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(toolCallJSON("block")))).Code
			}()
		}
		for range 2 {
			Eventually(started).WithTimeout(5 * time.Second).Should(Receive())
		}
		w := serve(h, mcpRequest("192.0.2.2:1", aliceToken, sid, strings.NewReader(toolCallJSON("block"))))
		Expect(w.Code).To(Equal(http.StatusTooManyRequests), w.Body.String())
		Expect(w.Header().Get("Retry-After")).NotTo(BeEmpty())
		Expect(w.Body.String()).To(And(ContainSubstring(`"id":2`), ContainSubstring("2 tool calls in flight"), ContainSubstring("--max-tool-calls-per-identity")))
		// Other messages of the identity (a cancellation, a ping) and
		// another identity's calls go through.
		Expect(serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"ping"}`))).Code).To(Equal(http.StatusOK))
		bsid := initSession(h, "192.0.2.3:1", bobToken)
		bob := make(chan int, 1)
		go func() {
			bob <- serve(h, mcpRequest("192.0.2.3:1", bobToken, bsid, strings.NewReader(toolCallJSON("block")))).Code
		}()
		Eventually(started).WithTimeout(5 * time.Second).Should(Receive())
		close(release)
		for range 2 {
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(Equal(http.StatusOK)))
		}
		Eventually(bob).WithTimeout(5 * time.Second).Should(Receive(Equal(http.StatusOK)))
		// With its calls done, the identity may call again.
		Expect(serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(toolCallJSON("block")))).Code).To(Equal(http.StatusOK))
	})
})

var _ = Describe("the stdio transport bounds a line before decoding it", Label("unit"), func() {
	It("answers a huge or oversized line with an error and keeps serving, in bounded memory", func() {
		s, err := mcpserver.New(mcpserver.Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		DeferCleanup(cancel)
		served := make(chan error, 1)
		go func() { served <- ServeStdio(ctx, s, inR, outW, slog.New(slog.DiscardHandler)) }()
		lines := bufio.NewScanner(outR)
		lines.Buffer(make([]byte, 1<<20), 1<<20)
		next := func() string {
			GinkgoHelper()
			got := make(chan string, 1)
			go func() {
				if lines.Scan() {
					got <- lines.Text()
				}
				close(got)
			}()
			var l string
			Eventually(got).WithTimeout(60 * time.Second).Should(Receive(&l))
			return l
		}
		send := func(msg string) {
			GinkgoHelper()
			go func() { _, _ = io.WriteString(inW, msg+"\n") }()
		}
		send(initJSON)
		Expect(next()).To(ContainSubstring(`"protocolVersion"`))
		huge := []byte(hugeExecCall(int(DefaultMaxBodyBytes/4)-100, false) + "\n")
		stop := heapPeak()
		hwmBefore := vmHWM()
		go func() { _, _ = inW.Write(huge) }()
		first := next()
		peak, base := stop()
		GinkgoWriter.Printf("MEMORY stdio: heap peak +%d MiB over %d MiB; VmHWM %d -> %d MiB\n", peak>>20, base>>20, hwmBefore>>10, vmHWM()>>10)
		Expect(first).To(And(ContainSubstring(`"id":7`), ContainSubstring("error")))
		Expect(peak).To(BeNumerically("<", 100<<20), "the server's heap grew by %d MiB for one line", peak>>20)
		// A line longer than any message may be is skipped, not held.
		send(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"write_file","arguments":{"file_contents":"` + strings.Repeat("x", int(DefaultMaxBodyBytes)+(1<<20)) + `"}}}`)
		Expect(next()).To(ContainSubstring("Request Entity Too Large"))
		send(`{"jsonrpc":"2.0","id":9,"method":"ping"}`)
		Expect(next()).To(ContainSubstring(`"id":9`))
		Expect(inW.Close()).To(Succeed())
		Eventually(served).WithTimeout(10 * time.Second).Should(Receive())
	})
})

var _ = Describe("the HTTP transport's cap on large calls", Label("unit"), func() {
	It("lets one identity have only MaxLargeCallsPerIdentity calls over the message cap in flight", func() {
		started, release := make(chan struct{}, 10), make(chan struct{})
		s := server.NewMCPServer("test", "1", server.WithToolCapabilities(false))
		s.AddTool(mcp.NewTool("write_file"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			started <- struct{}{}
			select {
			case <-release:
				return mcp.NewToolResultText("written"), nil
			case <-ctx.Done():
				return mcp.NewToolResultError("cancelled"), nil
			}
		})
		h := newTestHTTP(s, HTTPOptions{MaxMessageBytes: 4 << 10})
		sid := initSession(h, "192.0.2.1:1", aliceToken)
		large := `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"write_file","arguments":{"file_contents":"` + strings.Repeat("x", 8<<10) + `"}}}`
		done := make(chan int, MaxLargeCallsPerIdentity)
		for range MaxLargeCallsPerIdentity {
			go func() { done <- serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(large))).Code }()
		}
		for range MaxLargeCallsPerIdentity {
			Eventually(started).WithTimeout(5 * time.Second).Should(Receive())
		}
		w := serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(large)))
		Expect(w.Code).To(Equal(http.StatusTooManyRequests), w.Body.String())
		Expect(w.Body.String()).To(And(ContainSubstring(`"id":4`), ContainSubstring("calls larger than 4096 bytes in flight")))
		// A small call of the same identity still goes through.
		small := make(chan int, 1)
		go func() {
			small <- serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(toolCallJSON("write_file")))).Code
		}()
		Eventually(started).WithTimeout(5 * time.Second).Should(Receive())
		close(release)
		Eventually(small).WithTimeout(5 * time.Second).Should(Receive(Equal(http.StatusOK)))
		for range MaxLargeCallsPerIdentity {
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(Equal(http.StatusOK)))
		}
		Expect(serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(large))).Code).To(Equal(http.StatusOK))
	})
})

var _ = Describe("the HTTP transport's cap on bodies being read", Label("unit"), func() {
	It("refuses an identity's request unread while it has as many bodies being read as tool calls allowed", func() {
		h := newTestHTTP(testMCP(nil, nil, 0), HTTPOptions{MaxToolCallsPerIdentity: 2})
		sid := initSession(h, "192.0.2.1:1", aliceToken)
		var writers []*io.PipeWriter
		done := make(chan int, 2)
		for range 2 {
			pr, pw := io.Pipe()
			writers = append(writers, pw)
			go func() { done <- serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, pr)).Code }()
			// The request is being read once its first bytes are taken.
			_, err := pw.Write([]byte(`{"jsonrpc":"2.0",`))
			Expect(err).NotTo(HaveOccurred())
		}
		body := &recordingBody{r: strings.NewReader(toolCallJSON("sleep"))}
		w := serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, body))
		Expect(w.Code).To(Equal(http.StatusTooManyRequests), w.Body.String())
		Expect(w.Body.String()).To(ContainSubstring("2 requests being read"))
		Expect(body.reads.Load()).To(BeZero())
		// Another identity is not affected.
		bsid := initSession(h, "192.0.2.2:1", bobToken)
		Expect(serve(h, mcpRequest("192.0.2.2:1", bobToken, bsid, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"ping"}`))).Code).To(Equal(http.StatusOK))
		for _, pw := range writers {
			_, _ = pw.Write([]byte(`"id":1,"method":"ping"}`))
			Expect(pw.Close()).To(Succeed())
		}
		for range 2 {
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(Equal(http.StatusOK)))
		}
		Expect(serve(h, mcpRequest("192.0.2.1:1", aliceToken, sid, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"ping"}`))).Code).To(Equal(http.StatusOK))
	})
})
