package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// refuse) can be recorded on containers without being spelled out.
func IdentityHash(identity string) string {
	if identity == LocalIdentity {
		return LocalIdentity
	}
	sum := sha256.Sum256([]byte(identity))
	return "id-" + hex.EncodeToString(sum[:8])
}

// IsKubernetesUser reports whether the caller is a Kubernetes identity
// (authenticated by TokenReview), whose rights RBAC decides.
func (c Caller) IsKubernetesUser() bool { return c.Username != "" }
