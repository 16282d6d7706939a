package transport

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// Session IDs that any replica can verify, so that a 2025-11-25 client's
// session initialized on one replica works on every other one and survives
// the replica's restart, with nothing shared but the key (derived from the
// owner key, --owner-key-file, which the replicas already share):
//
//	s1-<issued: unix seconds, decimal>-<nonce: 16 hex>-<mac: 32 hex>
//
// mac is HMAC-SHA-256 (truncated to 128 bits) over the version, the issue
// time, the nonce and the identity the session was issued to, so an ID
// verifies only for that identity: presented by anyone else it is as
// unknown as a made-up one. It is no credential (every request still
// carries the bearer token); the binding keeps one identity from using, or
// ending, another's session. It holds only visible ASCII, as the transport
// requires.
//
// What mcp-go keeps per session in a process (server/session.go,
// client_info_store.go, streamable_http.go) is not needed to serve a
// session's requests: a request whose session this process never saw gets
// an ephemeral session that counts as initialized (streamableHttpSession.
// Initialized is always true). Per process remain a GET stream's session
// (server-to-client messages reach the replica holding the stream) and the
// level of logging/setLevel, which a client reaching another replica has to
// set again (the tools do not log to the client).

// MaxSessionAge is how long a session ID stays valid after it was issued:
// a client then initializes again (an unknown session gets 404, which the
// specification tells clients to answer with a new initialize).
const MaxSessionAge = 24 * time.Hour

// sessionClockSkew is how far in the future an issue time may lie (the
// replicas' clocks differ a little).
const sessionClockSkew = time.Minute

const (
	sessionIDVersion = "s1"
	sessionNonceHex  = 16
	sessionMACHex    = 32
	// maxSessionIDLen bounds what is parsed at all.
	maxSessionIDLen = 96
)

func sessionMAC(key []byte, issued, nonce, identity string) string {
	mac := hmac.New(sha256.New, key)
	for _, part := range []string{sessionIDVersion, issued, nonce, identity} {
		// Length-prefixed: no two different tuples write the same bytes.
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		mac.Write(n[:])
		mac.Write([]byte(part))
	}
	return hex.EncodeToString(mac.Sum(nil))[:sessionMACHex]
}

// newSessionID issues a session ID for identity at now.
func newSessionID(key []byte, identity string, now time.Time) string {
	issued := strconv.FormatInt(now.Unix(), 10)
	nonce := randid.Hex(sessionNonceHex / 2)
	return strings.Join([]string{sessionIDVersion, issued, nonce, sessionMAC(key, issued, nonce, identity)}, "-")
}

// Why a session ID does not verify (for logs and tests; callers all get
// the same 404).
var (
	errSessionMalformed = errors.New("malformed session ID")
	errSessionMAC       = errors.New("session ID not issued to this identity by a replica with this key")
	errSessionExpired   = errors.New("session ID expired")
)

// verifySessionID checks that id was issued to identity by a holder of key
// and is not older than MaxSessionAge at now.
func verifySessionID(key []byte, id, identity string, now time.Time) error {
	if len(id) > maxSessionIDLen || identity == "" {
		return errSessionMalformed
	}
	parts := strings.Split(id, "-")
	if len(parts) != 4 || parts[0] != sessionIDVersion {
		return errSessionMalformed
	}
	issued, nonce, mac := parts[1], parts[2], parts[3]
	if len(nonce) != sessionNonceHex || !isLowerHex(nonce) || len(mac) != sessionMACHex || !isLowerHex(mac) {
		return errSessionMalformed
	}
	// Decimal digits only (no sign, no leading zero): one issue time, one
	// spelling.
	if issued == "" || len(issued) > 19 || (len(issued) > 1 && issued[0] == '0') || strings.Trim(issued, "0123456789") != "" {
		return errSessionMalformed
	}
	secs, err := strconv.ParseInt(issued, 10, 64)
	if err != nil {
		return errSessionMalformed
	}
	if !hmac.Equal([]byte(mac), []byte(sessionMAC(key, issued, nonce, identity))) {
		return errSessionMAC
	}
	at := time.Unix(secs, 0)
	if at.After(now.Add(sessionClockSkew)) || now.Sub(at) > MaxSessionAge {
		return errSessionExpired
	}
	return nil
}

func isLowerHex(s string) bool {
	return strings.Trim(s, "0123456789abcdef") == ""
}
