/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// cp is envtest's kube-apiserver and etcd with the CRDs, for the specs
// that run several backends ("replicas") against one API server; nil in
// the unit tier.
var cp *testenv.ControlPlane

func TestKubeBackend(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubebackend suite (unit + envtest)", tier.Config()...)
}

var _ = BeforeSuite(func() {
	if !tier.NeedsIntegration() {
		return
	}
	cp = testenv.StartControlPlane()
})

var _ = AfterSuite(func() {
	if cp != nil {
		cp.Stop()
	}
})
