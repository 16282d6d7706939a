/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package release tests releases end to end (make test-release): it builds
// releases of this host's target with hack/release and a throwaway key
// (pinned into the binaries with the test-only ldflags override), checks
// that a second build gives the same bytes, and serves them over HTTP to
// the real binary's `update` and to hack/install.sh, tampered in every way
// the update model must refuse.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/code-sandbox/code-sandbox-operator/internal/release"
)

const (
	repoRoot = "../.."
	epoch    = "1700000000"
	mcp      = "code-sandbox-mcp"
	kubectl  = "kubectl-sandbox"
	keyVar   = "github.com/code-sandbox/code-sandbox-operator/internal/release.publicKeyOverride"
)

var goos, goarch = runtime.GOOS, runtime.GOARCH

// releases are the test's releases: their files by version and name, and
// the code-sandbox-mcp binary of each.
type releases struct {
	dir      string
	files    map[string]map[string][]byte
	binaries map[string][]byte
	// wrongSig is v0.0.2's checksums.txt signed with another key.
	wrongSig []byte
}

var (
	buildOnce sync.Once
	built     *releases
	buildErr  error
)

func run(dir string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// buildReleases makes v0.0.1 (code-sandbox-mcp) and v0.0.2 (both binaries)
// for this host, and v0.0.2 a second time to compare the bytes.
func buildReleases(t *testing.T) *releases {
	t.Helper()
	if testing.Short() {
		t.Skip("builds releases: not in -short")
	}
	buildOnce.Do(func() {
		buildErr = func() error {
			dir, err := os.MkdirTemp("", "release-test-")
			if err != nil {
				return err
			}
			tool := filepath.Join(dir, "release-tool")
			if out, err := run(repoRoot, "go", "build", "-o", tool, "./hack/release"); err != nil {
				return fmt.Errorf("go build ./hack/release: %v: %s", err, out)
			}
			key := filepath.Join(dir, "test.key")
			pubLine, err := run(repoRoot, tool, "keygen", "--out", key)
			if err != nil {
				return fmt.Errorf("keygen: %v: %s", err, pubLine)
			}
			pub := strings.TrimSpace(pubLine)
			r := &releases{dir: dir, files: map[string]map[string][]byte{}, binaries: map[string][]byte{}}
			for _, b := range []struct{ version, out, binaries string }{
				{"v0.0.1", "v0.0.1", mcp},
				{"v0.0.2", "v0.0.2", mcp + " " + kubectl},
				{"v0.0.2", "v0.0.2-again", mcp + " " + kubectl},
			} {
				start := time.Now()
				out, err := run(repoRoot, tool, "--version", b.version, "--out", filepath.Join(dir, b.out), "--key", key,
					"--targets", "host", "--binaries", b.binaries, "--source-date-epoch", epoch, "--extra-ldflags", "-X "+keyVar+"="+pub)
				if err != nil {
					return fmt.Errorf("release %s: %v: %s", b.version, err, out)
				}
				t.Logf("release %s (%s) for %s/%s: %s", b.version, b.binaries, goos, goarch, time.Since(start).Round(time.Second))
			}
			for _, v := range []string{"v0.0.1", "v0.0.2", "v0.0.2-again"} {
				r.files[v] = map[string][]byte{}
				entries, err := os.ReadDir(filepath.Join(dir, v))
				if err != nil {
					return err
				}
				for _, e := range entries {
					data, err := os.ReadFile(filepath.Join(dir, v, e.Name()))
					if err != nil {
						return err
					}
					r.files[v][e.Name()] = data
				}
			}
			for _, v := range []string{"v0.0.1", "v0.0.2"} {
				bin, err := fromArchive(r.files[v][release.ArchiveName(mcp, v, goos, goarch)], mcp)
				if err != nil {
					return err
				}
				r.binaries[v] = bin
			}
			_, other, err := minisign.GenerateKey(nil)
			if err != nil {
				return err
			}
			r.wrongSig = release.SignChecksums(other, r.files["v0.0.2"][release.ChecksumsName], "v0.0.2", 1700000000)
			built = r
			return nil
		}()
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func fromArchive(data []byte, name string) ([]byte, error) {
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("%s not in the archive: %w", name, err)
		}
		if hdr.Name == name {
			return io.ReadAll(tr)
		}
	}
}

// server serves the releases in index (GitHub's shape) and their files,
// tampered as mode says.
type server struct {
	*httptest.Server
	r     *releases
	mu    sync.Mutex
	mode  string
	index []string
	sig   []byte // served as the signature in mode "sig"
}

func newServer(t *testing.T, r *releases) *server {
	s := &server{r: r, index: []string{"v0.0.1", "v0.0.2"}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

func (s *server) set(mode string, index ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode, s.index = mode, index
}

func (s *server) handle(w http.ResponseWriter, req *http.Request) {
	s.mu.Lock()
	mode, index, sig := s.mode, s.index, s.sig
	s.mu.Unlock()
	switch {
	case req.URL.Path == "/releases":
		type asset struct {
			Name string `json:"name"`
			URL  string `json:"browser_download_url"`
		}
		var rels []map[string]any
		for _, v := range index {
			var assets []asset
			for name := range s.r.files[v] {
				assets = append(assets, asset{name, s.URL + "/download/" + v + "/" + name})
			}
			rels = append(rels, map[string]any{"tag_name": v, "draft": false, "prerelease": false, "assets": assets})
		}
		_ = json.NewEncoder(w).Encode(rels)
	case req.URL.Path == "/latest":
		http.Redirect(w, req, "/tag/"+index[len(index)-1], http.StatusFound)
	case strings.HasPrefix(req.URL.Path, "/tag/"):
		_, _ = w.Write([]byte("release page"))
	case strings.HasPrefix(req.URL.Path, "/download/"):
		v, name, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/download/"), "/")
		data, ok := s.r.files[v][name]
		if !ok {
			http.NotFound(w, req)
			return
		}
		isArchive := strings.HasSuffix(name, ".tar.gz") || strings.HasSuffix(name, ".zip")
		switch {
		case (mode == "archive" || mode == "checksums") && isArchive:
			data = tamper(data)
		case mode == "checksums" && name == release.ChecksumsName:
			// The list of the tampered archives' own checksums: only the
			// signature can tell.
			sums := map[string]string{}
			for n, d := range s.r.files[v] {
				if strings.HasSuffix(n, ".tar.gz") || strings.HasSuffix(n, ".zip") {
					h := sha256.Sum256(tamper(d))
					sums[n] = hex.EncodeToString(h[:])
				}
			}
			data = release.FormatChecksums(sums)
		case mode == "wrongkey" && name == release.SignatureName:
			data = s.r.wrongSig
		case mode == "sig" && name == release.SignatureName:
			data = sig
		case mode == "truncate" && isArchive:
			w.Header().Set("Content-Length", fmt.Sprint(len(data)))
			_, _ = w.Write(data[:len(data)/3])
			return // the server closes the connection short of Content-Length
		}
		_, _ = w.Write(data)
	default:
		http.NotFound(w, req)
	}
}

// tamper flips a bit in the middle of data.
func tamper(data []byte) []byte {
	data = bytes.Clone(data)
	data[len(data)/2] ^= 0x40
	return data
}

// installed is a code-sandbox-mcp in a directory of its own.
type installed struct {
	t   *testing.T
	exe string
	env []string
}

func install(t *testing.T, bin []byte) *installed {
	t.Helper()
	dir := t.TempDir()
	exe := filepath.Join(dir, "bin", mcp)
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_SERVICE_HOST=") {
			env = append(env, kv)
		}
	}
	env = append(env, "XDG_CACHE_HOME="+filepath.Join(dir, "cache"), "HOME="+filepath.Join(dir, "home"))
	return &installed{t: t, exe: exe, env: env}
}

// run runs the installed binary; stdout and stderr apart.
func (in *installed) run(args ...string) (int, string, string) {
	in.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, in.exe, args...)
	cmd.Env = in.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return code, stdout.String(), stderr.String()
}

func (in *installed) bytes() []byte {
	in.t.Helper()
	b, err := os.ReadFile(in.exe)
	if err != nil {
		in.t.Fatal(err)
	}
	return b
}

func (in *installed) dirNames() []string {
	in.t.Helper()
	entries, err := os.ReadDir(filepath.Dir(in.exe))
	if err != nil {
		in.t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != nil {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func TestReleaseIsReproducible(t *testing.T) {
	r := buildReleases(t)
	a, b := r.files["v0.0.2"], r.files["v0.0.2-again"]
	if len(a) != 4 || len(a) != len(b) {
		t.Fatalf("release files: %d and %d, want 4 (two archives, checksums.txt, its signature)", len(a), len(b))
	}
	for name, data := range a {
		if !bytes.Equal(data, b[name]) {
			t.Errorf("%s differs between two builds of the same source", name)
		}
	}
	sig := string(a[release.SignatureName])
	if !strings.Contains(sig, "timestamp:"+epoch+"\tfile:checksums.txt\tversion:v0.0.2") {
		t.Errorf("signature's trusted comment: %s", sig)
	}
}

func TestUpdateWithTheRealBinary(t *testing.T) {
	r := buildReleases(t)
	srv := newServer(t, r)
	update := func(in *installed, extra ...string) (int, string, string) {
		return in.run(append([]string{"update", "--index-url", srv.URL + "/releases", "--allow-update-in-container"}, extra...)...)
	}

	t.Run("update and rollback", func(t *testing.T) {
		srv.set("", "v0.0.1", "v0.0.2")
		in := install(t, r.binaries["v0.0.1"])
		if code, out, errOut := in.run("version"); code != 0 || !strings.HasPrefix(out, mcp+" v0.0.1\n") {
			t.Fatalf("version: %d %q %s", code, out, errOut)
		}
		code, out, errOut := update(in, "--check")
		if code != 0 || out != "" || !strings.Contains(errOut, "v0.0.2 is available") {
			t.Errorf("update --check: exit %d, stdout %q, stderr %s", code, out, errOut)
		}
		code, out, errOut = update(in)
		if code != 0 || out != "" {
			t.Fatalf("update: exit %d, stdout %q, stderr %s", code, out, errOut)
		}
		if !bytes.Equal(in.bytes(), r.binaries["v0.0.2"]) {
			t.Fatal("after update the binary is not v0.0.2's")
		}
		if _, out, _ := in.run("version"); !strings.HasPrefix(out, mcp+" v0.0.2\n") {
			t.Errorf("version after update: %q", out)
		}
		code, out, errOut = update(in, "--rollback")
		if code != 0 || out != "" || !bytes.Equal(in.bytes(), r.binaries["v0.0.1"]) {
			t.Fatalf("rollback: exit %d, stdout %q, stderr %s; binary is v0.0.1's: %v", code, out, errOut, bytes.Equal(in.bytes(), r.binaries["v0.0.1"]))
		}
		if names := in.dirNames(); !slices.Equal(names, []string{mcp, mcp + ".old"}) {
			t.Errorf("beside the binary: %v", names)
		}
	})

	for _, c := range []struct {
		name, mode string
		index      []string
		installed  string
		want       string
	}{
		{"tampered archive", "archive", []string{"v0.0.1", "v0.0.2"}, "v0.0.1", "does not match"},
		{"tampered checksums.txt", "checksums", []string{"v0.0.1", "v0.0.2"}, "v0.0.1", "signature verification failed"},
		{"wrong key", "wrongkey", []string{"v0.0.1", "v0.0.2"}, "v0.0.1", "this binary trusts only"},
		{"downgrade", "", []string{"v0.0.1"}, "v0.0.2", "downgrade refused"},
		{"truncated download", "truncate", []string{"v0.0.1", "v0.0.2"}, "v0.0.1", "unexpected EOF"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv.set(c.mode, c.index...)
			in := install(t, r.binaries[c.installed])
			code, out, errOut := update(in)
			if code == 0 || out != "" || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want a refusal with %q", code, out, errOut, c.want)
			}
			if !bytes.Equal(in.bytes(), r.binaries[c.installed]) {
				t.Error("a refused update changed the installed binary")
			}
			if names := in.dirNames(); !slices.Equal(names, []string{mcp}) {
				t.Errorf("a refused update left %v", names)
			}
		})
	}

	t.Run("downgrade when allowed", func(t *testing.T) {
		srv.set("", "v0.0.1")
		in := install(t, r.binaries["v0.0.2"])
		if code, out, errOut := update(in, "--allow-downgrade"); code != 0 || out != "" || !bytes.Equal(in.bytes(), r.binaries["v0.0.1"]) {
			t.Errorf("exit %d, stdout %q, stderr %s", code, out, errOut)
		}
	})

	t.Run("refused in a Kubernetes pod", func(t *testing.T) {
		srv.set("", "v0.0.1", "v0.0.2")
		in := install(t, r.binaries["v0.0.1"])
		in.env = append(in.env, "KUBERNETES_SERVICE_HOST=10.0.0.1")
		if code, _, errOut := update(in); code != 2 || !strings.Contains(errOut, "Kubernetes pod") {
			t.Errorf("exit %d, stderr %s", code, errOut)
		}
		if !bytes.Equal(in.bytes(), r.binaries["v0.0.1"]) {
			t.Error("changed")
		}
	})

	t.Run("version --check-updates", func(t *testing.T) {
		srv.set("", "v0.0.1", "v0.0.2")
		in := install(t, r.binaries["v0.0.1"])
		code, out, errOut := in.run("version", "--check-updates", "--update-index-url", srv.URL+"/releases", "--allow-update-in-container")
		if code != 0 || !strings.Contains(out, "v0.0.2 is available") {
			t.Errorf("exit %d, stdout %q, stderr %s", code, out, errOut)
		}
	})
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStdioSessionWithCheckUpdates: over stdio with --check-updates, the
// notice goes to stderr and stdout carries JSON-RPC only.
func TestStdioSessionWithCheckUpdates(t *testing.T) {
	r := buildReleases(t)
	srv := newServer(t, r)
	in := install(t, r.binaries["v0.0.1"])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// No warm pool: the session needs no sandbox.
	cmd := exec.CommandContext(ctx, in.exe, "--warm-pool", "0", "--check-updates", "--update-index-url", srv.URL+"/releases", "--allow-update-in-container")
	cmd.Env = in.env
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdoutPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdoutPipe)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	send := func(msg string) {
		if _, err := io.WriteString(stdin, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	waitFor := func(id string) {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("stdout closed before the answer to %s; stderr: %s", id, stderr.String())
				}
				got = append(got, l)
				if strings.Contains(l, `"id":`+id) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no answer to %s; stderr: %s", id, stderr.String())
			}
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"release-test","version":"1"}}}`)
	waitFor("1")
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	waitFor("2")
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(stderr.String(), "v0.0.2 is available") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	waitFor("3")
	stdin.Close()
	for l := range lines {
		got = append(got, l)
	}
	_ = cmd.Wait()
	if !strings.Contains(stderr.String(), "v0.0.2 is available") {
		t.Errorf("no update notice on stderr: %s", stderr.String())
	}
	for _, l := range got {
		var msg map[string]any
		if err := json.Unmarshal([]byte(l), &msg); err != nil || msg["jsonrpc"] != "2.0" {
			t.Errorf("stdout line is not JSON-RPC: %q", l)
		}
	}
	if len(got) < 3 {
		t.Errorf("stdout: %d lines, want the three answers", len(got))
	}
}

// TestInstallScript runs hack/install.sh against the server: a good
// release installs, a tampered one installs nothing.
func TestInstallScript(t *testing.T) {
	r := buildReleases(t)
	srv := newServer(t, r)
	verifiers := []string{"openssl"}
	if _, err := exec.LookPath("minisign"); err == nil {
		verifiers = append(verifiers, "minisign")
	} else {
		t.Log("minisign is not installed: only the openssl verifier is tested")
	}
	script, err := filepath.Abs(filepath.Join(repoRoot, "hack", "install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	pub := ""
	if k, err := os.ReadFile(filepath.Join(r.dir, "test.key.pub")); err == nil {
		lines := strings.Split(strings.TrimSpace(string(k)), "\n")
		pub = lines[len(lines)-1]
	}
	// The script pins the project key; the test's copy pins the test key.
	body, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := release.TrustedKey()
	pinned, _ := k.MarshalText()
	pinnedLine := strings.Split(strings.TrimSpace(string(pinned)), "\n")
	if !bytes.Contains(body, []byte(`PUBKEY="`+pinnedLine[len(pinnedLine)-1]+`"`)) {
		t.Fatalf("hack/install.sh does not pin internal/release.PublicKey %s", pinnedLine[len(pinnedLine)-1])
	}
	testScript := filepath.Join(t.TempDir(), "install.sh")
	if err := os.WriteFile(testScript, bytes.Replace(body, []byte(pinnedLine[len(pinnedLine)-1]), []byte(pub), 1), 0o755); err != nil {
		t.Fatal(err)
	}
	runScript := func(t *testing.T, verifier string, args ...string) (string, string, error) {
		dir := filepath.Join(t.TempDir(), "bin")
		cmd := exec.Command("sh", append([]string{testScript, "--dir", dir, "--base-url", srv.URL + "/download"}, args...)...)
		cmd.Env = append(os.Environ(), "CODE_SANDBOX_VERIFIER="+verifier, "CODE_SANDBOX_LATEST_URL="+srv.URL+"/latest")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return dir, out.String(), err
	}
	for _, verifier := range verifiers {
		t.Run(verifier+" good", func(t *testing.T) {
			srv.set("", "v0.0.1", "v0.0.2")
			dir, out, err := runScript(t, verifier) // the latest: v0.0.2
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			got, _ := os.ReadFile(filepath.Join(dir, mcp))
			if !bytes.Equal(got, r.binaries["v0.0.2"]) {
				t.Errorf("installed code-sandbox-mcp is not v0.0.2's: %s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, kubectl)); err != nil {
				t.Errorf("kubectl-sandbox: %v", err)
			}
			if !strings.Contains(out, `"mcpServers"`) && !strings.Contains(out, `"command"`) {
				t.Errorf("no client configuration printed: %s", out)
			}
		})
		for _, mode := range []string{"archive", "checksums", "wrongkey"} {
			t.Run(verifier+" "+mode, func(t *testing.T) {
				srv.set(mode, "v0.0.1", "v0.0.2")
				dir, out, err := runScript(t, verifier, "--version", "v0.0.2")
				if err == nil || !strings.Contains(out, "nothing installed") {
					t.Errorf("tampered (%s) release: %v: %s", mode, err, out)
				}
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("a refused install left %v", entries)
				}
			})
		}
	}
	t.Run("old signature for a newer version", func(t *testing.T) {
		// v0.0.2's checksums signed as v0.0.1's: the trusted comment names v0.0.1.
		priv, err := os.ReadFile(filepath.Join(r.dir, "test.key"))
		if err != nil {
			t.Fatal(err)
		}
		var key minisign.PrivateKey
		if err := key.UnmarshalText(priv); err != nil {
			t.Fatal(err)
		}
		srv.mu.Lock()
		srv.sig = release.SignChecksums(key, r.files["v0.0.2"][release.ChecksumsName], "v0.0.1", 1700000000)
		srv.mu.Unlock()
		srv.set("sig", "v0.0.1", "v0.0.2")
		dir, out, err := runScript(t, "openssl", "--version", "v0.0.2")
		if err == nil || !strings.Contains(out, "not v0.0.2") {
			t.Errorf("%v: %s", err, out)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("left %v", entries)
		}
	})
}
