/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package selfupdate replaces a released binary (code-sandbox-mcp) with a
// newer signed release, and back (docs/mcp.md#updates): it reads a release
// index (the GitHub releases API's shape), verifies the release's
// checksums.txt against the pinned key and the archive against it, and
// renames the new binary over the old one in the same directory, keeping
// the old one beside it for a rollback. Every download is bounded in size
// and time, and nothing is written next to the binary before the bytes are
// verified but a temporary file that is removed on any failure.
package selfupdate

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"aead.dev/minisign"
	"golang.org/x/mod/semver"

	"github.com/code-sandbox/code-sandbox-operator/internal/release"
)

// DefaultIndexURL is the project's GitHub releases.
const DefaultIndexURL = "https://api.github.com/repos/code-sandbox/code-sandbox-operator/releases"

// Bounds of what is read from the network or from an archive.
const (
	maxIndexBytes     = 4 << 20
	maxChecksumsBytes = 64 << 10
	maxSignatureBytes = 4 << 10
	maxArchiveBytes   = 256 << 20
	maxBinaryBytes    = 512 << 20
	indexTimeout      = 30 * time.Second
	downloadTimeout   = 10 * time.Minute
)

// Asset is a file of a release in the index.
type Asset struct {
	Name string `json:"name"`
	URL  string `json:"browser_download_url"`
}

// Release is one entry of the index, the fields of GitHub's
// GET /repos/{owner}/{repo}/releases that count here.
type Release struct {
	Tag        string  `json:"tag_name"`
	Draft      bool    `json:"draft"`
	Prerelease bool    `json:"prerelease"`
	Assets     []Asset `json:"assets"`
}

// Options say what to update and from where.
type Options struct {
	// IndexURL is the release index: a JSON list of releases (or one
	// release). Asset URLs in it may be relative to it. https, or http to a
	// loopback address.
	IndexURL string
	// CurrentVersion is the running binary's version (internal/version).
	CurrentVersion string
	// Key verifies the releases (release.TrustedKey).
	Key minisign.PublicKey
	// Binary is the command's release name (code-sandbox-mcp).
	Binary string
	// GOOS and GOARCH choose the archive.
	GOOS, GOARCH string
	// Executable is the file to replace (os.Executable, symlinks resolved).
	Executable string
	// AllowDowngrade lets Update install a version older than the current
	// one, or replace a binary whose version is not a release version.
	AllowDowngrade bool
	// Client does the downloads (default: a client with timeouts).
	Client *http.Client
}

// ErrDowngrade refuses an update to an older version.
var ErrDowngrade = errors.New("downgrade refused")

// Status is what a check found.
type Status struct {
	Current, Latest string
	// Newer: Latest is a newer release than Current (false when Current is
	// not a release version).
	Newer bool
}

// Check finds the newest release in the index whose signature verifies.
func Check(ctx context.Context, o Options) (Status, *Release, error) {
	rel, err := latest(ctx, o)
	if err != nil {
		return Status{}, nil, err
	}
	if _, _, err := verifiedSum(ctx, o, rel); err != nil {
		return Status{}, nil, err
	}
	st := Status{Current: o.CurrentVersion, Latest: rel.Tag}
	st.Newer = compare(rel.Tag, o.CurrentVersion) > 0
	return st, rel, nil
}

// Update installs the newest release over o.Executable, keeping the
// current binary as OldPath(o.Executable). It returns the version now
// installed and whether it changed anything. log gets progress lines.
func Update(ctx context.Context, o Options, log io.Writer) (string, bool, error) {
	dir := filepath.Dir(o.Executable)
	// Fail before any download when the directory is not writable.
	probe, err := os.CreateTemp(dir, ".update-probe-*")
	if err != nil {
		return "", false, fmt.Errorf("cannot write beside %s (rerun as its owner, or reinstall): %w", o.Executable, err)
	}
	probe.Close()
	os.Remove(probe.Name())

	rel, err := latest(ctx, o)
	if err != nil {
		return "", false, err
	}
	switch c := compare(rel.Tag, o.CurrentVersion); {
	case c == 0:
		fmt.Fprintf(log, "%s %s is the newest release\n", o.Binary, o.CurrentVersion)
		return o.CurrentVersion, false, nil
	case c < 0 && !o.AllowDowngrade:
		if !semver.IsValid(o.CurrentVersion) {
			return "", false, fmt.Errorf("%w: this binary's version %q is not a release version; pass --allow-downgrade to replace it with %s", ErrDowngrade, o.CurrentVersion, rel.Tag)
		}
		return "", false, fmt.Errorf("%w: the newest release %s is older than this binary's %s (pass --allow-downgrade)", ErrDowngrade, rel.Tag, o.CurrentVersion)
	}
	archive, sum, err := verifiedSum(ctx, o, rel)
	if err != nil {
		return "", false, err
	}
	fmt.Fprintf(log, "downloading %s (signature verified with key %s)\n", archive.Name, release.KeyID(o.Key))
	tmpArchive, err := download(ctx, o, archive, sum, dir)
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmpArchive)
	incoming, err := extract(tmpArchive, release.ExecutableName(o.Binary, o.GOOS), o.GOOS, dir)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", archive.Name, err)
	}
	if err := replace(o.Executable, incoming); err != nil {
		os.Remove(incoming)
		return "", false, err
	}
	fmt.Fprintf(log, "updated %s from %s to %s; the old binary is %s (update --rollback)\n", o.Executable, o.CurrentVersion, rel.Tag, OldPath(o.Executable))
	return rel.Tag, true, nil
}

// compare orders release tag against the current version. A current
// version that is no release version counts as newer than any release
// (a source build), so that only --allow-downgrade replaces it. A `git
// describe` version (v1.2.3-4-gabcdef0, perhaps -dirty) is a build after
// v1.2.3: semver would read its suffix as a prerelease and order it
// before v1.2.3, offering v1.2.3 as an update to a newer build.
func compare(tag, current string) int {
	if m := describeSuffix.FindStringSubmatch(current); m != nil && semver.IsValid(m[1]) {
		if c := semver.Compare(tag, m[1]); c != 0 {
			return c
		}
		return -1
	}
	if !semver.IsValid(current) {
		return -1
	}
	return semver.Compare(tag, current)
}

// describeSuffix matches what `git describe --tags --dirty` appends to
// the tag it counts from: commits since it and the abbreviated hash.
var describeSuffix = regexp.MustCompile(`^(v[0-9].*)-[0-9]+-g[0-9a-f]{4,40}(-dirty)?$`)

// OldPath is where Update keeps the binary it replaced.
func OldPath(exe string) string { return exe + ".old" }

// Rollback swaps exe and OldPath(exe), so that a second rollback undoes
// the first.
func Rollback(exe string) error {
	old := OldPath(exe)
	if _, err := os.Stat(old); err != nil {
		return fmt.Errorf("nothing to roll back to: %w", err)
	}
	tmp, err := copyToTemp(old, filepath.Dir(exe))
	if err != nil {
		return err
	}
	if err := replace(exe, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// replace puts incoming (a file in exe's directory) at exe and keeps the
// binary that was there at OldPath(exe). On Unix the running binary's
// file is copied to OldPath and incoming renamed over exe, so exe never
// goes missing; on Windows, which cannot replace a running executable, exe
// is moved aside first (replace_windows.go).
func replace(exe, incoming string) error {
	if fi, err := os.Stat(exe); err == nil {
		if err := os.Chmod(incoming, fi.Mode().Perm()|0o500); err != nil {
			return err
		}
	}
	return swap(exe, incoming, OldPath(exe))
}

func copyToTemp(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp(dir, ".update-*")
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(out.Name())
		return "", err
	}
	if err := out.Close(); err != nil {
		os.Remove(out.Name())
		return "", err
	}
	if fi, err := in.Stat(); err == nil {
		_ = os.Chmod(out.Name(), fi.Mode().Perm())
	}
	return out.Name(), nil
}

func (o Options) client() *http.Client {
	if o.Client != nil {
		return o.Client
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = indexTimeout
	return &http.Client{Transport: t, CheckRedirect: checkRedirect}
}

func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("too many redirects")
	}
	return checkURL(req.URL)
}

// checkURL allows https, and http only to a loopback address (a local
// mirror or a test): the signature protects the bytes either way, but not
// the privacy of who fetches what.
func checkURL(u *url.URL) error {
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
			return nil
		}
	}
	return fmt.Errorf("%s: only https URLs (or http to a loopback address) are allowed", u.Redacted())
}

// get fetches u and returns at most limit bytes of its body, refusing a
// longer one (before reading it when the server says its length).
func get(ctx context.Context, o Options, u string, limit int64, timeout time.Duration, w io.Writer) error {
	pu, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("URL %q: %w", u, err)
	}
	if err := checkURL(pu); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/vnd.github+json, application/octet-stream;q=0.9, */*;q=0.8")
	resp, err := o.client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", pu.Redacted(), resp.Status)
	}
	if resp.ContentLength > limit {
		return fmt.Errorf("GET %s: %d bytes, more than the %d allowed", pu.Redacted(), resp.ContentLength, limit)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return fmt.Errorf("GET %s: %w", pu.Redacted(), err)
	}
	if n > limit {
		return fmt.Errorf("GET %s: more than the %d bytes allowed", pu.Redacted(), limit)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return fmt.Errorf("GET %s: got %d of %d bytes", pu.Redacted(), n, resp.ContentLength)
	}
	return nil
}

func getBytes(ctx context.Context, o Options, u string, limit int64) ([]byte, error) {
	var b strings.Builder
	if err := get(ctx, o, u, limit, indexTimeout, &b); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}

// latest reads the index and returns its newest release: the highest
// semver tag that is no draft and no prerelease.
func latest(ctx context.Context, o Options) (*Release, error) {
	data, err := getBytes(ctx, o, o.IndexURL, maxIndexBytes)
	if err != nil {
		return nil, fmt.Errorf("release index: %w", err)
	}
	var rels []Release
	if err := json.Unmarshal(data, &rels); err != nil {
		var one Release
		if err1 := json.Unmarshal(data, &one); err1 != nil || one.Tag == "" {
			return nil, fmt.Errorf("release index %s: not a list of releases: %w", o.IndexURL, err)
		}
		rels = []Release{one}
	}
	var best *Release
	for i := range rels {
		r := &rels[i]
		if r.Draft || r.Prerelease || release.CheckVersion(r.Tag) != nil || semver.Prerelease(r.Tag) != "" {
			continue
		}
		if best == nil || semver.Compare(r.Tag, best.Tag) > 0 {
			best = r
		}
	}
	if best == nil {
		return nil, fmt.Errorf("release index %s lists no release", o.IndexURL)
	}
	base, err := url.Parse(o.IndexURL)
	if err != nil {
		return nil, err
	}
	for i, a := range best.Assets {
		u, err := base.Parse(a.URL)
		if err != nil {
			return nil, fmt.Errorf("release %s: asset %s: %w", best.Tag, a.Name, err)
		}
		best.Assets[i].URL = u.String()
	}
	return best, nil
}

func asset(rel *Release, name string) (Asset, error) {
	for _, a := range rel.Assets {
		if a.Name == name {
			return a, nil
		}
	}
	return Asset{}, fmt.Errorf("release %s has no %s", rel.Tag, name)
}

// verifiedSum fetches rel's checksums.txt and its signature, verifies them
// with o.Key for version rel.Tag, and returns the archive for o's target
// and its SHA-256.
func verifiedSum(ctx context.Context, o Options, rel *Release) (Asset, string, error) {
	name := release.ArchiveName(o.Binary, rel.Tag, o.GOOS, o.GOARCH)
	archive, err := asset(rel, name)
	if err != nil {
		return Asset{}, "", err
	}
	sumsAsset, err := asset(rel, release.ChecksumsName)
	if err != nil {
		return Asset{}, "", err
	}
	sigAsset, err := asset(rel, release.SignatureName)
	if err != nil {
		return Asset{}, "", err
	}
	sums, err := getBytes(ctx, o, sumsAsset.URL, maxChecksumsBytes)
	if err != nil {
		return Asset{}, "", err
	}
	sig, err := getBytes(ctx, o, sigAsset.URL, maxSignatureBytes)
	if err != nil {
		return Asset{}, "", err
	}
	parsed, err := release.VerifyChecksums(o.Key, sums, sig, rel.Tag)
	if err != nil {
		return Asset{}, "", fmt.Errorf("release %s: %w", rel.Tag, err)
	}
	sum, ok := parsed[name]
	if !ok {
		return Asset{}, "", fmt.Errorf("release %s: %s does not list %s", rel.Tag, release.ChecksumsName, name)
	}
	return archive, sum, nil
}

// download writes a's bytes to a temporary file in dir and checks them
// against sum; on any failure the file is gone.
func download(ctx context.Context, o Options, a Asset, sum, dir string) (string, error) {
	f, err := os.CreateTemp(dir, ".update-archive-*")
	if err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	if err := get(ctx, o, a.URL, maxArchiveBytes, downloadTimeout, io.MultiWriter(f, h)); err != nil {
		return "", err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return "", fmt.Errorf("%s: SHA-256 %s does not match the signed %s's %s", a.Name, got, release.ChecksumsName, sum)
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	ok = true
	return f.Name(), nil
}

// extract copies the regular file name out of the archive at path into a
// new temporary file in dir.
func extract(path, name, goos, dir string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var src io.Reader
	if goos == "windows" {
		fi, err := f.Stat()
		if err != nil {
			return "", err
		}
		zr, err := zip.NewReader(f, fi.Size())
		if err != nil {
			return "", err
		}
		for _, zf := range zr.File {
			if zf.Name == name && zf.Mode().IsRegular() {
				rc, err := zf.Open()
				if err != nil {
					return "", err
				}
				defer rc.Close()
				src = rc
				break
			}
		}
	} else {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return "", err
		}
		tr := tar.NewReader(gz)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return "", err
			}
			if hdr.Name == name && hdr.Typeflag == tar.TypeReg {
				src = tr
				break
			}
		}
	}
	if src == nil {
		return "", fmt.Errorf("no file %s in the archive", name)
	}
	out, err := os.CreateTemp(dir, ".update-binary-*")
	if err != nil {
		return "", err
	}
	n, err := io.Copy(out, io.LimitReader(src, maxBinaryBytes+1))
	if err == nil && n > maxBinaryBytes {
		err = fmt.Errorf("%s is larger than %d bytes", name, maxBinaryBytes)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out.Name())
		return "", err
	}
	return out.Name(), nil
}
