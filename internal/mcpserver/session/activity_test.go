package session

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Activity", Label("unit"), func() {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	const idle = 10 * time.Minute

	DescribeTable("ReapReason",
		func(a Activity, want string) {
			Expect(a.ReapReason(now, idle)).To(Equal(want))
		},
		Entry("fresh", Activity{ExpiresAt: now.Add(time.Hour), LastUsedAt: now}, ""),
		Entry("past its lifetime", Activity{ExpiresAt: now.Add(-time.Second), LastUsedAt: now}, "lifetime over"),
		Entry("past its lifetime even while busy", Activity{ExpiresAt: now.Add(-time.Second), LastUsedAt: now, InFlight: 1}, "lifetime over"),
		Entry("unused for longer than the idle timeout", Activity{ExpiresAt: now.Add(time.Hour), LastUsedAt: now.Add(-idle - time.Second)}, "idle"),
		Entry("unused for exactly the idle timeout", Activity{ExpiresAt: now.Add(time.Hour), LastUsedAt: now.Add(-idle)}, ""),
		Entry("long unused but running a command", Activity{ExpiresAt: now.Add(time.Hour), LastUsedAt: now.Add(-idle - time.Second), InFlight: 1}, ""),
		Entry("already being removed", Activity{ExpiresAt: now.Add(-time.Second), Removing: true}, ""),
	)

	It("looks often enough for short idle timeouts and at most every 30 s", func() {
		Expect(ReapInterval(2 * time.Second)).To(Equal(time.Second))
		Expect(ReapInterval(time.Minute)).To(Equal(15 * time.Second))
		Expect(ReapInterval(time.Hour)).To(Equal(30 * time.Second))
	})
})
