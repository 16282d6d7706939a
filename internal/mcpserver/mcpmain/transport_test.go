/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// The transport's per-peer and per-identity limits, wired from the flags
// through serveWith to a real TokenReview.
var _ = Describe("the HTTP transport's limits", Ordered, func() {
	var ns string

	BeforeAll(func() {
		ns = cp.NewNamespace("mcp-limits-")
	})

	It("refuses negative limits and non-positive timeouts", func() {
		for name, m := range map[string]func(*Config){
			"--max-requests-per-peer -1":       func(o *Config) { o.MaxRequestsPerPeer = -1 },
			"--auth-failures-per-minute -1":    func(o *Config) { o.AuthFailuresPerMinute = -1 },
			"--max-sessions-per-identity -1":   func(o *Config) { o.MaxSessionsPerIdentity = -1 },
			"--max-tool-calls-per-identity -1": func(o *Config) { o.MaxToolCallsPerIdentity = -1 },
			"--http-read-timeout 0s":           func(o *Config) { o.HTTPReadTimeout = 0 },
			"--http-read-header-timeout -1s":   func(o *Config) { o.HTTPReadHeaderTimeout = -time.Second },
			"--http-idle-timeout 0s":           func(o *Config) { o.HTTPIdleTimeout = 0 },
		} {
			err := startupError(loopbackNoAuth, m)
			Expect(err).To(HaveOccurred(), "started with %s", name)
			Expect(isUsageError(err)).To(BeTrue(), "%s: want a usage error, got %v", name, err)
		}
	})

	It("passes the flags to the transport, 0 disabling a limit", func() {
		o := configWith(loopbackNoAuth, func(o *Config) {
			o.MaxRequestsPerPeer, o.MaxSessionsPerIdentity, o.HTTPReadTimeout = 0, 7, 42*time.Second
		})
		hs, err := setupHTTP(o, nil, testLogger())
		Expect(err).NotTo(HaveOccurred())
		defer hs.listener.Close()
		Expect(hs.opts.MaxRequestsPerPeer).To(BeNumerically("<", 0), "0 must disable the cap")
		Expect(hs.opts.AuthFailuresPerMinute).To(Equal(transport.DefaultAuthFailuresPerMinute))
		Expect(hs.opts.MaxSessionsPerIdentity).To(Equal(7))
		Expect(hs.opts.MaxToolCallsPerIdentity).To(Equal(transport.DefaultMaxToolCallsPerIdentity))
		Expect(hs.opts.MaxMessageBytes).To(Equal(transport.DefaultMaxMessageBytes))
		o = configWith(loopbackNoAuth, func(o *Config) { o.MaxToolCallsPerIdentity, o.MaxMessageBytes = 0, 64<<10 })
		hs2, err := setupHTTP(o, nil, testLogger())
		Expect(err).NotTo(HaveOccurred())
		defer hs2.listener.Close()
		Expect(hs2.opts.MaxToolCallsPerIdentity).To(BeNumerically("<", 0), "0 must disable the cap")
		Expect(hs2.opts.MaxMessageBytes).To(BeEquivalentTo(64 << 10))
		Expect(hs.opts.ReadTimeout).To(Equal(42 * time.Second))
		Expect(hs.opts.ReadHeaderTimeout).To(Equal(transport.DefaultReadHeaderTimeout))
		Expect(hs.opts.IdleTimeout).To(Equal(transport.DefaultIdleTimeout))
	})

	It("limits failed authentications per address before reviewing tokens, but not a token already accepted; and caps sessions per identity", func(ctx SpecContext) {
		aud := auth.DefaultTokenAudience
		alice := saToken(ns, "alice", aud)
		bob := saToken(ns, "bob", aud)
		url := startServer(onHTTP("127.0.0.1:0", "kubernetes"), func(o *Config) {
			o.Backend, o.Kubeconfig, o.DefaultImage, o.PullPolicy = "docker", reviewerKubeconfig, testenv.BusyboxImage, "Never"
			o.AllowGroups = []string{"system:serviceaccounts:" + ns}
			o.AuthFailuresPerMinute, o.MaxSessionsPerIdentity = 3, 2
		})

		code, _, body := initialize(ctx, url, alice)
		Expect(code).To(Equal(http.StatusOK), body)
		codes := map[int]int{}
		for range 10 {
			code, _, _ := initialize(ctx, url, "not-a-token-not-a-token")
			codes[code]++
		}
		Expect(codes).To(Equal(map[int]int{http.StatusUnauthorized: 3, http.StatusTooManyRequests: 7}))
		// alice's token was accepted moments ago: it still works from
		// this address. bob's has never been seen: it is not reviewed.
		code, _, body = initialize(ctx, url, alice)
		Expect(code).To(Equal(http.StatusOK), "a token already accepted was refused from a limited address: %s", body)
		code, _, body = initialize(ctx, url, bob)
		Expect(code).To(Equal(http.StatusTooManyRequests), body)

		// alice now has two sessions open: a third is refused.
		code, _, body = initialize(ctx, url, alice)
		Expect(code).To(Equal(http.StatusTooManyRequests), body)
		Expect(body).To(ContainSubstring("--max-sessions-per-identity"))
	}, NodeTimeout(2*time.Minute))
})
