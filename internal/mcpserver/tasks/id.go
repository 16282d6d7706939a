package tasks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// A task ID names a background process handle and what is needed to find
// it again on any replica, with nothing kept in any server process:
//
//	t1.<payload: base64url of the JSON of Ref>.<mac: base64url>
//
// mac is HMAC-SHA-256 under a key derived from the owner key (which the
// replicas share, see contract.DerivedKey) over the version, the caller's
// identity and the payload. So an ID verifies only for the identity it was
// minted for: presented by anyone else, or changed in any byte, it is as
// unknown as a made-up one. The handle inside is itself a random,
// server-minted name, and the backend still checks that the sandbox is the
// caller's on every call, as it does for exec_poll.

const (
	idVersion  = "t1"
	keyPurpose = "tasks-extension task-id v1"
	// maxIDLen bounds what is parsed at all.
	maxIDLen = 512
)

// Ref is what a task ID carries: the process it stands for and the facts
// about the call that started it that its result needs.
type Ref struct {
	// ContainerID is the sandbox (the tools' container_id).
	ContainerID string `json:"c"`
	// Handle is the background process's handle in that sandbox.
	Handle string `json:"h"`
	// TimeoutSeconds is the command's timeout (0: none), so that a kill
	// at the timeout reads as timed_out.
	TimeoutSeconds int64 `json:"t,omitempty"`
	// ExpiresAt is when the sandbox ends at the latest (Unix seconds; 0:
	// unknown), which bounds the task's life (ttlMs).
	ExpiresAt int64 `json:"e,omitempty"`
}

// ErrUnknownTask is a task ID that does not verify for the caller:
// malformed, tampered with, minted for another identity or by a server
// with another owner key. Callers cannot tell these apart.
var ErrUnknownTask = errors.New("task not found")

func idMAC(identity, payload string) []byte {
	mac := hmac.New(sha256.New, contract.DerivedKey(keyPurpose))
	for _, part := range []string{idVersion, identity, payload} {
		// Length-prefixed: no two different tuples write the same bytes.
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		mac.Write(n[:])
		mac.Write([]byte(part))
	}
	return mac.Sum(nil)
}

// Mint returns the task ID of ref for identity.
func Mint(identity string, ref Ref) string {
	b, _ := json.Marshal(ref)
	payload := base64.RawURLEncoding.EncodeToString(b)
	return idVersion + "." + payload + "." + base64.RawURLEncoding.EncodeToString(idMAC(identity, payload))
}

// Parse verifies id for identity and returns what it names.
func Parse(identity, id string) (Ref, error) {
	var ref Ref
	if identity == "" || len(id) > maxIDLen {
		return ref, ErrUnknownTask
	}
	parts := strings.Split(id, ".")
	if len(parts) != 3 || parts[0] != idVersion {
		return ref, ErrUnknownTask
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, idMAC(identity, parts[1])) {
		return ref, ErrUnknownTask
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(b, &ref) != nil || ref.ContainerID == "" || ref.Handle == "" || ref.TimeoutSeconds < 0 {
		return Ref{}, ErrUnknownTask
	}
	return ref, nil
}
