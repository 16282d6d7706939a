/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"
)

// drainingServer is a server run through serveWith whose "SIGTERM" the
// test sends (cancelling the run's context, as signal.NotifyContext does).
type drainingServer struct {
	url  string
	addr string
	term func()
	// stopped is closed when serveWith has returned err.
	stopped chan struct{}
	err     error
}

func startDrainingServer(mods ...func(*Config)) *drainingServer {
	GinkgoHelper()
	o := configWith(append([]func(*Config){loopbackNoAuth, func(o *Config) {
		o.Backend, o.DefaultImage, o.PullPolicy, o.WarmPool = "docker", testenv.BusyboxImage, "Never", "0"
	}}, mods...)...)
	sigterm := make(chan struct{})
	newCtx := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-sigterm:
				cancel()
			case <-ctx.Done():
			}
		}()
		return ctx, cancel
	}
	urls := make(chan string, 1)
	d := &drainingServer{stopped: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(d.stopped)
		d.err = serveWith(o, testLogger(), newCtx, func(u string) { urls <- u })
	}()
	select {
	case d.url = <-urls:
	case <-d.stopped:
		Fail("the server did not start: " + errString(d.err))
	case <-time.After(time.Minute):
		Fail("the server did not start within a minute")
	}
	u, err := neturl.Parse(d.url)
	Expect(err).NotTo(HaveOccurred())
	d.addr = u.Host
	var once bool
	d.term = func() {
		if !once {
			once = true
			close(sigterm)
		}
	}
	DeferCleanup(func() {
		d.term()
		Eventually(d.stopped).WithTimeout(2 * time.Minute).Should(BeClosed())
	})
	return d
}

func (d *drainingServer) get(ctx context.Context, path string) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr+path, nil)
	if err != nil {
		return nil, "", err
	}
	// A connection of its own, so that each request shows what a new
	// client gets.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body), nil
}

type execOutcome struct {
	res *mcp.CallToolResult
	err error
	at  time.Time
}

// startExec runs commands in container id from its own goroutine.
func startExec(ctx context.Context, s *mcp.ClientSession, id string, commands ...string) <-chan execOutcome {
	out := make(chan execOutcome, 1)
	go func() {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"container_id": id, "commands": commands}})
		out <- execOutcome{res: res, err: err, at: time.Now()}
	}()
	return out
}

// SIGTERM over HTTP drains: readiness fails first while calls are still
// served, then the listener closes (new connections are refused at once),
// and calls in flight finish, up to --shutdown-grace.
var _ = Describe("stopping the HTTP server", Ordered, func() {
	BeforeAll(func() {
		testenv.RequireDocker(testenv.BusyboxImage)
	})

	initSandbox := func(ctx context.Context, s *mcp.ClientSession) string {
		GinkgoHelper()
		res, text := callTool(ctx, s, "sandbox_initialize", map[string]any{})
		Expect(res.IsError).To(BeFalse(), text)
		m, ok := res.StructuredContent.(map[string]any)
		Expect(ok).To(BeTrue(), text)
		id, _ := m["container_id"].(string)
		Expect(id).NotTo(BeEmpty(), text)
		return id
	}

	It("fails readiness at once, keeps serving through --drain-delay, refuses new connections after it, and lets a long exec in flight finish", func(ctx SpecContext) {
		const drainDelay = 2 * time.Second
		srv := startDrainingServer(func(o *Config) { o.DrainDelay = drainDelay })
		resp, body, err := srv.get(ctx, "/readyz")
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK), body)

		s := connect(ctx, srv.url, "")
		id := initSandbox(ctx, s)
		// The exec outlasts the drain delay, so the listener closes while
		// it runs; the marker file tells the test it has started.
		inFlight := startExec(ctx, s, id, "touch /tmp/started && sleep 6 && echo finished-after-sigterm")
		Eventually(func() string {
			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"container_id": id, "commands": []string{"ls /tmp"}}})
			if err != nil {
				return err.Error()
			}
			return mcpclient.Text(res)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(ContainSubstring("started"))

		sigterm := time.Now()
		srv.term()

		By("failing readiness at once, while still serving")
		Eventually(func() int {
			resp, _, err := srv.get(ctx, "/readyz")
			if err != nil {
				return 0
			}
			return resp.StatusCode
		}).WithContext(ctx).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(Equal(http.StatusServiceUnavailable))
		resp, body, err = srv.get(ctx, "/readyz")
		Expect(err).NotTo(HaveOccurred(), "the server stopped accepting connections before --drain-delay was over")
		Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable))
		Expect(body).To(ContainSubstring("shutting down"))
		Expect(time.Since(sigterm)).To(BeNumerically("<", drainDelay), "too slow to check the drain delay")
		// A request that the Service still sends here is served, and its
		// connection is closed after the response, so that the client's
		// next request goes elsewhere.
		res, text := callTool(ctx, s, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo during-drain"}})
		Expect(res.IsError).To(BeFalse(), text)
		Expect(text).To(ContainSubstring("during-drain"))
		resp, _, err = srv.get(ctx, "/healthz")
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Close || strings.EqualFold(resp.Header.Get("Connection"), "close")).To(BeTrue(), "a draining server must close connections after each response")

		By("refusing new connections once the drain delay is over")
		Eventually(func() error {
			c, err := net.DialTimeout("tcp", srv.addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}).WithContext(ctx).WithTimeout(drainDelay + 5*time.Second).WithPolling(100 * time.Millisecond).Should(MatchError(syscall.ECONNREFUSED))
		Expect(time.Since(sigterm)).To(BeNumerically(">=", drainDelay), "the listener closed before --drain-delay was over")

		By("finishing the exec that was in flight")
		var got execOutcome
		Eventually(inFlight).WithTimeout(30 * time.Second).Should(Receive(&got))
		Expect(got.err).NotTo(HaveOccurred(), "the exec in flight failed across the shutdown")
		Expect(got.res.IsError).To(BeFalse(), mcpclient.Text(got.res))
		Expect(mcpclient.Text(got.res)).To(ContainSubstring("finished-after-sigterm"))
		Expect(got.at.Sub(sigterm)).To(BeNumerically(">", drainDelay), "the exec ended before the listener closed: the test proves nothing")

		Eventually(srv.stopped).WithTimeout(time.Minute).Should(BeClosed())
		Expect(srv.err).NotTo(HaveOccurred())
	}, NodeTimeout(3*time.Minute))

	It("cuts a call still running at the end of --shutdown-grace, and stops", func(ctx SpecContext) {
		srv := startDrainingServer(func(o *Config) { o.ShutdownGrace = 2 * time.Second })
		s := connect(ctx, srv.url, "")
		id := initSandbox(ctx, s)
		inFlight := startExec(ctx, s, id, "touch /tmp/started && sleep 120 && echo never")
		Eventually(func() string {
			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"container_id": id, "commands": []string{"ls /tmp"}}})
			if err != nil {
				return err.Error()
			}
			return mcpclient.Text(res)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(ContainSubstring("started"))

		sigterm := time.Now()
		srv.term()
		var got execOutcome
		Eventually(inFlight).WithTimeout(30*time.Second).Should(Receive(&got), "the call hangs past --shutdown-grace")
		// The client sees its connection end: a transport error, or an
		// error result; never "never".
		if got.err == nil {
			Expect(got.res.IsError).To(BeTrue(), mcpclient.Text(got.res))
			Expect(mcpclient.Text(got.res)).NotTo(ContainSubstring("never"))
		}
		GinkgoWriter.Printf("the call cut at the end of the grace: err=%v after %v\n", got.err, got.at.Sub(sigterm))
		Expect(got.at.Sub(sigterm)).To(BeNumerically(">=", 2*time.Second))
		Eventually(srv.stopped).WithTimeout(time.Minute).Should(BeClosed())
		Expect(srv.err).NotTo(HaveOccurred())
		Expect(errors.Is(got.err, context.Canceled)).To(BeFalse(), "the test's own context ended the call")
	}, NodeTimeout(3*time.Minute))

	It("refuses a negative --drain-delay or --shutdown-grace", func() {
		for name, m := range map[string]func(*Config){
			"--drain-delay -1s":    func(o *Config) { o.DrainDelay = -time.Second },
			"--shutdown-grace -1s": func(o *Config) { o.ShutdownGrace = -time.Second },
		} {
			err := startupError(loopbackNoAuth, m)
			Expect(err).To(HaveOccurred(), "started with %s", name)
			Expect(isUsageError(err)).To(BeTrue(), "%s: want a usage error, got %v", name, err)
		}
		Expect(configWith().shutdownGrace()).To(Equal(configWith().MaxCommandTimeout + DefaultShutdownMargin))
	})
})
