/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package webhookcert_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// cp is envtest's API server; the webhook configurations created here never
// intercept anything (see inertWebhookConfiguration).
var cp *testenv.ControlPlane

func TestWebhookCert(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "webhookcert suite (envtest)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	cp = testenv.StartControlPlane()
})

var _ = AfterSuite(func() {
	cp.Stop()
})
