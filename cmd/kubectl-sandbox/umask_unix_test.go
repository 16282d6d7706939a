//go:build unix

package main

import (
	"syscall"

	. "github.com/onsi/ginkgo/v2"
)

// withUmask sets the process umask for the current spec; it reports
// whether the platform has one.
func withUmask(m int) bool {
	old := syscall.Umask(m)
	DeferCleanup(func() { syscall.Umask(old) })
	return true
}
