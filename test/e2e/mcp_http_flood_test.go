//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"
)

const (
	// floodRequests unauthenticated POSTs are in flight at once, each
	// with a body of floodBodyBytes (just under the default
	// --max-body-bytes, so a server that reads before it authenticates
	// buffers every one of them).
	floodRequests  = 200
	floodBodyBytes = 16 << 20
	// floodMemoryBudget is how much the server's peak RSS may grow.
	floodMemoryBudget = 64 << 20
	// floodDuration is how long each flooder keeps sending, one request
	// after another.
	floodDuration = 10 * time.Second
)

// procMemory returns a process's peak and current resident set size
// (VmHWM, VmRSS) in bytes.
func procMemory(pid int) (hwm, rss int64) {
	GinkgoHelper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		Expect(err).NotTo(HaveOccurred(), "%s: %q", k, v)
		if k == "VmHWM" {
			hwm = n << 10
		} else {
			rss = n << 10
		}
	}
	Expect(hwm).To(BeNumerically(">", 0))
	return hwm, rss
}

// transportFrom is an HTTP transport whose connections leave from the
// loopback address local, so that the server sees another peer than the
// default 127.0.0.1.
func transportFrom(local string) *http.Transport {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = d.DialContext
	return t
}

// filler is an endless body that costs the client no memory.
type filler struct{}

func (filler) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

var _ = Describe("code-sandbox-mcp over streamable HTTP under an unauthenticated flood", func() {
	It("keeps its memory bounded and an authenticated session working", func(ctx SpecContext) {
		tokens := writeTokenFile(tokenA + " alice")
		// Default limits and the default --max-body-bytes (17 MiB).
		srv := startHTTP("--auth", "token", "--token-file", tokens, "--log-level", "info")
		DeferCleanup(func() { srv.stop() })
		pid := srv.cmd.Process.Pid

		By("opening an authenticated session from another address (127.0.0.2)")
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
		hc := &http.Client{Transport: mcpclient.Bearer{Token: tokenA, Base: transportFrom("127.0.0.2")}}
		session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.url, HTTPClient: hc, MaxRetries: -1}, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(session.Close)
		id := initSandbox(ctx, session, nil)
		exec := func(i int) error {
			want := fmt.Sprintf("during-flood-%d", i)
			res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"container_id": id, "commands": []string{"echo " + want}}})
			switch {
			case err != nil:
				return err
			case res.IsError || !strings.Contains(text(res), want):
				return errors.New(text(res))
			}
			return nil
		}
		Expect(exec(0)).To(Succeed())
		hwmBefore, rssBefore := procMemory(pid)

		By(fmt.Sprintf("flooding it for %s with %d concurrent unauthenticated %d MiB POSTs from 127.0.0.1", floodDuration, floodRequests, floodBodyBytes>>20))
		flood := &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0, ResponseHeaderTimeout: time.Minute}
		floodCtx, cancelFlood := context.WithTimeout(ctx, 3*time.Minute)
		defer cancelFlood()
		var (
			mu      sync.Mutex
			outcome = map[string]int{}
			ready   sync.WaitGroup
			wg      sync.WaitGroup
			start   = make(chan struct{})
			began   time.Time
		)
		var sent atomic.Int64
		for i := range floodRequests {
			ready.Add(1)
			wg.Go(func() {
				defer GinkgoRecover()
				ready.Done()
				<-start
				for n := 0; ; n++ {
					req, err := http.NewRequestWithContext(floodCtx, http.MethodPost, srv.url, io.LimitReader(filler{}, floodBodyBytes))
					Expect(err).NotTo(HaveOccurred())
					req.ContentLength = floodBodyBytes
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					// Half send no token, half a random one.
					if (i+n)%2 == 1 {
						b := make([]byte, 24)
						_, _ = rand.Read(b)
						req.Header.Set("Authorization", "Bearer "+hex.EncodeToString(b))
					}
					key := ""
					resp, err := flood.RoundTrip(req)
					if err != nil {
						// The server answered and closed the connection
						// without reading the body: the client sees its
						// write fail.
						key = "connection closed"
					} else {
						key = resp.Status
						resp.Body.Close()
					}
					sent.Add(1)
					mu.Lock()
					outcome[key]++
					mu.Unlock()
					if floodCtx.Err() != nil || time.Since(began) > floodDuration {
						return
					}
				}
			})
		}
		ready.Wait()

		var calls, failures atomic.Int64
		var firstFailure atomic.Value
		floodDone := make(chan struct{})
		sessionDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(sessionDone)
			for i := 1; ; i++ {
				if err := exec(i); err != nil {
					failures.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				}
				calls.Add(1)
				select {
				case <-floodDone:
					return
				default:
				}
			}
		}()
		began = time.Now()
		close(start)
		wg.Wait()
		took := time.Since(began)
		close(floodDone)
		<-sessionDone
		hwmAfter, rssAfter := procMemory(pid)
		AddReportEntry("flood", fmt.Sprintf("%d flooders, %d POSTs of %d MiB in %s: %v; VmHWM %d -> %d MiB (+%d MiB), VmRSS %d -> %d MiB; %d tool calls during the flood, %d failed",
			floodRequests, sent.Load(), floodBodyBytes>>20, took.Round(time.Millisecond), outcome, hwmBefore>>20, hwmAfter>>20, (hwmAfter-hwmBefore)>>20, rssBefore>>20, rssAfter>>20, calls.Load(), failures.Load()))
		GinkgoWriter.Printf("flood outcome: %v in %s; VmHWM %d -> %d KiB; VmRSS %d -> %d KiB; tool calls %d, failed %d\n",
			outcome, took, hwmBefore>>10, hwmAfter>>10, rssBefore>>10, rssAfter>>10, calls.Load(), failures.Load())

		Expect(outcome).NotTo(HaveKey("200 OK"), "an unauthenticated request was served")
		Expect(hwmAfter-hwmBefore).To(BeNumerically("<", floodMemoryBudget),
			"the server's peak RSS grew by %d MiB under the flood (outcomes %v)", (hwmAfter-hwmBefore)>>20, outcome)
		Expect(failures.Load()).To(BeZero(), "tool calls failed during the flood: %v", firstFailure.Load())
		Expect(calls.Load()).To(BeNumerically(">=", 5), "too few tool calls ran during the flood to tell")

		By("still serving the session afterwards")
		Expect(exec(-1)).To(Succeed())
		Expect(call(ctx, session, "sandbox_stop", map[string]any{"container_id": id}).IsError).To(BeFalse())
	}, SpecTimeout(5*time.Minute))
})
