/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package leakcheck fails a test run whose goroutines outlive it (with
// go.uber.org/goleak), for the packages that start goroutines of their own:
// a pump, reaper or watcher left running after its owner is closed is a
// leak in a long-lived server. It imports nothing from the module, so any
// test package may use it.
package leakcheck

import (
	"testing"

	"go.uber.org/goleak"
)

// ginkgo is what the Ginkgo runner itself leaves running after RunSpecs.
var ginkgo = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func2"),
}

// VerifyNone fails t when goroutines other than the runner's are still
// running. goleak retries for a while first, so goroutines that are
// already ending do not count. Call it after RunSpecs (or at the end of a
// plain test), with opts for goroutines that rightly live as long as the
// process.
func VerifyNone(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	goleak.VerifyNone(t, append(ginkgo, opts...)...)
}
