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

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// The specs below need neither Docker nor an API server: every
// configuration they give is refused before a backend is made.
var _ = Describe("the wiring's configuration", Label(tier.Unit), func() {
	// httpNone serves on a loopback port without tokens, so that a
	// refusal is about the flags under test (and stdout stays the test's).
	httpNone := []string{"--http", "127.0.0.1:0", "--auth", "none"}

	DescribeTable("refuses a configuration with a usage error naming the flag",
		func(want string, args ...string) {
			err := startupError(append(args, httpNone...)...)
			Expect(err).To(HaveOccurred(), "started with %q", args)
			Expect(isUsageError(err)).To(BeTrue(), "%q: want a usage error, got %v", args, err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("an unknown backend", "--backend", "--backend", "podman"),
		Entry("an idle pause not shorter than the idle timeout", "--idle-pause", "--idle-pause", "30m", "--idle-timeout", "30m"),
		Entry("a negative idle pause", "--idle-pause", "--idle-pause", "-1s"),
		Entry("per-ServiceAccount namespaces on the docker backend", "--namespace-from-serviceaccount", "--namespace-from-serviceaccount"),
		Entry("an exec output budget below the minimum", "budget", "--exec-output-budget", "1KiB"),
		Entry("a host directory that does not exist", `host directory "/nonexistent/projects"`, "--allow-host-dir", "/nonexistent/projects"),
		Entry("the kubernetes backend without a kubeconfig", "no usable kubeconfig", "--backend", "kubernetes", "--kubeconfig", "/nonexistent/kubeconfig"),
		Entry("an allow-list without --auth kubernetes", "need --auth kubernetes", "--allow-user", "alice"),
		Entry("a TLS certificate without its key", "--tls-cert and --tls-key", "--tls-cert", "/nonexistent/cert.pem"),
		Entry("a negative per-peer limit", "not a negative number", "--max-requests-per-peer", "-1"),
		Entry("a zero read timeout", "must be positive", "--http-read-timeout", "0s"),
	)

	It("refuses a non-loopback address without --allow-remote, and --auth none off loopback even with it", func() {
		err := startupError("--http", "0.0.0.0:0", "--auth", "none")
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("--allow-remote"))
		err = startupError("--http", "0.0.0.0:0", "--allow-remote", "--auth", "none")
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("--auth none is only allowed on a loopback address"))
	})

	It("refuses --auth token without a token file, and an unknown --auth", func() {
		err := startupError("--http", "127.0.0.1:0", "--auth", "token")
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("--token-file"))
		err = startupError("--http", "127.0.0.1:0", "--auth", "password")
		Expect(isUsageError(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring(`--auth "password"`))
	})

	It("turns the flags into the tools' policy, with the documented defaults", func() {
		cfg, err := toolConfig(parseFlags())
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.DefaultImage).To(Equal(contract.DefaultImage))
		Expect(cfg.MaxNanoCPUs).To(Equal(int64(4e9)))
		Expect(cfg.MaxMemoryBytes).To(Equal(int64(4 << 30)))

		cfg, err = toolConfig(parseFlags("--default-image", "busybox:1", "--max-cpu", "1.5", "--max-memory", "512MiB", "--output-limit", "64KiB", "--allowed-image", "busybox:*"))
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.DefaultImage).To(Equal("busybox:1"))
		Expect(cfg.MaxNanoCPUs).To(Equal(int64(1.5e9)))
		Expect(cfg.MaxMemoryBytes).To(Equal(int64(512 << 20)))
		Expect(cfg.OutputLimit).To(Equal(int64(64 << 10)))
		Expect(cfg.AllowedImages).To(Equal([]string{"busybox:*"}))
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
		kube, err := loadKube(parseFlags("--backend", "kubernetes", "--kubeconfig", kubeconfig))
		Expect(err).NotTo(HaveOccurred())
		Expect(kube.config.Host).To(Equal("https://127.0.0.1:1"))
		Expect(kube.namespace).To(Equal("team-a"), "the context's namespace")
		Expect(kube.config.QPS).To(BeNumerically(">", 5), "a busy server must not queue on client-go's default rate")

		kube, err = loadKube(parseFlags("--backend", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", "team-b"))
		Expect(err).NotTo(HaveOccurred())
		Expect(kube.namespace).To(Equal("team-b"), "--namespace wins over the context's")
	})

	It("exits 2 on bad flags, unexpected arguments and a bad log level, 0 on --help", func() {
		Expect(Run([]string{"--no-such-flag"})).To(Equal(exitUsage))
		Expect(Run([]string{"serve"})).To(Equal(exitUsage))
		Expect(Run([]string{"--log-level", "loud"})).To(Equal(exitUsage))
		Expect(Run([]string{"--log-format", "xml"})).To(Equal(exitUsage))
		Expect(Run([]string{"--help"})).To(Equal(0))
	})

	It("prints a client configuration whose stdio form carries the server flags and whose http form the endpoint", func() {
		var out bytes.Buffer
		Expect(printConfig([]string{"--allow-host-dir", "/srv/projects", "--http", "127.0.0.1:9000"}, &out)).To(Equal(0))
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
		Expect(cfg.Stdio.MCPServers["code-sandbox"].Args).To(Equal([]string{"--allow-host-dir=/srv/projects"}), "--http is not a stdio server's flag")
		Expect(cfg.HTTP.MCPServers["code-sandbox"].URL).To(Equal("http://127.0.0.1:9000/mcp"))

		Expect(printConfig([]string{"--no-such-flag"}, &out)).To(Equal(exitUsage))
	})
})
