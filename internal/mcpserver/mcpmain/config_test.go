/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/dockerbackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// The specs below need neither Docker nor an API server: every
// configuration they give is refused before a backend is made.
var _ = Describe("the wiring's configuration", Label(tier.Unit), func() {
	DescribeTable("refuses a configuration with a usage error naming the flag",
		func(want string, m func(*Config)) {
			err := startupError(m, loopbackNoAuth)
			Expect(err).To(HaveOccurred(), "started")
			Expect(isUsageError(err)).To(BeTrue(), "want a usage error, got %v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("an unknown backend", "--backend", func(o *Config) { o.Backend = "podman" }),
		Entry("an idle pause not shorter than the idle timeout", "--idle-pause", func(o *Config) { o.IdlePause, o.IdleTimeout = 30*time.Minute, 30*time.Minute }),
		Entry("a negative idle pause", "--idle-pause", func(o *Config) { o.IdlePause = -time.Second }),
		Entry("per-ServiceAccount namespaces on the docker backend", "--namespace-from-serviceaccount", func(o *Config) { o.NamespaceFromServiceAccount = true }),
		Entry("an exec output budget below the minimum", "budget", func(o *Config) { o.ExecOutputBudget = 1 << 10 }),
		Entry("a host directory that does not exist", `host directory "/nonexistent/projects"`, func(o *Config) { o.HostDirs = []string{"/nonexistent/projects"} }),
		Entry("the kubernetes backend without a kubeconfig", "no usable kubeconfig", func(o *Config) { o.Backend, o.Kubeconfig = "kubernetes", "/nonexistent/kubeconfig" }),
		Entry("an allow-list without --auth kubernetes", "need --auth kubernetes", func(o *Config) { o.AllowUsers = []string{"alice"} }),
		Entry("a TLS certificate without its key", "--tls-cert and --tls-key", func(o *Config) { o.TLSCert = "/nonexistent/cert.pem" }),
		Entry("a negative per-peer limit", "not a negative number", func(o *Config) { o.MaxRequestsPerPeer = -1 }),
		Entry("a zero read timeout", "must be positive", func(o *Config) { o.HTTPReadTimeout = 0 }),
	)

	It("refuses a non-loopback address without --allow-remote, and --auth none off loopback even with it", func() {
		err := startupError(onHTTP("0.0.0.0:0", "none"))
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("--allow-remote"))
		err = startupError(onHTTP("0.0.0.0:0", "none"), func(o *Config) { o.AllowRemote = true })
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("--auth none is only allowed on a loopback address"))
	})

	It("refuses --auth token without a token file, and an unknown --auth", func() {
		err := startupError(onHTTP("127.0.0.1:0", "token"))
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("--token-file"))
		err = startupError(onHTTP("127.0.0.1:0", "password"))
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring(`--auth "password"`))
	})

	It("turns the flags into the tools' policy, with the documented defaults", func() {
		cfg, err := toolConfig(DefaultConfig())
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.DefaultImage).To(Equal(contract.DefaultImage))
		Expect(cfg.MaxNanoCPUs).To(Equal(int64(4e9)))
		Expect(cfg.MaxMemoryBytes).To(Equal(int64(4 << 30)))

		cfg, err = toolConfig(configWith(func(o *Config) {
			o.DefaultImage, o.MaxCPU, o.MaxMemoryBytes, o.OutputLimit, o.AllowedImages = "busybox:1", 1.5, 512<<20, 64<<10, []string{"busybox:*"}
		}))
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.DefaultImage).To(Equal("busybox:1"))
		Expect(cfg.MaxNanoCPUs).To(Equal(int64(1.5e9)))
		Expect(cfg.MaxMemoryBytes).To(Equal(int64(512 << 20)))
		Expect(cfg.OutputLimit).To(Equal(int64(64 << 10)))
		Expect(cfg.AllowedImages).To(Equal([]string{"busybox:*"}))
	})

	It("gives the tools the backend's own defaults to state", func() {
		cfg, err := toolConfig(DefaultConfig())
		Expect(err).NotTo(HaveOccurred())
		Expect([]any{cfg.SandboxNanoCPUs, cfg.SandboxMemoryBytes, cfg.SandboxWorkingDir, cfg.StopGrace}).To(Equal(
			[]any{dockerruntime.DefaultNanoCPUs, dockerruntime.DefaultMemoryBytes, dockerruntime.DefaultWorkingDir, dockerbackend.DefaultStopGrace}))

		cfg, err = toolConfig(configWith(func(o *Config) { o.Backend = "kubernetes" }))
		Expect(err).NotTo(HaveOccurred())
		Expect([]any{cfg.SandboxNanoCPUs, cfg.SandboxMemoryBytes, cfg.SandboxWorkingDir}).To(Equal(
			[]any{sandboxv1alpha1.DefaultNanoCPUs, sandboxv1alpha1.DefaultMemoryBytes, sandboxv1alpha1.DefaultWorkingDir}))
		Expect(cfg.StopGrace).To(BeZero(), "the grace period is the node manager's, unknown to this server")
	})

	It("selects the kubernetes backend's cluster and namespace with kubectl's rules", func() {
		kubeconfig := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
		Expect(os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-a}}]
current-context: x
`), 0o600)).To(Succeed())
		kube, err := loadKube(configWith(func(o *Config) { o.Backend, o.Kubeconfig = "kubernetes", kubeconfig }))
		Expect(err).NotTo(HaveOccurred())
		Expect(kube.config.Host).To(Equal("https://127.0.0.1:1"))
		Expect(kube.namespace).To(Equal("team-a"), "the context's namespace")
		Expect(kube.config.QPS).To(BeNumerically(">", 5), "a busy server must not queue on client-go's default rate")

		kube, err = loadKube(configWith(func(o *Config) { o.Backend, o.Kubeconfig, o.Namespace = "kubernetes", kubeconfig, "team-b" }))
		Expect(err).NotTo(HaveOccurred())
		Expect(kube.namespace).To(Equal("team-b"), "--namespace wins over the context's")
	})

	It("exits 2 on a bad log level or format", func() {
		Expect(Run(configWith(func(o *Config) { o.LogLevel = "loud" }))).To(Equal(ExitUsage))
		Expect(Run(configWith(func(o *Config) { o.LogFormat = "xml" }))).To(Equal(ExitUsage))
	})

	It("prints a client configuration whose stdio form carries the server flags it is given and whose http form the endpoint", func() {
		var out bytes.Buffer
		o := configWith(func(o *Config) { o.HTTPAddr, o.HostDirs = "127.0.0.1:9000", []string{"/srv/projects"} })
		Expect(PrintClientConfig(&out, o, []string{"--allow-host-dir=/srv/projects"})).To(Equal(0))
		var cfg struct {
			Stdio struct {
				MCPServers map[string]struct {
					Command string   `json:"command"`
					Args    []string `json:"args"`
				} `json:"mcpServers"`
			} `json:"stdio"`
			HTTP struct {
				MCPServers map[string]struct {
					URL string `json:"url"`
				} `json:"mcpServers"`
			} `json:"http"`
		}
		Expect(json.Unmarshal(out.Bytes(), &cfg)).To(Succeed(), "stdout is one JSON document: %s", out.String())
		Expect(cfg.Stdio.MCPServers["code-sandbox"].Command).To(BeAnExistingFile())
		Expect(cfg.Stdio.MCPServers["code-sandbox"].Args).To(Equal([]string{"--allow-host-dir=/srv/projects"}))
		Expect(cfg.HTTP.MCPServers["code-sandbox"].URL).To(Equal("http://127.0.0.1:9000/mcp"))

		out.Reset()
		Expect(PrintClientConfig(&out, configWith(func(o *Config) { o.PublicURL = "https://mcp.example.com/mcp" }), nil)).To(Equal(0))
		Expect(json.Unmarshal(out.Bytes(), &cfg)).To(Succeed())
		Expect(cfg.HTTP.MCPServers["code-sandbox"].URL).To(Equal("https://mcp.example.com/mcp"), "--public-url is the endpoint")
		Expect(cfg.Stdio.MCPServers["code-sandbox"].Args).To(BeEmpty())
		Expect(out.String()).To(ContainSubstring(`"Authorization"`), "a static-token client sends a header")

		out.Reset()
		Expect(PrintClientConfig(&out, configWith(func(o *Config) { o.PublicURL, o.Auth = "https://mcp.example.com/mcp", "oidc" }), nil)).To(Equal(0))
		Expect(json.Unmarshal(out.Bytes(), &cfg)).To(Succeed())
		Expect(cfg.HTTP.MCPServers["code-sandbox"].URL).To(Equal("https://mcp.example.com/mcp"))
		Expect(out.String()).NotTo(ContainSubstring(`"Authorization"`), "an OAuth client gets its token itself")
	})
})
