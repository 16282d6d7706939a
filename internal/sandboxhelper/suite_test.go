/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxhelper

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/leakcheck"
)

func TestSandboxHelper(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "sandboxhelper suite (unit)")
	leakcheck.VerifyNone(t)
}
