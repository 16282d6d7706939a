package dockerruntime

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Endpoint is the Docker Engine a client talks to, and where that choice
// came from (for messages).
//
// It is found the way the Docker CLI finds it (docs/mcp.md, "How the Engine
// is found"): an explicit host; else DOCKER_HOST; else the context named by
// DOCKER_CONTEXT or by currentContext in config.json, read from the CLI's
// context store; else the platform's default. This is a small reader of
// the documented store format rather than github.com/docker/cli's context
// store: that package would bring a second Docker API client module
// (github.com/moby/moby/client) next to github.com/docker/docker, plus
// credential helpers and OpenTelemetry, to read two JSON files.
type Endpoint struct {
	// Host is the endpoint, for example unix:///var/run/docker.sock or
	// npipe:////./pipe/docker_engine.
	Host string
	// Source says where Host came from: "--docker-host", "DOCKER_HOST",
	// `context "desktop-linux" (DOCKER_CONTEXT)`, "the default"…
	Source string
	// CAFile, CertFile and KeyFile are a context's TLS material, each set
	// only if the store holds it.
	CAFile, CertFile, KeyFile string
	// Tried lists the default sockets considered before Host, none of
	// which existed; empty unless Host is a default.
	Tried []string
}

// String describes the endpoint for messages.
func (e Endpoint) String() string {
	s := e.Host + " (from " + e.Source
	if len(e.Tried) > 0 {
		s += "; nothing at " + strings.Join(e.Tried, " or ")
	}
	return s + ")"
}

// Default endpoints of the Docker Engine.
const (
	defaultUnixSocket = "/var/run/docker.sock"
	defaultNamedPipe  = "npipe:////./pipe/docker_engine"
)

// endpointEnv is what the search reads from its surroundings; tests give
// their own.
type endpointEnv struct {
	getenv func(string) string
	home   string
	goos   string
	// exists reports whether a socket (or any file) is at path.
	exists func(path string) bool
}

func hostEndpointEnv() endpointEnv {
	home, _ := os.UserHomeDir()
	return endpointEnv{
		getenv: os.Getenv,
		home:   home,
		goos:   runtime.GOOS,
		exists: func(p string) bool { _, err := os.Stat(p); return err == nil },
	}
}

// FindEndpoint finds the Docker Engine as the Docker CLI does; host, if
// set, wins (the --docker-host flag). An error names the context or file
// that could not be used.
func FindEndpoint(host string) (Endpoint, error) {
	return findEndpoint(host, hostEndpointEnv())
}

func findEndpoint(host string, env endpointEnv) (Endpoint, error) {
	if host != "" {
		return Endpoint{Host: host, Source: "--docker-host"}, nil
	}
	// DOCKER_HOST beats any context, as in the CLI; its TLS settings
	// (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) are the Docker client's.
	if h := env.getenv("DOCKER_HOST"); h != "" {
		return Endpoint{Host: h, Source: "DOCKER_HOST"}, nil
	}
	configDir := env.getenv("DOCKER_CONFIG")
	if configDir == "" && env.home != "" {
		configDir = filepath.Join(env.home, ".docker")
	}
	name, source := env.getenv("DOCKER_CONTEXT"), "DOCKER_CONTEXT"
	if name == "" && configDir != "" {
		var err error
		source = "currentContext in " + filepath.Join(configDir, "config.json")
		if name, err = currentContext(configDir); err != nil {
			return Endpoint{}, err
		}
	}
	if name != "" && name != "default" {
		return contextEndpoint(configDir, name, source)
	}
	return defaultEndpoint(env), nil
}

// currentContext reads currentContext from config.json; a missing file
// means none.
func currentContext(configDir string) (string, error) {
	path := filepath.Join(configDir, "config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the Docker CLI's configuration: %w", err)
	}
	var cfg struct {
		CurrentContext string `json:"currentContext"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return "", fmt.Errorf("reading the Docker CLI's configuration %s: %w", path, err)
	}
	return cfg.CurrentContext, nil
}

// contextEndpoint reads context name from the CLI's context store:
// contexts/meta/<sha256(name)>/meta.json holds the endpoint and
// contexts/tls/<sha256(name)>/docker/{ca,cert,key}.pem its TLS material.
func contextEndpoint(configDir, name, source string) (Endpoint, error) {
	sum := sha256.Sum256([]byte(name))
	id := hex.EncodeToString(sum[:])
	what := fmt.Sprintf("Docker context %q (from %s)", name, source)
	metaPath := filepath.Join(configDir, "contexts", "meta", id, "meta.json")
	data, err := os.ReadFile(metaPath)
	if errors.Is(err, fs.ErrNotExist) {
		return Endpoint{}, fmt.Errorf("%s does not exist: no %s (`docker context ls` lists the contexts)", what, metaPath)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("reading %s: %w", what, err)
	}
	var meta struct {
		Name      string `json:"Name"`
		Endpoints map[string]struct {
			Host          string `json:"Host"`
			SkipTLSVerify bool   `json:"SkipTLSVerify"`
		} `json:"Endpoints"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return Endpoint{}, fmt.Errorf("reading %s: %s: %w", what, metaPath, err)
	}
	if meta.Name != name {
		return Endpoint{}, fmt.Errorf("reading %s: %s names the context %q", what, metaPath, meta.Name)
	}
	docker, ok := meta.Endpoints["docker"]
	if !ok || docker.Host == "" {
		return Endpoint{}, fmt.Errorf("%s has no Docker endpoint in %s", what, metaPath)
	}
	if docker.SkipTLSVerify {
		return Endpoint{}, fmt.Errorf("%s skips TLS verification (skip-tls-verify), which this server does not do: give the context a CA, or set DOCKER_HOST", what)
	}
	ep := Endpoint{Host: docker.Host, Source: fmt.Sprintf("context %q (%s)", name, source)}
	tlsDir := filepath.Join(configDir, "contexts", "tls", id, "docker")
	for file, field := range map[string]*string{"ca.pem": &ep.CAFile, "cert.pem": &ep.CertFile, "key.pem": &ep.KeyFile} {
		p := filepath.Join(tlsDir, file)
		if _, err := os.Stat(p); err == nil {
			*field = p
		}
	}
	if (ep.CertFile == "") != (ep.KeyFile == "") {
		return Endpoint{}, fmt.Errorf("%s has only one of cert.pem and key.pem in %s", what, tlsDir)
	}
	return ep, nil
}

// defaultEndpoint is the platform's default Engine: the named pipe on
// Windows; elsewhere /var/run/docker.sock, and on macOS Docker Desktop's
// per-user socket when the system one is absent (Docker Desktop makes the
// latter by default and the former only on request).
func defaultEndpoint(env endpointEnv) Endpoint {
	if env.goos == "windows" {
		return Endpoint{Host: defaultNamedPipe, Source: "the default on Windows"}
	}
	candidates := []string{defaultUnixSocket}
	if env.goos == "darwin" && env.home != "" {
		candidates = append(candidates, filepath.Join(env.home, ".docker", "run", "docker.sock"))
	}
	for _, c := range candidates {
		if env.exists(c) {
			return Endpoint{Host: "unix://" + c, Source: "the default"}
		}
	}
	return Endpoint{Host: "unix://" + defaultUnixSocket, Source: "the default", Tried: candidates}
}
