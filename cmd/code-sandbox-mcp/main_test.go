/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/mcpmain"
)

// runWith runs the command line args and returns its exit code and the
// Config it handed to the server (nil when it handed none).
func runWith(t *testing.T, args ...string) (int, *mcpmain.Config, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	var got *mcpmain.Config
	code := run(args, &stdout, &stderr, func(c mcpmain.Config) int {
		got = &c
		return 0
	})
	return code, got, stdout.String() + stderr.String()
}

func TestNoFlagsIsTheDefaultConfig(t *testing.T) {
	code, cfg, out := runWith(t)
	if code != 0 || cfg == nil {
		t.Fatalf("exit %d, config %v: %s", code, cfg, out)
	}
	if want := mcpmain.DefaultConfig(); !reflect.DeepEqual(*cfg, want) {
		t.Errorf("no flags gave\n%+v\nwant DefaultConfig\n%+v", *cfg, want)
	}
}

func TestFlagsFillTheConfig(t *testing.T) {
	code, cfg, out := runWith(t,
		"--backend", "kubernetes", "--namespace", "team-a", "--http", "127.0.0.1:9000", "--auth", "kubernetes",
		"--max-memory", "512MiB", "--max-body-bytes", "1048576", "--output-limit", "64KiB",
		"--allowed-image", "busybox:*,python:*", "--allowed-image", "alpine:*",
		"--token-audience", "https://vault.example", "--token-audience", "other",
		"--warm-pool", " pool-a ", "--idle-pause", "90s", "--max-cpu", "1.5", "--allow-public-registries=false")
	if code != 0 || cfg == nil {
		t.Fatalf("exit %d, config %v: %s", code, cfg, out)
	}
	for name, c := range map[string]struct{ got, want any }{
		"--backend":                 {cfg.Backend, "kubernetes"},
		"--namespace":               {cfg.Namespace, "team-a"},
		"--http":                    {cfg.HTTPAddr, "127.0.0.1:9000"},
		"--auth":                    {cfg.Auth, "kubernetes"},
		"--max-memory":              {cfg.MaxMemoryBytes, int64(512 << 20)},
		"--max-body-bytes":          {cfg.MaxBodyBytes, int64(1 << 20)},
		"--output-limit":            {cfg.OutputLimit, int64(64 << 10)},
		"--allowed-image":           {cfg.AllowedImages, []string{"busybox:*", "python:*", "alpine:*"}},
		"--token-audience":          {cfg.TokenAudiences, []string{"https://vault.example", "other"}},
		"--warm-pool":               {cfg.WarmPool, "pool-a"},
		"--idle-pause":              {cfg.IdlePause, 90 * time.Second},
		"--max-cpu":                 {cfg.MaxCPU, 1.5},
		"--allow-public-registries": {cfg.AllowPublicRegistries, false},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %#v, want %#v", name, c.got, c.want)
		}
	}
	// The default audience is replaced by the first --token-audience, and
	// an empty one leaves none (which the server refuses).
	if _, cfg, _ = runWith(t, "--token-audience="); cfg == nil || len(cfg.TokenAudiences) != 0 {
		t.Errorf("--token-audience= gave %v, want no audience", cfg)
	}
	if _, cfg, _ = runWith(t); cfg == nil || !reflect.DeepEqual(cfg.TokenAudiences, []string{auth.DefaultTokenAudience}) {
		t.Errorf("no --token-audience gave %v", cfg)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"serve"},
		{"--max-memory", "lots"},
		{"--max-cpu", "many"},
		{"config", "--no-such-flag"},
	} {
		code, cfg, out := runWith(t, args...)
		if code != mcpmain.ExitUsage || cfg != nil {
			t.Errorf("%q: exit %d (want %d), server started: %v", args, code, mcpmain.ExitUsage, cfg != nil)
		}
		if out == "" {
			t.Errorf("%q: nothing said about the usage error", args)
		}
	}
	if code, cfg, _ := runWith(t, "--help"); code != 0 || cfg != nil {
		t.Errorf("--help: exit %d, server started: %v", code, cfg != nil)
	}
	if code, cfg, out := runWith(t, "--version"); code != 0 || cfg != nil || !strings.HasPrefix(out, "code-sandbox-mcp ") {
		t.Errorf("--version: exit %d, server started: %v, output %q", code, cfg != nil, out)
	}
	if code, cfg, out := runWith(t, "--max-memory", "lots"); code != mcpmain.ExitUsage || cfg != nil || !strings.Contains(out, "not a size") {
		t.Errorf("--max-memory lots: exit %d, output %q", code, out)
	}
}

func TestConfigSubcommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"config", "--allow-host-dir", "/srv/projects", "--http", "127.0.0.1:9000"}, &stdout, &stderr, nil); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var cfg struct {
		Stdio struct {
			MCPServers map[string]struct {
				Args []string `json:"args"`
			} `json:"mcpServers"`
		} `json:"stdio"`
		HTTP struct {
			MCPServers map[string]struct {
				URL string `json:"url"`
			} `json:"mcpServers"`
		} `json:"http"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &cfg); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, stdout.String())
	}
	if got := cfg.Stdio.MCPServers["code-sandbox"].Args; !reflect.DeepEqual(got, []string{"--allow-host-dir=/srv/projects"}) {
		t.Errorf("stdio args %q: want the server flags given, less --http", got)
	}
	if got := cfg.HTTP.MCPServers["code-sandbox"].URL; got != "http://127.0.0.1:9000/mcp" {
		t.Errorf("http url %q", got)
	}
}

func TestOIDCFlagsFillTheConfig(t *testing.T) {
	code, cfg, out := runWith(t, "--auth", "oidc", "--oidc-issuer-url", "https://login.example/", "--oidc-ca-file", "/ca.crt",
		"--oidc-username-claim", "email", "--oidc-groups-claim", "groups", "--oidc-namespace-claim", "team",
		"--oidc-namespace", "red=team-red", "--oidc-namespace", "blue=team-blue", "--scope", "mcp,openid")
	if code != 0 || cfg == nil {
		t.Fatalf("exit %d, config %v: %s", code, cfg, out)
	}
	want := mcpmain.OIDCConfig{
		IssuerURL: "https://login.example/", CAFile: "/ca.crt", UsernameClaim: "email", UsernamePrefix: auth.DefaultOIDCPrefix,
		GroupsClaim: "groups", GroupsPrefix: auth.DefaultOIDCPrefix, NamespaceClaim: "team",
		Namespaces: map[string]string{"red": "team-red", "blue": "team-blue"},
	}
	if !reflect.DeepEqual(cfg.OIDC, want) {
		t.Errorf("got %+v, want %+v", cfg.OIDC, want)
	}
	if !reflect.DeepEqual(cfg.ScopesSupported, []string{"mcp", "openid"}) {
		t.Errorf("--scope gave %v", cfg.ScopesSupported)
	}
	for _, bad := range []string{"red", "=team-red", "red=", "red=a,red=b"} {
		args := []string{}
		for _, kv := range strings.Split(bad, ",") {
			args = append(args, "--oidc-namespace", kv)
		}
		if code, _, out := runWith(t, args...); code == 0 {
			t.Errorf("--oidc-namespace %s was accepted: %s", bad, out)
		}
	}
}
