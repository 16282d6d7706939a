package snapshotstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

func payload(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func readAll(t *testing.T, s Store, ref string) ([]byte, error) {
	t.Helper()
	rc, err := s.Open(context.Background(), ref)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// roundTrip is what every Store must do.
func roundTrip(t *testing.T, s Store, foreignRefs []string) {
	ctx := context.Background()
	data := payload(t, 3<<20+17)
	ref, size, err := s.Put(ctx, "team-a/snap-1", bytes.NewReader(data))
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if size != int64(len(data)) {
		t.Fatalf("Put size %d, want %d", size, len(data))
	}
	got, err := readAll(t, s, ref)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("Open(%s): %d bytes, err %v; want the %d bytes put", ref, len(got), err, len(data))
	}
	// Two puts of one key are two refs.
	ref2, _, err := s.Put(ctx, "team-a/snap-1", strings.NewReader("other"))
	if err != nil {
		t.Fatalf("second Put: %v", err)
	}
	if ref2 == ref {
		t.Fatalf("two different puts gave one ref %s", ref)
	}
	if err := s.Delete(ctx, ref); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := readAll(t, s, ref); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open after Delete: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, ref); err != nil {
		t.Fatalf("second Delete: %v, want nil", err)
	}
	if got, err := readAll(t, s, ref2); err != nil || string(got) != "other" {
		t.Fatalf("the other ref after a Delete: %q, %v", got, err)
	}
	for _, key := range []string{"", "../etc", "/abs", "UPPER", "a//b", "a/../b", strings.Repeat("a", 129), "a\x00b"} {
		if _, _, err := s.Put(ctx, key, strings.NewReader("x")); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("Put with key %q: %v, want ErrInvalidRef", key, err)
		}
	}
	for _, bad := range append(foreignRefs, "", "../../etc/passwd", "dir:../x.tar", ref+"/..") {
		if _, err := s.Open(ctx, bad); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("Open(%q): %v, want ErrInvalidRef", bad, err)
		}
		if err := s.Delete(ctx, bad); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("Delete(%q): %v, want ErrInvalidRef", bad, err)
		}
	}
}

func TestDir(t *testing.T) {
	root := filepath.Join(t.TempDir(), "snaps")
	d, err := NewDir(root, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	roundTrip(t, d, []string{"127.0.0.1:5000/x/y@sha256:" + strings.Repeat("a", 64), "dir:snap-" + strings.Repeat("A", 32) + ".tar"})

	info, _ := os.Stat(root)
	if info.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %04o, want 0700", info.Mode().Perm())
	}
	ref, _, err := d.Put(context.Background(), "k", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(root, strings.TrimPrefix(ref, "dir:")))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %04o, want 0600", fi.Mode().Perm())
	}

	// Too large: nothing is left behind, not even the temporary file.
	if _, _, err := d.Put(context.Background(), "big", bytes.NewReader(make([]byte, 8<<20+1))); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put over the limit: %v, want ErrTooLarge", err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 2 { // the round trip's second snapshot and k
		t.Errorf("after a refused Put the directory holds %d entries, want 2", len(ents))
	}
	// A file grown behind the store's back is refused on Open.
	if err := os.WriteFile(filepath.Join(root, strings.TrimPrefix(ref, "dir:")), make([]byte, 8<<20+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, d, ref); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Open of an oversized file: %v, want ErrTooLarge", err)
	}
	// A link planted in the store's place is not followed.
	lref := "dir:snap-" + strings.Repeat("b", 32) + ".tar"
	if err := os.Symlink("/etc/passwd", filepath.Join(root, strings.TrimPrefix(lref, "dir:"))); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, d, lref); err == nil {
		t.Error("Open followed a symlink out of the store")
	}

	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := NewDir(open, 0); err == nil || !strings.Contains(err.Error(), "0700") {
		t.Errorf("NewDir on a 0755 directory: %v, want a refusal naming 0700", err)
	}
}

func TestRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Debian's docker-registry")
	}
	addr := testenv.StartRegistry(t)
	r, err := NewRegistry(addr+"/sandbox-snapshots", RegistryOptions{MaxBytes: 8 << 20, SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	digest := "@sha256:" + strings.Repeat("a", 64)
	roundTrip(t, r, []string{
		"other.example:5000/sandbox-snapshots/team-a/snap-1" + digest, // another registry
		addr + "/elsewhere/team-a/snap-1" + digest,                    // outside the base
		addr + "/sandbox-snapshots" + digest,                          // the base itself
		addr + "/sandbox-snapshots/team-a/snap-1:latest",              // a tag, not a digest
		"dir:snap-" + strings.Repeat("a", 32) + ".tar",
	})

	ctx := context.Background()
	// The stored image is one uncompressed layer holding the tar as given.
	data := []byte("a tar, as far as the store cares")
	ref, _, err := r.Put(ctx, "team-b/s", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, addr+"/sandbox-snapshots/team-b/s@sha256:") {
		t.Errorf("ref %s is not BASE/KEY@digest", ref)
	}
	// Over the limit on Put, and on Open for a larger store's snapshot.
	if _, _, err := r.Put(ctx, "big", bytes.NewReader(make([]byte, 8<<20+1))); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Put over the limit: %v, want ErrTooLarge", err)
	}
	big, err := NewRegistry(addr+"/sandbox-snapshots", RegistryOptions{MaxBytes: 16 << 20, SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	bigRef, _, err := big.Put(ctx, "big", bytes.NewReader(make([]byte, 8<<20+1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, r, bigRef); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Open of a snapshot over the limit: %v, want ErrTooLarge", err)
	}
	// A digest nobody pushed.
	if _, err := readAll(t, r, addr+"/sandbox-snapshots/team-b/s"+digest); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open of an unknown digest: %v, want ErrNotFound", err)
	}

	for _, base := range []string{"", "http://" + addr + "/x", addr, addr + "/x:tag", addr + "/x@sha256:" + strings.Repeat("a", 64), addr + "/UPPER"} {
		if _, err := NewRegistry(base, RegistryOptions{}); err == nil {
			t.Errorf("NewRegistry(%q) was accepted", base)
		}
	}
}

// A registry that is not on loopback is never spoken to in plain HTTP,
// even where go-containerregistry would (an RFC 1918 address).
func TestRegistryTLSUnlessLoopback(t *testing.T) {
	var seen []string
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		seen = append(seen, req.URL.Scheme+"://"+req.URL.Host)
		return nil, errors.New("no network in this test")
	})
	for _, c := range []struct{ host, scheme string }{
		{"10.1.2.3:5000", "https"}, {"192.168.0.9", "https"}, {"registry.local:5000", "https"},
		{"127.0.0.1:5000", "http"}, {"localhost:5000", "http"}, {"[::1]:5000", "http"},
	} {
		seen = nil
		r, err := NewRegistry(c.host+"/snaps", RegistryOptions{Transport: rt, SpoolDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		_, _, _ = r.Put(context.Background(), "k", strings.NewReader("x"))
		if len(seen) == 0 {
			t.Fatalf("%s: no request made", c.host)
		}
		plain := false
		for _, s := range seen {
			plain = plain || strings.HasPrefix(s, "http://")
		}
		// go-containerregistry tries TLS first everywhere; plain HTTP
		// must follow for loopback and never happen elsewhere.
		if plain != (c.scheme == "http") {
			t.Errorf("%s: requests %v; plain HTTP expected: %v", c.host, seen, c.scheme == "http")
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
