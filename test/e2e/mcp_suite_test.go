//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// The MCP end-to-end suite runs the real code-sandbox-mcp binary against
// the node's real Docker Engine and drives it only through an independent
// MCP client (github.com/modelcontextprotocol/go-sdk), raw HTTP and the
// Docker CLI. Like the operator's suite it imports nothing from this
// module. It has its own build tag so that it needs no control plane:
//
//	go test -tags mcp_e2e ./test/e2e/ -count=1 -timeout 20m
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

const (
	mcpImage          = "code-sandbox-test/python:3"
	mcpManagedByLabel = "sandbox.code-sandbox.dev/managed-by=code-sandbox-mcp"
	mcpNodeLabel      = "sandbox.code-sandbox.dev/node"
)

var (
	mcpRepoRoot string
	mcpWorkDir  string
	mcpBinary   string
)

func TestMCP(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "code-sandbox-mcp end-to-end")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	Expect(err).NotTo(HaveOccurred())
	mcpRepoRoot = filepath.Dir(strings.TrimSpace(string(out)))

	Expect(exec.CommandContext(ctx, "docker", "version").Run()).To(Succeed(), "the Docker Engine must be running (make docker-up)")
	Expect(exec.CommandContext(ctx, "docker", "image", "inspect", mcpImage).Run()).To(Succeed(), "run `make test-images`")

	mcpWorkDir, err = os.MkdirTemp("", "code-sandbox-mcp-e2e-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, mcpWorkDir)

	By("building code-sandbox-mcp")
	mcpBinary = filepath.Join(mcpWorkDir, "code-sandbox-mcp")
	build := exec.CommandContext(ctx, "go", "build", "-o", mcpBinary, "./cmd/code-sandbox-mcp")
	build.Dir = mcpRepoRoot
	build.Stderr = GinkgoWriter
	Expect(build.Run()).To(Succeed())
}, NodeTimeout(5*time.Minute))

// syncBuffer collects a process's stderr for assertions while the process
// writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, _ = GinkgoWriter.Write(p)
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var instanceRE = regexp.MustCompile(`instance=(mcp:\S+)`)

// mcpServer is a running code-sandbox-mcp process.
type mcpServer struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	// url is the HTTP endpoint (HTTP mode only).
	url string
	// session is the stdio client's session (stdio mode only).
	session *mcp.ClientSession
	waited  chan error
}

// baseArgs turn the warm pool off: the specs count a run's containers, and
// a pool's paused members are containers of the run too. A spec about the
// pool passes --warm-pool N after them.
func baseArgs(extra ...string) []string {
	return append([]string{"--default-image", mcpImage, "--log-level", "debug", "--warm-pool", "0"}, extra...)
}

func procAttr() *syscall.SysProcAttr {
	// Pdeathsig: a killed test binary must not leave servers running.
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// startStdio starts the server under the go-sdk's CommandTransport.
func startStdio(ctx context.Context, opts *mcp.ClientOptions, args ...string) *mcpServer {
	return startStdioSession(ctx, opts, nil, args...)
}

// startStdioSession is startStdio with session options: their
// ProtocolVersion is how the go-sdk client is made to speak a given MCP
// revision (2026-07-28 and later: server/discover, stateless requests;
// earlier ones: the initialize handshake). Without it, the client asks for
// the newest it knows, 2026-07-28 with go-sdk v1.8.0.
func startStdioSession(ctx context.Context, opts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions, args ...string) *mcpServer {
	cmd := exec.Command(mcpBinary, baseArgs(args...)...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = procAttr()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, opts)
	session, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, sopts)
	Expect(err).NotTo(HaveOccurred(), "stderr:\n%s", stderr.String())
	s := &mcpServer{cmd: cmd, stderr: stderr, session: session}
	Eventually(s.instance).WithTimeout(10 * time.Second).ShouldNot(BeEmpty())
	return s
}

// startHTTP starts the server with --http on a free loopback port and
// waits until it serves.
func startHTTP(args ...string) *mcpServer {
	cmd := exec.Command(mcpBinary, baseArgs(append([]string{"--http", "127.0.0.1:0"}, args...)...)...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = procAttr()
	Expect(cmd.Start()).To(Succeed())
	s := &mcpServer{cmd: cmd, stderr: stderr, waited: make(chan error, 1)}
	go func() { s.waited <- cmd.Wait() }()
	urlRE := regexp.MustCompile(`msg="serving MCP over streamable HTTP" url=(\S+)`)
	Eventually(func() string {
		if m := urlRE.FindStringSubmatch(stderr.String()); m != nil {
			return m[1]
		}
		return ""
	}).WithTimeout(30*time.Second).ShouldNot(BeEmpty(), "server did not start:\n%s", stderr.String())
	s.url = urlRE.FindStringSubmatch(stderr.String())[1]
	return s
}

func (s *mcpServer) instance() string {
	if m := instanceRE.FindStringSubmatch(s.stderr.String()); m != nil {
		return m[1]
	}
	return ""
}

// stop ends the server the way a client does: stdio by closing stdin
// (CommandTransport), HTTP with SIGTERM.
func (s *mcpServer) stop() {
	if s.session != nil {
		_ = s.session.Close()
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	Eventually(s.waited).WithTimeout(time.Minute).Should(Receive())
}

// kill SIGKILLs the server, as a crash would.
func (s *mcpServer) kill() {
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	if s.waited != nil {
		Eventually(s.waited).WithTimeout(time.Minute).Should(Receive())
	} else {
		_ = s.session.Close()
	}
}

// containersOf lists the IDs of the containers a server instance created.
func containersOf(ctx context.Context, instance string) []string {
	out, err := exec.CommandContext(ctx, "docker", "ps", "-aq", "--no-trunc",
		"--filter", "label="+mcpManagedByLabel, "--filter", "label="+mcpNodeLabel+"="+instance).Output()
	Expect(err).NotTo(HaveOccurred())
	return strings.Fields(string(out))
}

// connectHTTP connects a go-sdk client with a bearer token.
func connectHTTP(ctx context.Context, url, token string, opts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, opts)
	hc := &http.Client{Transport: mcpclient.Bearer{Token: token, Base: http.DefaultTransport}}
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, sopts)
}

// The MCP client helpers the suites share (internal/testenv/mcpclient).
var (
	call       = mcpclient.Call
	text       = mcpclient.Text
	structured = mcpclient.Structured
	// initSandbox creates a sandbox and returns its ID.
	initSandbox = mcpclient.Initialize
)

func writeTokenFile(lines ...string) string {
	f := filepath.Join(mcpWorkDir, fmt.Sprintf("tokens-%d", time.Now().UnixNano()))
	Expect(os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600)).To(Succeed())
	return f
}

// readLines returns the non-empty lines of r.
func readLines(b []byte) []string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}
