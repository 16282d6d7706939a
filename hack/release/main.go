/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command release makes a release of code-sandbox-mcp and kubectl-sandbox
// (`make release`, docs/releasing.md): one archive per binary and target,
// checksums.txt and its minisign signature. The same source, Go toolchain,
// version and SOURCE_DATE_EPOCH give the same bytes: the binaries are built
// with -trimpath and no VCS stamp, and the archives hold sorted entries with
// fixed times, owners and modes.
//
//	go run ./hack/release --version v1.2.3 --key release.key --out dist/v1.2.3
//	go run ./hack/release keygen --out release.key   # writes release.key and release.key.pub
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"aead.dev/minisign"

	"github.com/code-sandbox/code-sandbox-operator/internal/release"
)

const versionVar = "github.com/code-sandbox/code-sandbox-operator/internal/version.Version"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "keygen" {
		if err := keygen(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "release keygen:", err)
			os.Exit(1)
		}
		return
	}
	if err := build(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

type options struct {
	version, out, key, passwordFile, extraLDFlags, license string
	targets, binaries                                      []string
	epoch                                                  int64
}

func build(args []string) error {
	var o options
	var targets, binaries string
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.StringVar(&o.version, "version", "", "release version, canonical semver (v1.2.3)")
	fs.StringVar(&o.out, "out", "", "output directory (must not exist, or be empty)")
	fs.StringVar(&o.key, "key", "", "minisign secret key file")
	fs.StringVar(&o.passwordFile, "password-file", "", "file holding the secret key's password, if it is encrypted")
	fs.StringVar(&targets, "targets", strings.Join(release.Targets, " "), "GOOS/GOARCH pairs (space or comma separated; \"host\" for this machine's)")
	fs.StringVar(&binaries, "binaries", strings.Join(release.Binaries, " "), "commands to release")
	fs.Int64Var(&o.epoch, "source-date-epoch", -1, "build time in Unix seconds (the commit's time); the archives' mtimes and the signature's timestamp")
	fs.StringVar(&o.extraLDFlags, "extra-ldflags", "", "more -ldflags (the release tests pin their throwaway key with it)")
	fs.StringVar(&o.license, "license", "LICENSE", "license file put into every archive")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.targets = fields(strings.ReplaceAll(targets, "host", runtime.GOOS+"/"+runtime.GOARCH))
	o.binaries = fields(binaries)
	if err := release.CheckVersion(o.version); err != nil {
		return err
	}
	if o.out == "" || o.key == "" || o.epoch < 0 {
		return errors.New("--out, --key and --source-date-epoch are required")
	}
	// The MCP server embeds the in-sandbox helper (make helper); a release
	// without it would build and fail at its first sandbox.
	if slices.Contains(o.binaries, "code-sandbox-mcp") {
		for _, arch := range []string{"amd64", "arm64"} {
			if _, err := os.Stat("internal/dockerruntime/helperbin/code-sandbox-helper-linux-" + arch); err != nil {
				return fmt.Errorf("the in-sandbox helper is not built (make helper): %w", err)
			}
		}
	}
	key, err := readKey(o.key, o.passwordFile)
	if err != nil {
		return err
	}
	license, err := os.ReadFile(o.license)
	if err != nil {
		return err
	}
	if err := emptyDir(o.out); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "release-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	sums := map[string]string{}
	for _, t := range o.targets {
		goos, goarch, ok := strings.Cut(t, "/")
		if !ok || goos == "" || goarch == "" {
			return fmt.Errorf("target %q: want GOOS/GOARCH", t)
		}
		for _, bin := range o.binaries {
			start := time.Now()
			exe := filepath.Join(tmp, goos+"_"+goarch, release.ExecutableName(bin, goos))
			if err := goBuild(o, bin, goos, goarch, exe); err != nil {
				return err
			}
			name := release.ArchiveName(bin, o.version, goos, goarch)
			exeData, err := os.ReadFile(exe)
			if err != nil {
				return err
			}
			sum, err := writeArchive(filepath.Join(o.out, name), goos, o.epoch, []release.Entry{
				{Name: release.ExecutableName(bin, goos), Mode: 0o755, Data: exeData},
				{Name: "LICENSE", Mode: 0o644, Data: license},
			})
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			sums[name] = sum
			fmt.Fprintf(os.Stderr, "%s (%s)\n", name, time.Since(start).Round(time.Second))
		}
	}
	checksums := release.FormatChecksums(sums)
	if err := os.WriteFile(filepath.Join(o.out, release.ChecksumsName), checksums, 0o644); err != nil {
		return err
	}
	sig := release.SignChecksums(key, checksums, o.version, o.epoch)
	if err := os.WriteFile(filepath.Join(o.out, release.SignatureName), sig, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "signed %s with key %s\n", release.ChecksumsName, release.KeyID(key.Public().(minisign.PublicKey)))
	return nil
}

func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == '\n' || r == '\t' })
}

func readKey(path, passwordFile string) (minisign.PrivateKey, error) {
	var key minisign.PrivateKey
	data, err := os.ReadFile(path)
	if err != nil {
		return key, err
	}
	if !minisign.IsEncrypted(data) {
		return key, key.UnmarshalText(data)
	}
	if passwordFile == "" {
		return key, fmt.Errorf("%s is encrypted: give its password in a file (SIGNING_KEY_PASSWORD_FILE)", path)
	}
	pw, err := os.ReadFile(passwordFile)
	if err != nil {
		return key, err
	}
	return minisign.DecryptKey(strings.TrimRight(string(pw), "\r\n"), data)
}

func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is not empty: remove it first", dir)
	}
	return nil
}

// goBuild builds one binary reproducibly: no cgo, -trimpath, no VCS stamp,
// no build ID, the version from --version.
func goBuild(o options, bin, goos, goarch, out string) error {
	ldflags := "-s -w -buildid= -X " + versionVar + "=" + o.version
	if o.extraLDFlags != "" {
		ldflags += " " + o.extraLDFlags
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-mod=readonly", "-ldflags", ldflags, "-o", out, "./cmd/"+bin)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch, "GOFLAGS=", "GOARM=", "GOAMD64=v1", "GOARM64=v8.0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w", bin, goos, goarch, err)
	}
	return nil
}

// writeArchive writes the archive at path and returns its SHA-256.
func writeArchive(path, goos string, epoch int64, entries []release.Entry) (string, error) {
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if err := release.WriteArchive(io.MultiWriter(f, h), goos, epoch, entries); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// keygen writes a new unencrypted minisign key pair: OUT (the secret key,
// mode 0600) and OUT.pub. Keep the secret key out of the repository.
func keygen(args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	out := fs.String("out", "", "secret key file to write (OUT.pub gets the public key)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out is required")
	}
	pub, priv, err := minisign.GenerateKey(nil)
	if err != nil {
		return err
	}
	privText, err := priv.MarshalText()
	if err != nil {
		return err
	}
	pubText, err := pub.MarshalText()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(privText, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// pubText is minisign's public key file: a comment line, then the key.
	if err := os.WriteFile(*out+".pub", append(pubText, '\n'), 0o644); err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(pubText)), "\n")
	fmt.Println(lines[len(lines)-1])
	return nil
}
