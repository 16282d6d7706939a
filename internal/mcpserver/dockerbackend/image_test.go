/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerbackend

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// registrySecret is what the fake registry answers with; it must never
// reach a tool result.
const registrySecret = "SECRET-BODY-123"

// fakeRegistry listens on 127.0.0.1, records requests, answers /v2/ as a
// registry does and everything else with a 404 whose registry-style JSON
// error quotes registrySecret (the Docker Engine copies it into its error).
type fakeRegistry struct {
	host string
	mu   sync.Mutex
	reqs []string
}

func (f *fakeRegistry) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reqs...)
}

func startFakeRegistry() *fakeRegistry {
	GinkgoHelper()
	f := &fakeRegistry{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = fmt.Fprintf(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"%s from the host's network"}]}`, registrySecret)
	}))
	DeferCleanup(srv.Close)
	f.host = strings.TrimPrefix(srv.URL, "http://")
	return f
}

// initialize calls sandbox_initialize through a real MCP server on a Docker
// backend whose client has policy, and returns the JSON-RPC response.
func initialize(policy *imagepolicy.Policy, image string) string {
	GinkgoHelper()
	client, err := dockerruntime.New(dockerruntime.Options{ManagedBy: dockerruntime.ManagedByMCP, CallTimeout: 10 * time.Second, PullTimeout: 30 * time.Second, ImagePolicy: policy})
	Expect(err).NotTo(HaveOccurred())
	pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(pctx); err != nil {
		Skip("no Docker Engine: " + err.Error())
	}
	inst, err := CurrentInstance()
	Expect(err).NotTo(HaveOccurred())
	logger := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	b, err := New(Options{Client: client, Instance: inst, Logger: logger})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx context.Context) { _ = b.Close(ctx) })
	srv, err := mcpserver.New(mcpserver.Config{}, b, logger)
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(contract.WithCaller(context.Background(), contract.Caller{ID: "image-test"}), time.Minute)
	defer cancel()
	msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_initialize","arguments":{"image":%q}}}`, image)
	resp := srv.HandleMessage(ctx, json.RawMessage(msg))
	out, err := json.Marshal(resp)
	Expect(err).NotTo(HaveOccurred())
	GinkgoWriter.Printf("tool result: %s\n", out)
	return string(out)
}

var _ = Describe("sandbox_initialize and the image registry policy", Label("docker"), func() {
	It("refuses a loopback registry by default without contacting it", func() {
		reg := startFakeRegistry()
		out := initialize(nil, reg.host+"/team/app:1")
		Expect(out).To(ContainSubstring(`"isError":true`))
		Expect(out).To(ContainSubstring("image registry not allowed"))
		Expect(out).To(ContainSubstring("loopback"))
		Expect(reg.requests()).To(BeEmpty())
	})

	It("pulls from a listed registry and names the failure class, never the registry's response", func() {
		reg := startFakeRegistry()
		policy, err := imagepolicy.New([]string{reg.host}, true)
		Expect(err).NotTo(HaveOccurred())
		out := initialize(policy, reg.host+"/team/app:1")
		Expect(reg.requests()).NotTo(BeEmpty(), "the listed registry was never contacted")
		Expect(out).To(ContainSubstring(`"isError":true`))
		Expect(out).To(ContainSubstring("ImagePullFailed: image not found"))
		Expect(out).NotTo(ContainSubstring(registrySecret))
	})
})
