//go:build !linux

package mcpmain

import "os"

// claimStdout keeps the real stdout for JSON-RPC and points os.Stdout at
// stderr, so that Go code printing to os.Stdout cannot corrupt the
// protocol.
func claimStdout() (*os.File, error) {
	out := os.Stdout
	os.Stdout = os.Stderr
	return out, nil
}
