/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package release is the format of a code-sandbox-operator release, which
// the tool that makes one (hack/release) and the code that installs one
// (internal/selfupdate, hack/install.sh, hack/install.ps1) agree on: the
// archive names, checksums.txt, its minisign signature and the public key
// releases are signed with (docs/releasing.md).
package release

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"aead.dev/minisign"
	"golang.org/x/mod/semver"
)

// PublicKey is the minisign public key every release's checksums.txt is
// signed with. It is also in docs/releasing.md, docs/mcp.md and the install
// scripts; change them together.
const PublicKey = "RWSpB9Y2sSncbBZRPJ5OPplFMgOFISgVZAkhu4mGPcoz48uo1o/G//8S"

// publicKeyOverride replaces PublicKey in binaries built by the release
// tests, which sign throwaway releases with a throwaway key:
//
//	-ldflags "-X github.com/code-sandbox/code-sandbox-operator/internal/release.publicKeyOverride=RW…"
//
// It is a build-time choice only, like every other byte of the binary: it
// cannot be set at run time (no flag, environment variable or file), and
// whoever can pass ldflags to a build can as well edit PublicKey.
var publicKeyOverride string

// TrustedKey is the key this binary verifies releases with.
func TrustedKey() (minisign.PublicKey, error) {
	text := PublicKey
	if publicKeyOverride != "" {
		text = publicKeyOverride
	}
	var k minisign.PublicKey
	if err := k.UnmarshalText([]byte(text)); err != nil {
		return k, fmt.Errorf("the pinned release key %q: %w", text, err)
	}
	return k, nil
}

// KeyID is the minisign key ID of k as minisign prints it.
func KeyID(k minisign.PublicKey) string {
	return strings.ToUpper(strconv.FormatUint(k.ID(), 16))
}

const (
	// ChecksumsName is the file of every archive's SHA-256.
	ChecksumsName = "checksums.txt"
	// SignatureName is ChecksumsName's minisign signature.
	SignatureName = ChecksumsName + ".minisig"
)

// Binaries are the commands a release ships, one archive per target each.
var Binaries = []string{"code-sandbox-mcp", "kubectl-sandbox"}

// Targets are the GOOS/GOARCH pairs a release is built for.
var Targets = []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64", "windows/amd64", "windows/arm64"}

// ArchiveName is the name of binary's archive for goos/goarch in the
// release version: code-sandbox-mcp_v1.2.3_linux_amd64.tar.gz (.zip for
// windows).
func ArchiveName(binary, version, goos, goarch string) string {
	ext := ".tar.gz"
	if goos == "windows" {
		ext = ".zip"
	}
	return binary + "_" + version + "_" + goos + "_" + goarch + ext
}

// ExecutableName is binary's file name inside its archive for goos.
func ExecutableName(binary, goos string) string {
	if goos == "windows" {
		return binary + ".exe"
	}
	return binary
}

// CheckVersion refuses a release version that is not canonical semver with
// a leading v (v1.2.3, v1.2.3-rc.1): it is part of file names and is
// compared with golang.org/x/mod/semver.
func CheckVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || strings.Contains(v, "+") {
		return fmt.Errorf("release version %q: want canonical semver such as v1.2.3 or v1.2.3-rc.1", v)
	}
	return nil
}

// FormatChecksums writes sums (file name to hex SHA-256) as sha256sum
// does, sorted by name.
func FormatChecksums(sums map[string]string) []byte {
	names := make([]string, 0, len(sums))
	for n := range sums {
		names = append(names, n)
	}
	slices.Sort(names)
	var b bytes.Buffer
	for _, n := range names {
		fmt.Fprintf(&b, "%s  %s\n", sums[n], n)
	}
	return b.Bytes()
}

// ParseChecksums reads a checksums.txt: lines "<64 hex>  <name>". Anything
// else (a malformed line, a name twice, a name with a path) is an error, not
// skipped.
func ParseChecksums(data []byte) (map[string]string, error) {
	sums := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 || name == "" || strings.ContainsAny(name, "/\\ \t") {
			return nil, fmt.Errorf("%s line %d: want \"<sha256>  <name>\", got %q", ChecksumsName, n, line)
		}
		if _, err := hex.DecodeString(sum); err != nil || strings.ToLower(sum) != sum {
			return nil, fmt.Errorf("%s line %d: %q is not a lower-case hex SHA-256", ChecksumsName, n, sum)
		}
		if _, dup := sums[name]; dup {
			return nil, fmt.Errorf("%s: %s is listed twice", ChecksumsName, name)
		}
		sums[name] = sum
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", ChecksumsName, err)
	}
	if len(sums) == 0 {
		return nil, fmt.Errorf("%s lists no file", ChecksumsName)
	}
	return sums, nil
}

// trustedComment is what a release's signature vouches for besides the
// checksums: the version (so that an old release's signed checksums cannot
// pass for a newer one's) and the build time.
func trustedComment(version string, epoch int64) string {
	return "timestamp:" + strconv.FormatInt(epoch, 10) + "\tfile:" + ChecksumsName + "\tversion:" + version
}

// SignChecksums signs checksums of release version with key (minisign's
// pre-hashed Ed25519, which `minisign -V` verifies). Ed25519 is
// deterministic, so the same inputs give the same signature bytes.
func SignChecksums(key minisign.PrivateKey, checksums []byte, version string, epoch int64) []byte {
	r := minisign.NewReader(bytes.NewReader(checksums))
	_, _ = io.Copy(io.Discard, r) // a bytes.Reader does not fail
	untrusted := "signature from code-sandbox-operator release key " + strings.ToUpper(strconv.FormatUint(key.ID(), 16))
	return r.SignWithComments(key, trustedComment(version, epoch), untrusted)
}

// ErrSignature is returned for a signature that does not verify.
var ErrSignature = errors.New("signature verification failed")

// VerifyChecksums checks that sig is key's signature of checksums for the
// release version, and returns the parsed checksums.
func VerifyChecksums(key minisign.PublicKey, checksums, sig []byte, version string) (map[string]string, error) {
	var s minisign.Signature
	if err := s.UnmarshalText(sig); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", SignatureName, ErrSignature, err)
	}
	if s.KeyID != key.ID() {
		return nil, fmt.Errorf("%s: %w: signed by key %X, this binary trusts only %s", SignatureName, ErrSignature, s.KeyID, KeyID(key))
	}
	if s.Algorithm != minisign.HashEdDSA {
		return nil, fmt.Errorf("%s: %w: not a pre-hashed (ED) minisign signature", SignatureName, ErrSignature)
	}
	r := minisign.NewReader(bytes.NewReader(checksums))
	_, _ = io.Copy(io.Discard, r)
	if !r.Verify(key, sig) {
		return nil, fmt.Errorf("%s: %w (key %s)", SignatureName, ErrSignature, KeyID(key))
	}
	if !slices.Contains(strings.Split(s.TrustedComment, "\t"), "version:"+version) {
		return nil, fmt.Errorf("%s: %w: it is for %q, not version %s", SignatureName, ErrSignature, s.TrustedComment, version)
	}
	return ParseChecksums(checksums)
}
