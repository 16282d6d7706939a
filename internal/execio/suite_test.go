/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package execio

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/leakcheck"
)

func TestExecIO(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "execio suite (unit)")
	leakcheck.VerifyNone(t)
}
