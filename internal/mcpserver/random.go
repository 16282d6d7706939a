package mcpserver

import (
	"crypto/rand"
	"encoding/hex"
)

// randomHex returns n random bytes in hex. crypto/rand never fails on
// supported platforms (it panics rather than return weak bytes).
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
