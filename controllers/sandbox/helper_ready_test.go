/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

// A cold-created Sandbox is reported Ready only once the resident helper
// that CreateAndStart began is up, so the first command after Ready costs
// what a repeated one does (dockerruntime/prestart.go).
var _ = Describe("Sandbox resident helper", func() {
	It("is parked, not still starting, when a cold-created Sandbox turns Ready", func() {
		ns := newNamespace()
		node := testNodePrefix + "helper-ready"
		m := startManager(node, managerConfig{})
		rt, ok := m.reconciler.docker.(*dockerruntime.Client)
		Expect(ok).To(BeTrue())
		for i := range 3 {
			sbx := waitReady(createSandbox(newSandbox(ns, "helper-ready-"+string(rune('a'+i)), node)))
			id := sbx.Status.ContainerID
			Expect(rt.HelperStarting(id)).To(BeFalse(), "Ready while the helper was still starting")
			Expect(rt.HelperParked(id)).To(BeTrue(), "Ready without a parked helper")
		}
	})
})
