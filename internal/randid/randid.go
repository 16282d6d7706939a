/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package randid makes random identifiers: exec and run IDs, container and
// Sandbox name suffixes, session IDs, temporary file names. It is a leaf that
// every layer may import, so each of them does not grow its own.
package randid

import (
	"crypto/rand"
	"encoding/hex"
)

// Hex returns n random bytes from crypto/rand as 2n lowercase hex digits,
// which suit Docker and Kubernetes names alike. crypto/rand.Read never
// returns an error (it crashes the program rather than return weak bytes).
func Hex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
