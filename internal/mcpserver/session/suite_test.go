/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package session

import (
	"testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/leakcheck"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestSession(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "session suite (unit)")
	leakcheck.VerifyNone(t)
}
