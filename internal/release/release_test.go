/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package release

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"aead.dev/minisign"
)

func TestPinnedKeyParses(t *testing.T) {
	k, err := TrustedKey()
	if err != nil {
		t.Fatal(err)
	}
	if publicKeyOverride != "" {
		t.Skip("built with a test key")
	}
	// Every copy of the key says the same.
	for _, f := range []string{"hack/install.sh", "hack/install.ps1", "docs/mcp.md", "docs/releasing.md"} {
		data, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte(PublicKey)) || !bytes.Contains(data, []byte(KeyID(k))) && strings.HasPrefix(f, "docs/") {
			t.Errorf("%s does not carry the pinned release key %s (ID %s)", f, PublicKey, KeyID(k))
		}
	}
}

func TestParseChecksumsRefusesWhatIsNotAChecksumFile(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	good := sum + "  a.tar.gz\n" + strings.Repeat("cd", 32) + "  b.zip\n"
	if got, err := ParseChecksums([]byte(good)); err != nil || len(got) != 2 || got["a.tar.gz"] != sum {
		t.Fatalf("good file: %v, %v", got, err)
	}
	for name, in := range map[string]string{
		"empty":          "",
		"one space":      sum + " a.tar.gz\n",
		"short sum":      sum[:60] + "  a.tar.gz\n",
		"upper case":     strings.ToUpper(sum) + "  a.tar.gz\n",
		"not hex":        strings.Repeat("zz", 32) + "  a.tar.gz\n",
		"path":           sum + "  ../a.tar.gz\n",
		"twice":          sum + "  a.tar.gz\n" + sum + "  a.tar.gz\n",
		"trailing junk":  good + "junk\n",
		"name with tab":  sum + "  a\t.tar.gz\n",
		"windows path":   sum + "  dir\\a.zip\n",
		"no name at all": sum + "  \n",
	} {
		if _, err := ParseChecksums([]byte(in)); err == nil {
			t.Errorf("%s: accepted %q", name, in)
		}
	}
}

func TestCheckVersion(t *testing.T) {
	for _, v := range []string{"v1.2.3", "v0.0.1", "v1.2.3-rc.1"} {
		if err := CheckVersion(v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
	for _, v := range []string{"", "1.2.3", "v1.2", "v1", "v1.2.3+meta", "dev", "v1.2.3/x", "v01.2.3"} {
		if err := CheckVersion(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

func TestSignVerify(t *testing.T) {
	pub, priv, err := minisign.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	sums := FormatChecksums(map[string]string{"b.zip": strings.Repeat("cd", 32), "a.tar.gz": strings.Repeat("ab", 32)})
	if !bytes.HasPrefix(sums, []byte(strings.Repeat("ab", 32))) {
		t.Errorf("checksums not sorted by name:\n%s", sums)
	}
	sig := SignChecksums(priv, sums, "v1.0.0", 1700000000)
	if again := SignChecksums(priv, sums, "v1.0.0", 1700000000); !bytes.Equal(sig, again) {
		t.Error("signing twice gave different bytes")
	}
	if _, err := VerifyChecksums(pub, sums, sig, "v1.0.0"); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyChecksums(pub, sums, sig, "v1.0.1"); !errors.Is(err, ErrSignature) {
		t.Errorf("another version: %v", err)
	}
	tampered := bytes.Replace(sums, []byte("ab"), []byte("ac"), 1)
	if _, err := VerifyChecksums(pub, tampered, sig, "v1.0.0"); !errors.Is(err, ErrSignature) {
		t.Errorf("tampered checksums: %v", err)
	}
	otherPub, _, _ := minisign.GenerateKey(nil)
	if _, err := VerifyChecksums(otherPub, sums, sig, "v1.0.0"); !errors.Is(err, ErrSignature) {
		t.Errorf("other key: %v", err)
	}
	// A changed trusted comment breaks the global signature.
	forged := bytes.Replace(sig, []byte("version:v1.0.0"), []byte("version:v9.0.0"), 1)
	if _, err := VerifyChecksums(pub, sums, forged, "v9.0.0"); !errors.Is(err, ErrSignature) {
		t.Errorf("forged trusted comment: %v", err)
	}

	// The reference minisign verifies it, where installed (hack/install.sh uses it).
	mini, err := exec.LookPath("minisign")
	if err != nil {
		t.Log("minisign is not installed; skipping the cross-check")
		return
	}
	dir := t.TempDir()
	pubText, _ := pub.MarshalText()
	lines := strings.Split(strings.TrimSpace(string(pubText)), "\n")
	for name, data := range map[string][]byte{"checksums.txt": sums, "checksums.txt.minisig": sig, "t.txt": tampered} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(mini, "-Vm", filepath.Join(dir, "checksums.txt"), "-P", lines[len(lines)-1]).CombinedOutput(); err != nil {
		t.Errorf("minisign -V: %v: %s", err, out)
	}
	if out, err := exec.Command(mini, "-Vm", filepath.Join(dir, "t.txt"), "-x", filepath.Join(dir, "checksums.txt.minisig"), "-P", lines[len(lines)-1]).CombinedOutput(); err == nil {
		t.Errorf("minisign -V accepted tampered checksums: %s", out)
	}
}

func TestArchivesAreReproducible(t *testing.T) {
	entries := []Entry{{Name: "z", Mode: 0o755, Data: []byte("bin")}, {Name: "LICENSE", Mode: 0o644, Data: []byte("MIT")}}
	for _, goos := range []string{"linux", "windows"} {
		var a, b bytes.Buffer
		if err := WriteArchive(&a, goos, 1700000000, entries); err != nil {
			t.Fatal(err)
		}
		if err := WriteArchive(&b, goos, 1700000000, []Entry{entries[1], entries[0]}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("%s: the same entries in another order gave other bytes", goos)
		}
		var c bytes.Buffer
		_ = WriteArchive(&c, goos, 1700000001, entries)
		if bytes.Equal(a.Bytes(), c.Bytes()) {
			t.Errorf("%s: the epoch does not reach the archive", goos)
		}
	}
}
