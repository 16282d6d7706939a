package contract

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync/atomic"
)

type callerKey struct{}

// WithCaller returns ctx carrying the authenticated caller. The transports
// set it (stdio: LocalCaller; HTTP: the authenticator's identity) before a
// request reaches a tool.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller set by WithCaller.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok && c.ID != ""
}

// LocalIdentity is the identity of the single stdio client.
const LocalIdentity = "local"

// IdentityHash is a short, stable, label-safe digest of an identity, so that
// identities (which may be e-mail addresses or contain characters labels
// refuse) can be recorded on containers and Sandboxes without being spelled
// out. It is an HMAC keyed with the server's owner key (SetIdentityKey): an
// unkeyed hash anyone could compute for any identity, and so find (or, where
// labels are writable, forge) another identity's ownership records.
func IdentityHash(identity string) string {
	if identity == LocalIdentity {
		return LocalIdentity
	}
	mac := hmac.New(sha256.New, *identityKey.Load())
	mac.Write([]byte(identity))
	return "id-" + hex.EncodeToString(mac.Sum(nil)[:8])
}

// identityKey keys IdentityHash. Until SetIdentityKey is called it is a
// random key of this process's own, so that no two processes agree on an
// identity's hash by accident.
var identityKey atomic.Pointer[[]byte]

func init() {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	identityKey.Store(&k)
}

// DerivedKey is a key for purpose derived from the owner key (an HMAC of
// the purpose under it): what the server's replicas share besides the
// identity hashes, such as the key of the HTTP transport's self-verifying
// session IDs, without using the owner key itself for two things.
func DerivedKey(purpose string) []byte {
	mac := hmac.New(sha256.New, *identityKey.Load())
	mac.Write([]byte("code-sandbox-mcp derived key\x00"))
	mac.Write([]byte(purpose))
	return mac.Sum(nil)
}

// MinIdentityKeyBytes is the shortest owner key accepted.
const MinIdentityKeyBytes = 16

// SetIdentityKey sets the key of IdentityHash. Changing it changes every
// identity's hash: Sandboxes labelled under the old key are no longer
// anyone's (see docs/mcp.md, "Owner key").
func SetIdentityKey(key []byte) error {
	if len(key) < MinIdentityKeyBytes {
		return fmt.Errorf("the owner key is %d bytes long; it must have at least %d (for example: openssl rand -hex 32)", len(key), MinIdentityKeyBytes)
	}
	k := bytes.Clone(key)
	identityKey.Store(&k)
	return nil
}

// LoadIdentityKey reads the owner key from path (surrounding white space
// trimmed) and sets it. A file that does not exist leaves the process's
// random key in place and reports generated true: the key then lasts as
// long as the process.
func LoadIdentityKey(path string) (generated bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the owner key: %w", err)
	}
	if err := SetIdentityKey(bytes.TrimSpace(b)); err != nil {
		return false, fmt.Errorf("owner key file %s: %w", path, err)
	}
	return false, nil
}

// IsKubernetesUser reports whether the caller is a Kubernetes identity
// (authenticated by TokenReview), whose rights RBAC decides.
func (c Caller) IsKubernetesUser() bool { return c.Username != "" }
