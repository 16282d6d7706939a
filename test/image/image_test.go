//go:build image

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package image tests the manager image itself (Dockerfile; its iptables
// is staged by hack/image-iptables.sh): that the iptables it ships runs in
// a container the way the manager DaemonSet runs it (root, host network,
// NET_ADMIN), sees Docker's rules on this host, loads the extension modules
// the egress rules use and writes rules, and that the manager in it picks
// the backend holding Docker's DOCKER-USER chain. Like test/e2e it imports
// nothing from this module; it drives the image with the Docker CLI.
//
// Run it as root with `make test-image` (which builds the image first), or
// against an existing image: IMG=... go test -tags image ./test/image/ -count=1 -v
package image

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func image() string {
	if img := os.Getenv("IMG"); img != "" {
		return img
	}
	return "code-sandbox-operator/manager:latest"
}

type result struct {
	stdout, stderr string
	code           int
}

func run(t *testing.T, stdin string, name string, args ...string) result {
	t.Helper()
	cmd := exec.Command(name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return r
}

// inImage runs entrypoint in the image as the manager DaemonSet runs it
// (config/manager/manager.yaml): root, the node's network namespace, all
// capabilities dropped but NET_ADMIN and NET_RAW, no privilege escalation,
// a read-only root file system, the node's /run/xtables.lock.
func inImage(t *testing.T, stdin, entrypoint string, args ...string) result {
	t.Helper()
	dockerArgs := []string{"run", "--rm", "--network", "host", "--user", "0:0",
		"--cap-drop", "ALL", "--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW",
		"--security-opt", "no-new-privileges", "--read-only", "--entrypoint", entrypoint}
	if fi, err := os.Stat("/run/xtables.lock"); err == nil && fi.Mode().IsRegular() {
		// --mount, unlike -v, never creates a missing source (as a directory).
		dockerArgs = append(dockerArgs, "--mount", "type=bind,source=/run/xtables.lock,target=/run/xtables.lock")
	}
	if stdin != "" {
		dockerArgs = append(dockerArgs, "-i")
	}
	dockerArgs = append(dockerArgs, image())
	return run(t, stdin, "docker", append(dockerArgs, args...)...)
}

func must(t *testing.T, r result, what string) string {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// hostMode is the backend ("nft" or "legacy") whose ruleset holds Docker's
// DOCKER-USER chain on this host, as the host's own iptables sees it.
func hostMode(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (the host's iptables-save)")
	}
	var found []string
	for _, mode := range []string{"nft", "legacy"} {
		if _, err := exec.LookPath("iptables-" + mode + "-save"); err != nil {
			continue
		}
		// No "-t filter": for legacy that would create the table.
		if r := run(t, "", "iptables-"+mode+"-save"); r.code == 0 && strings.Contains(r.stdout, "\n:DOCKER-USER ") {
			found = append(found, mode)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want Docker's DOCKER-USER chain in exactly one of the host's rulesets (iptables-nft-save, iptables-legacy-save), found it in %v; is Docker running?", found)
	}
	t.Logf("Docker's DOCKER-USER chain is in this host's %s ruleset", found[0])
	return found[0]
}

func TestMain(m *testing.M) {
	if err := exec.Command("docker", "image", "inspect", image()).Run(); err != nil {
		os.Stderr.WriteString("image " + image() + " not found: build it with make docker-build (or run make test-image)\n")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestImageContents: the manager, both iptables variants, no shell.
func TestImageContents(t *testing.T) {
	id := strings.TrimSpace(must(t, run(t, "", "docker", "create", image()), "docker create"))
	t.Cleanup(func() { run(t, "", "docker", "rm", id) })
	export := exec.Command("docker", "export", id)
	list := exec.Command("tar", "-t")
	pipe, err := export.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	list.Stdin = pipe
	var out bytes.Buffer
	list.Stdout = &out
	if err := list.Start(); err != nil {
		t.Fatal(err)
	}
	if err := export.Run(); err != nil {
		t.Fatal(err)
	}
	if err := list.Wait(); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, f := range strings.Split(out.String(), "\n") {
		files[strings.TrimSuffix(strings.TrimPrefix(f, "./"), "/")] = true
	}
	for _, f := range []string{"manager", "usr/sbin/xtables-nft-multi", "usr/sbin/xtables-legacy-multi",
		"usr/sbin/iptables-nft", "usr/sbin/iptables-nft-save", "usr/sbin/iptables-nft-restore",
		"usr/sbin/ip6tables-nft", "usr/sbin/ip6tables-nft-save", "usr/sbin/ip6tables-nft-restore",
		"usr/sbin/iptables-legacy", "usr/sbin/iptables-legacy-save", "usr/sbin/iptables-legacy-restore",
		"usr/sbin/ip6tables-legacy", "usr/sbin/ip6tables-legacy-save", "usr/sbin/ip6tables-legacy-restore",
		"run"} {
		if !files[f] {
			t.Errorf("the image lacks /%s", f)
		}
	}
	for _, f := range []string{"bin/sh", "usr/bin/sh", "bin/bash", "usr/sbin/iptables", "usr/sbin/ip6tables"} {
		if files[f] {
			t.Errorf("the image has /%s", f)
		}
	}
	t.Logf("%d entries in the image", len(files))
}

// TestIptablesVariantsRun: both binaries start (loader, libraries) and are
// the backend their name says.
func TestIptablesVariantsRun(t *testing.T) {
	for bin, want := range map[string]string{
		"iptables-nft": "(nf_tables)", "ip6tables-nft": "(nf_tables)",
		"iptables-legacy": "(legacy)", "ip6tables-legacy": "(legacy)",
	} {
		out := must(t, inImage(t, "", "/usr/sbin/"+bin, "-V"), bin+" -V")
		if !strings.Contains(out, want) {
			t.Errorf("%s -V: %q, want %s", bin, out, want)
		}
	}
}

// TestSaveListsDockerUser: the image's iptables-<mode>-save, for the
// backend Docker uses on this host, lists Docker's DOCKER-USER chain.
func TestSaveListsDockerUser(t *testing.T) {
	mode := hostMode(t)
	out := must(t, inImage(t, "", "/usr/sbin/iptables-"+mode+"-save"), "iptables-"+mode+"-save in the image")
	if !strings.Contains(out, "\n:DOCKER-USER ") || !strings.Contains(out, "-A FORWARD -j DOCKER-USER") {
		t.Fatalf("iptables-%s-save in the image does not list Docker's DOCKER-USER chain and its jump:\n%s", mode, out)
	}
}

// TestManagerDetectsBackend: the manager in the image, in auto mode,
// picks the backend holding Docker's DOCKER-USER chain (nft on this
// project's CI host); an explicit mode wins.
func TestManagerDetectsBackend(t *testing.T) {
	mode := hostMode(t)
	out := must(t, inImage(t, "", "/manager", "--egress-iptables-detect"), "manager --egress-iptables-detect")
	t.Logf("%s", strings.TrimSpace(out))
	want := "iptables backend: " + mode + " (iptables-" + mode + ", ip6tables-" + mode + "): Docker's DOCKER-USER chain: only in the"
	if !strings.HasPrefix(out, want) {
		t.Fatalf("manager --egress-iptables-detect: %q, want it to start with %q", out, want)
	}
	other := map[string]string{"nft": "legacy", "legacy": "nft"}[mode]
	out = must(t, inImage(t, "", "/manager", "--egress-iptables-detect", "--egress-iptables-mode="+other), "manager --egress-iptables-mode="+other)
	if !strings.HasPrefix(out, "iptables backend: "+other+" ") {
		t.Fatalf("manager --egress-iptables-mode=%s: %q", other, out)
	}
}

// TestWriteRulesWithExtensions: the image's iptables-<mode>-restore writes
// a chain with the matches the egress firewall uses (conntrack, udp, tcp),
// and iptables-<mode> lists them back the same: the xtables modules load.
// The chain is a throwaway, never jumped to.
func TestWriteRulesWithExtensions(t *testing.T) {
	mode := hostMode(t)
	buf := make([]byte, 4)
	if _, err := rand.Read(buf); err != nil {
		t.Fatal(err)
	}
	chain := "CSBX-IMGTEST-" + hex.EncodeToString(buf)
	rules := []string{
		"-A " + chain + " -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
		"-A " + chain + " -d 192.0.2.53/32 -p udp -m udp --dport 53 -j RETURN",
		"-A " + chain + " -d 192.0.2.53/32 -p tcp -m tcp --dport 53 -j RETURN",
		"-A " + chain + " -d 169.254.0.0/16 -j DROP",
		"-A " + chain + " -j DROP",
	}
	bin := "/usr/sbin/iptables-" + mode
	t.Cleanup(func() {
		inImage(t, "", bin, "-w", "5", "-F", chain)
		inImage(t, "", bin, "-w", "5", "-X", chain)
		// Also with the host's binary, in case the image's cannot.
		run(t, "", "iptables-"+mode, "-w", "5", "-F", chain)
		run(t, "", "iptables-"+mode, "-w", "5", "-X", chain)
	})
	payload := "*filter\n:" + chain + " - [0:0]\n" + strings.Join(rules, "\n") + "\nCOMMIT\n"
	must(t, inImage(t, payload, bin+"-restore", "-w", "5", "--noflush"), "iptables-"+mode+"-restore in the image")
	listed := must(t, inImage(t, "", bin, "-w", "5", "-S", chain), "iptables-"+mode+" -S in the image")
	want := "-N " + chain + "\n" + strings.Join(rules, "\n") + "\n"
	if listed != want {
		t.Fatalf("the image's iptables-%s lists\n%s\nwant\n%s", mode, listed, want)
	}
	// The host's iptables sees the same chain: same ruleset.
	if host := must(t, run(t, "", "iptables-"+mode, "-w", "5", "-S", chain), "host iptables -S"); host != want {
		t.Fatalf("the host's iptables-%s lists\n%s\nwant\n%s", mode, host, want)
	}
	// A rule with a match the image does not have fails loudly, not
	// silently (the check is real).
	if r := inImage(t, "", bin, "-w", "5", "-C", chain, "-m", "nosuchmatch", "-j", "RETURN"); r.code == 0 || !strings.Contains(r.stderr, "nosuchmatch") {
		t.Fatalf("an unknown match was accepted: exit %d, %s", r.code, r.stderr)
	}
}

func mcpImage() string {
	if img := os.Getenv("MCP_IMG"); img != "" {
		return img
	}
	return "code-sandbox-operator/mcp-server:latest"
}

// TestImagesCarryTheVersion: both images' org.opencontainers.image.version
// label is their binary's version (make docker-build VERSION=…), and the
// MCP server in its image refuses to update itself.
func TestImagesCarryTheVersion(t *testing.T) {
	for _, img := range []string{image(), mcpImage()} {
		if run(t, "", "docker", "image", "inspect", img).code != 0 {
			t.Errorf("image %s not found: make docker-build builds both", img)
			continue
		}
		label := strings.TrimSpace(must(t, run(t, "", "docker", "image", "inspect", "-f", `{{index .Config.Labels "org.opencontainers.image.version"}}`, img), "inspect "+img))
		out := must(t, run(t, "", "docker", "run", "--rm", "--network", "none", img, "--version"), img+" --version")
		first := strings.Fields(strings.SplitN(out, "\n", 2)[0])
		if label == "" || len(first) == 0 || first[len(first)-1] != label {
			t.Errorf("%s: label version %q, binary says %q", img, label, out)
		}
	}
	r := run(t, "", "docker", "run", "--rm", "--network", "none", mcpImage(), "update", "--allow-update-in-container")
	if r.code != 2 || !strings.Contains(r.stderr, "container image") || r.stdout != "" {
		t.Errorf("update in the MCP image: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
