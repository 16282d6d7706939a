/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("egressEventLimiter", Label("unit"), func() {
	It("lets one Event per key through per period, and never grows past its bound", func() {
		var l egressEventLimiter
		now := time.Unix(1000, 0)
		Expect(l.allow("a", now)).To(BeTrue())
		Expect(l.allow("a", now.Add(egressEventEvery-time.Millisecond))).To(BeFalse())
		Expect(l.allow("b", now)).To(BeTrue())
		Expect(l.allow("a", now.Add(egressEventEvery))).To(BeTrue())

		for i := range egressEventKeys * 2 {
			l.allow(fmt.Sprint("k", i), now.Add(egressEventEvery))
		}
		Expect(len(l.last)).To(BeNumerically("<=", egressEventKeys))
		// Once the old keys are stale, new ones get through again.
		Expect(l.allow("fresh", now.Add(3*egressEventEvery))).To(BeTrue())
	})
})
