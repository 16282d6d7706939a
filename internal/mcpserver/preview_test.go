package mcpserver

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// A token verifies only as signed: any change to its payload or signature,
// another version, or the passing of its expiry refuses it.
func TestPreviewToken(t *testing.T) {
	now := time.Now()
	c := previewClaims{Owner: "id-1", ID: "sbx-a", Port: 8000, Expires: now.Add(time.Hour).Unix(), Nonce: "n1"}
	tok := signPreview(c)
	got, err := verifyPreview(tok, now)
	if err != nil || got != c {
		t.Fatalf("a fresh token: %+v, %v", got, err)
	}
	parts := strings.Split(tok, ".")
	forged := c
	forged.ID = "sbx-b"
	b, _ := json.Marshal(forged)
	for name, bad := range map[string]string{
		"payload for another sandbox": parts[0] + "." + base64.RawURLEncoding.EncodeToString(b) + "." + parts[2],
		"signature flipped":           parts[0] + "." + parts[1] + "." + flip(parts[2]),
		"signature dropped":           parts[0] + "." + parts[1] + ".",
		"version changed":             "v2." + parts[1] + "." + parts[2],
		"extra part":                  tok + ".x",
		"empty":                       "",
		"oversized":                   tok + strings.Repeat("A", 2000),
	} {
		if _, err := verifyPreview(bad, now); !errors.Is(err, errPreviewToken) {
			t.Errorf("%s: want errPreviewToken, got %v", name, err)
		}
	}
	if _, err := verifyPreview(tok, now.Add(time.Hour)); !errors.Is(err, contract.ErrNotExposed) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("at its expiry: want an expired ErrNotExposed, got %v", err)
	}
	// Another owner key signs differently.
	if err := contract.SetIdentityKey([]byte("another owner key, 32 bytes long")); err != nil {
		t.Fatal(err)
	}
	if _, err := verifyPreview(tok, now); !errors.Is(err, errPreviewToken) {
		t.Errorf("under another owner key: want errPreviewToken, got %v", err)
	}
}

func flip(s string) string {
	b := []byte(s)
	if b[0] == 'A' {
		b[0] = 'B'
	} else {
		b[0] = 'A'
	}
	return string(b)
}
