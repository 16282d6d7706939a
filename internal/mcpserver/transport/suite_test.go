/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package transport

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/leakcheck"
)

func TestTransport(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "mcpserver/transport suite (unit)")
	leakcheck.VerifyNone(t)
}
