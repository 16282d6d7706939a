/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package selfupdate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/code-sandbox/code-sandbox-operator/internal/release"
)

const (
	goos, goarch = "linux", "amd64"
	binary       = "code-sandbox-mcp"
)

// fixture is a release server: files by release version and name, a hook
// to tamper with what is served, and a count of index requests.
type fixture struct {
	t        *testing.T
	key      minisign.PublicKey
	priv     minisign.PrivateKey
	files    map[string]map[string][]byte
	binaries map[string][]byte
	srv      *httptest.Server
	serve    func(w http.ResponseWriter, version, name string, data []byte) // nil: as is
	indexHit atomic.Int32
}

func newFixture(t *testing.T, versions ...string) *fixture {
	t.Helper()
	pub, priv, err := minisign.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, key: pub, priv: priv, files: map[string]map[string][]byte{}, binaries: map[string][]byte{}}
	for _, v := range versions {
		f.add(v, priv)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.handle))
	t.Cleanup(f.srv.Close)
	return f
}

// add builds release v signed with key: a binary whose bytes name v.
func (f *fixture) add(v string, key minisign.PrivateKey) {
	f.t.Helper()
	bin := []byte("#!/bin/sh\necho " + v + "\n" + strings.Repeat("x", 4096))
	f.binaries[v] = bin
	files := map[string][]byte{}
	sums := map[string]string{}
	for _, target := range []string{"linux/amd64", "windows/amd64"} {
		o, a, _ := strings.Cut(target, "/")
		var buf bytes.Buffer
		if err := release.WriteArchive(&buf, o, 1700000000, []release.Entry{
			{Name: release.ExecutableName(binary, o), Mode: 0o755, Data: bin},
			{Name: "LICENSE", Mode: 0o644, Data: []byte("MIT")},
		}); err != nil {
			f.t.Fatal(err)
		}
		name := release.ArchiveName(binary, v, o, a)
		files[name] = buf.Bytes()
		s := sha256.Sum256(buf.Bytes())
		sums[name] = hex.EncodeToString(s[:])
	}
	files[release.ChecksumsName] = release.FormatChecksums(sums)
	files[release.SignatureName] = release.SignChecksums(key, files[release.ChecksumsName], v, 1700000000)
	f.files[v] = files
}

func (f *fixture) handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/releases" {
		f.indexHit.Add(1)
		var rels []Release
		for v, files := range f.files {
			rel := Release{Tag: v}
			for name := range files {
				// Relative asset URLs resolve against the index URL.
				rel.Assets = append(rel.Assets, Asset{Name: name, URL: "download/" + v + "/" + name})
			}
			rels = append(rels, rel)
		}
		_ = json.NewEncoder(w).Encode(rels)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/download/")
	v, name, _ := strings.Cut(rest, "/")
	data, found := f.files[v][name]
	if !ok || !found {
		http.NotFound(w, r)
		return
	}
	if f.serve != nil {
		f.serve(w, v, name, data)
		return
	}
	_, _ = w.Write(data)
}

// install writes the current binary (release current's) and returns the
// Options that update it.
func (f *fixture) install(current string) Options {
	f.t.Helper()
	exe := filepath.Join(f.t.TempDir(), binary)
	if err := os.WriteFile(exe, f.binaries[current], 0o755); err != nil {
		f.t.Fatal(err)
	}
	return Options{IndexURL: f.srv.URL + "/releases", CurrentVersion: current, Key: f.key, Binary: binary, GOOS: goos, GOARCH: goarch, Executable: exe}
}

// dirFiles lists exe's directory.
func dirFiles(t *testing.T, exe string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(exe))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUpdateThenRollback(t *testing.T) {
	f := newFixture(t, "v1.0.0", "v1.1.0", "v1.0.1")
	o := f.install("v1.0.0")
	var log bytes.Buffer
	got, changed, err := Update(context.Background(), o, &log)
	if err != nil || !changed || got != "v1.1.0" {
		t.Fatalf("Update = %q, %v, %v; log %s", got, changed, err, log.String())
	}
	if !bytes.Equal(mustRead(t, o.Executable), f.binaries["v1.1.0"]) {
		t.Error("the binary is not v1.1.0's after the update")
	}
	if !bytes.Equal(mustRead(t, OldPath(o.Executable)), f.binaries["v1.0.0"]) {
		t.Error("the old binary was not kept")
	}
	if fi, err := os.Stat(o.Executable); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("new binary mode: %v, %v", fi.Mode(), err)
	}
	if names := dirFiles(t, o.Executable); len(names) != 2 {
		t.Errorf("left beside the binary: %v, want it and its .old only", names)
	}

	if err := Rollback(o.Executable); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, o.Executable), f.binaries["v1.0.0"]) || !bytes.Equal(mustRead(t, OldPath(o.Executable)), f.binaries["v1.1.0"]) {
		t.Error("rollback did not swap the binary and its .old")
	}
	if names := dirFiles(t, o.Executable); len(names) != 2 {
		t.Errorf("left beside the binary after rollback: %v", names)
	}

	// Up to date: nothing changes, nothing is downloaded.
	o.CurrentVersion = "v1.1.0"
	before := mustRead(t, o.Executable)
	if _, changed, err := Update(context.Background(), o, &log); err != nil || changed {
		t.Errorf("update at the newest version: changed %v, %v", changed, err)
	}
	if !bytes.Equal(mustRead(t, o.Executable), before) {
		t.Error("an update at the newest version changed the binary")
	}
}

func TestRollbackWithoutOldFails(t *testing.T) {
	f := newFixture(t, "v1.0.0")
	o := f.install("v1.0.0")
	if err := Rollback(o.Executable); err == nil {
		t.Fatal("rollback with no .old succeeded")
	}
	if !bytes.Equal(mustRead(t, o.Executable), f.binaries["v1.0.0"]) {
		t.Error("a failed rollback changed the binary")
	}
}

func TestWindowsArchive(t *testing.T) {
	f := newFixture(t, "v1.0.0", "v1.1.0")
	o := f.install("v1.0.0")
	o.GOOS = "windows"
	if _, _, err := Update(context.Background(), o, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, o.Executable), f.binaries["v1.1.0"]) {
		t.Error("the zip's binary was not installed")
	}
}

// TestRefusals: each bad release is refused with the binary and its
// directory as they were.
func TestRefusals(t *testing.T) {
	flip := func(b []byte, i int) []byte {
		c := bytes.Clone(b)
		c[i] ^= 1
		return c
	}
	for name, c := range map[string]struct {
		current   string
		downgrade bool
		setup     func(f *fixture)
		want      string
	}{
		"tampered archive": {setup: func(f *fixture) {
			a := release.ArchiveName(binary, "v1.1.0", goos, goarch)
			f.files["v1.1.0"][a] = flip(f.files["v1.1.0"][a], 100)
		}, want: "does not match"},
		"tampered checksums.txt": {setup: func(f *fixture) {
			// The checksum of a tampered archive, unsigned.
			a := release.ArchiveName(binary, "v1.1.0", goos, goarch)
			f.files["v1.1.0"][a] = flip(f.files["v1.1.0"][a], 100)
			s := sha256.Sum256(f.files["v1.1.0"][a])
			f.files["v1.1.0"][release.ChecksumsName] = release.FormatChecksums(map[string]string{a: hex.EncodeToString(s[:])})
		}, want: "signature verification failed"},
		"wrong key": {setup: func(f *fixture) {
			_, other, _ := minisign.GenerateKey(nil)
			f.add("v1.1.0", other)
		}, want: "this binary trusts only"},
		"old release's signed checksums replayed as a newer one": {setup: func(f *fixture) {
			f.files["v1.1.0"][release.ChecksumsName] = f.files["v1.0.0"][release.ChecksumsName]
			f.files["v1.1.0"][release.SignatureName] = f.files["v1.0.0"][release.SignatureName]
		}, want: "not version v1.1.0"},
		"downgrade": {current: "v2.0.0", want: "downgrade refused"},
		"dev build": {current: "dev", want: "not a release version"},
		"truncated download": {setup: func(f *fixture) {
			f.serve = func(w http.ResponseWriter, _, name string, data []byte) {
				if strings.HasSuffix(name, ".tar.gz") {
					w.Header().Set("Content-Length", "9999")
					_, _ = w.Write(data[:len(data)/2])
					return
				}
				_, _ = w.Write(data)
			}
		}, want: "unexpected EOF"},
		"truncated file": {setup: func(f *fixture) {
			a := release.ArchiveName(binary, "v1.1.0", goos, goarch)
			f.files["v1.1.0"][a] = f.files["v1.1.0"][a][:200]
		}, want: "does not match"},
		"oversized signature": {setup: func(f *fixture) {
			f.files["v1.1.0"][release.SignatureName] = bytes.Repeat([]byte("a"), maxSignatureBytes+1)
		}, want: "allowed"},
		"missing signature": {setup: func(f *fixture) {
			delete(f.files["v1.1.0"], release.SignatureName)
		}, want: "has no checksums.txt.minisig"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, "v1.0.0", "v1.1.0")
			if c.setup != nil {
				c.setup(f)
			}
			current := "v1.0.0"
			if c.current != "" {
				current = c.current
				f.binaries[current] = []byte("installed " + current)
			}
			o := f.install(current)
			o.AllowDowngrade = c.downgrade
			_, changed, err := Update(context.Background(), o, &bytes.Buffer{})
			if err == nil || changed || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Update: changed %v, error %v; want an error with %q", changed, err, c.want)
			}
			if !bytes.Equal(mustRead(t, o.Executable), f.binaries[current]) {
				t.Error("a refused update changed the binary")
			}
			if names := dirFiles(t, o.Executable); len(names) != 1 {
				t.Errorf("a refused update left %v beside the binary", names)
			}
		})
	}
}

func TestDowngradeWhenAllowed(t *testing.T) {
	f := newFixture(t, "v1.0.0", "v1.1.0")
	o := f.install("v1.1.0")
	o.CurrentVersion = "v2.0.0"
	o.AllowDowngrade = true
	if got, changed, err := Update(context.Background(), o, &bytes.Buffer{}); err != nil || !changed || got != "v1.1.0" {
		t.Fatalf("allowed downgrade: %q %v %v", got, changed, err)
	}
}

// A source build `git describe` names (v1.1.0-3-gabcdef0) is newer than
// the tag it counts from: semver alone would order it before v1.1.0.
func TestGitDescribeBuilds(t *testing.T) {
	f := newFixture(t, "v1.0.0", "v1.1.0")
	for _, current := range []string{"v1.1.0-3-gabcdef0", "v1.1.0-12-g0123456789ab-dirty"} {
		o := f.install("v1.1.0")
		o.CurrentVersion = current
		if _, changed, err := Update(context.Background(), o, &bytes.Buffer{}); !errors.Is(err, ErrDowngrade) || changed {
			t.Errorf("%s offered v1.1.0: changed=%v err=%v", current, changed, err)
		}
		if st, _, err := Check(context.Background(), o); err != nil || st.Newer {
			t.Errorf("%s: Check says v1.1.0 is newer (%+v, %v)", current, st, err)
		}
	}
	o := f.install("v1.0.0")
	o.CurrentVersion = "v1.0.0-3-gabcdef0"
	if got, changed, err := Update(context.Background(), o, &bytes.Buffer{}); err != nil || !changed || got != "v1.1.0" {
		t.Fatalf("a build after v1.0.0 is not updated to v1.1.0: %q %v %v", got, changed, err)
	}
}

func TestIndexSkipsDraftsPrereleasesAndBadTags(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`[{"tag_name":"v9.0.0","draft":true},{"tag_name":"v8.0.0","prerelease":true},{"tag_name":"v7.0.0-rc.1"},{"tag_name":"latest"},{"tag_name":"v1.2.3","assets":[{"name":"x","browser_download_url":"https://example.com/x"}]},{"tag_name":"v1.10.0"}]`))
	}))
	defer srv.Close()
	rel, err := latest(context.Background(), Options{IndexURL: srv.URL})
	if err != nil || rel.Tag != "v1.10.0" {
		t.Fatalf("latest = %+v, %v; want v1.10.0", rel, err)
	}
	if _, err := latest(context.Background(), Options{IndexURL: "http://example.com/releases"}); err == nil || !strings.Contains(err.Error(), "only https") {
		t.Errorf("plain http to a remote host: %v", err)
	}
}

func TestNoticeAtMostOnceADay(t *testing.T) {
	f := newFixture(t, "v1.0.0", "v1.1.0")
	o := f.install("v1.0.0")
	state := filepath.Join(t.TempDir(), "cache", "update-check.json")
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i, at := range []time.Time{now, now.Add(time.Hour), now.Add(23 * time.Hour)} {
		notice, err := Notice(context.Background(), o, state, at)
		if err != nil || !strings.Contains(notice, "v1.1.0 is available") {
			t.Fatalf("check %d: %q, %v", i, notice, err)
		}
	}
	if n := f.indexHit.Load(); n != 1 {
		t.Errorf("three checks within a day asked the index %d times, want 1", n)
	}
	if _, err := Notice(context.Background(), o, state, now.Add(25*time.Hour)); err != nil || f.indexHit.Load() != 2 {
		t.Errorf("a day later: %v, index asked %d times, want 2", err, f.indexHit.Load())
	}
	o.CurrentVersion = "v1.1.0"
	if notice, _ := Notice(context.Background(), o, state, now.Add(25*time.Hour)); notice != "" {
		t.Errorf("notice at the newest version: %q", notice)
	}

	// A release signed with another key is no newer release.
	f2 := newFixture(t, "v1.0.0")
	_, other, _ := minisign.GenerateKey(nil)
	f2.add("v3.0.0", other)
	o2 := f2.install("v1.0.0")
	notice, err := Notice(context.Background(), o2, filepath.Join(t.TempDir(), "s.json"), now)
	if notice != "" || err == nil {
		t.Errorf("unsigned newer release: notice %q, err %v", notice, err)
	}
}

func TestRefusal(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	none := func(string) bool { return false }
	docker := func(p string) bool { return p == "/.dockerenv" }
	for name, c := range map[string]struct {
		getenv func(string) string
		exists func(string) bool
		allow  bool
		want   string
	}{
		"host":                       {env(), none, false, ""},
		"image":                      {env(ImageEnv, "1"), none, true, "container image"},
		"pod":                        {env("KUBERNETES_SERVICE_HOST", "10.0.0.1"), none, true, "Kubernetes pod"},
		"container":                  {env(), docker, false, "/.dockerenv"},
		"container, allowed by flag": {env(), docker, true, ""},
	} {
		err := Refusal(c.getenv, c.exists, c.allow)
		if (c.want == "") != (err == nil) || (err != nil && (!strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrManaged))) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
