//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("code-sandbox-mcp lifecycle", func() {
	It("removes its sandboxes when stdin closes", func(ctx SpecContext) {
		srv := startStdio(ctx, nil)
		initSandbox(ctx, srv.session, nil)
		instance := srv.instance()
		Expect(containersOf(ctx, instance)).To(HaveLen(1))
		Expect(srv.session.Close()).To(Succeed())
		Expect(containersOf(ctx, instance)).To(BeEmpty())
	})

	It("removes its sandboxes on SIGTERM", func(ctx SpecContext) {
		tokens := writeTokenFile(tokenA + " alice")
		srv := startHTTP("--auth", "token", "--token-file", tokens)
		s, err := connectHTTP(ctx, srv.url, tokenA, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		initSandbox(ctx, s, nil)
		initSandbox(ctx, s, nil)
		Expect(containersOf(ctx, srv.instance())).To(HaveLen(2))
		srv.stop()
		Expect(containersOf(ctx, srv.instance())).To(BeEmpty())
	})

	It("after a crash, a new server removes the dead server's sandboxes but not a live one's", func(ctx SpecContext) {
		tokens := writeTokenFile(tokenA + " alice")
		live := startHTTP("--auth", "token", "--token-file", tokens)
		DeferCleanup(live.stop)
		ls, err := connectHTTP(ctx, live.url, tokenA, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		liveID := initSandbox(ctx, ls, nil)

		crashed := startHTTP("--auth", "token", "--token-file", tokens)
		cs, err := connectHTTP(ctx, crashed.url, tokenA, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		initSandbox(ctx, cs, nil)
		crashed.kill()
		Expect(containersOf(ctx, crashed.instance())).To(HaveLen(1), "a SIGKILLed server cannot clean up")

		next := startStdio(ctx, nil)
		DeferCleanup(next.stop)
		Eventually(func() []string { return containersOf(ctx, crashed.instance()) }).WithTimeout(30 * time.Second).Should(BeEmpty())
		Expect(containersOf(ctx, live.instance())).To(HaveLen(1))
		res := call(ctx, ls, "sandbox_exec", map[string]any{"container_id": liveID, "commands": []string{"echo still here"}})
		Expect(res.IsError).To(BeFalse(), text(res))
	})

	It("writes nothing but JSON-RPC to stdout over stdio", func(ctx SpecContext) {
		cmd := exec.CommandContext(ctx, mcpBinary, baseArgs()...)
		cmd.SysProcAttr = procAttr()
		stdin, err := cmd.StdinPipe()
		Expect(err).NotTo(HaveOccurred())
		stdoutPipe, err := cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		var stderr syncBuffer
		cmd.Stderr = &stderr
		Expect(cmd.Start()).To(Succeed())

		lines := make(chan string, 1000)
		var raw bytes.Buffer
		go func() {
			defer close(lines)
			r := bufio.NewReader(io.TeeReader(stdoutPipe, &raw))
			for {
				line, err := r.ReadString('\n')
				if line != "" {
					lines <- line
				}
				if err != nil {
					return
				}
			}
		}()
		send := func(v map[string]any) {
			v["jsonrpc"] = "2.0"
			b, err := json.Marshal(v)
			Expect(err).NotTo(HaveOccurred())
			_, err = stdin.Write(append(b, '\n'))
			Expect(err).NotTo(HaveOccurred())
		}
		await := func(id int) map[string]any {
			for {
				var line string
				Eventually(lines).WithTimeout(time.Minute).Should(Receive(&line))
				var msg map[string]any
				Expect(json.Unmarshal([]byte(line), &msg)).To(Succeed(), "stdout line is not JSON: %q", line)
				if msg["id"] == float64(id) {
					return msg
				}
			}
		}
		send(map[string]any{"id": 1, "method": "initialize", "params": map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw", "version": "1"}}})
		await(1)
		send(map[string]any{"method": "notifications/initialized"})
		send(map[string]any{"id": 2, "method": "logging/setLevel", "params": map[string]any{"level": "debug"}})
		await(2)
		send(map[string]any{"id": 3, "method": "tools/call", "params": map[string]any{"name": "sandbox_initialize", "arguments": map[string]any{}}})
		res := await(3)
		id := res["result"].(map[string]any)["structuredContent"].(map[string]any)["container_id"].(string)
		// Binary garbage, NULs and invalid UTF-8 on both streams.
		send(map[string]any{"id": 4, "method": "tools/call", "params": map[string]any{"name": "sandbox_exec", "_meta": map[string]any{"progressToken": 7},
			"arguments": map[string]any{"container_id": id, "commands": []string{"head -c 200000 /dev/urandom; head -c 5000 /dev/urandom >&2; printf '\\377\\000\\n'"}}}})
		await(4)
		send(map[string]any{"id": 5, "method": "tools/call", "params": map[string]any{"name": "sandbox_exec", "arguments": map[string]any{"container_id": fmt.Sprint(id), "commands": []string{"exit 1"}}}})
		await(5)
		Expect(stdin.Close()).To(Succeed())
		Expect(cmd.Wait()).To(Succeed())
		Expect(containersOf(ctx, instanceRE.FindStringSubmatch(stderr.String())[1])).To(BeEmpty())

		Expect(raw.Len()).To(BeNumerically(">", 0))
		for _, line := range readLines(raw.Bytes()) {
			var msg struct {
				JSONRPC string `json:"jsonrpc"`
			}
			Expect(json.Unmarshal([]byte(line), &msg)).To(Succeed(), "stdout line is not JSON: %.200q", line)
			Expect(msg.JSONRPC).To(Equal("2.0"), "stdout line is not JSON-RPC: %.200q", line)
		}
		Expect(stderr.String()).To(ContainSubstring("level=INFO"), "logs go to stderr")
		Expect(strings.Contains(raw.String(), "level=")).To(BeFalse())
	})
})
