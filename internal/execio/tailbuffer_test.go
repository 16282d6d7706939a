package execio

import (
	"bytes"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("TailBuffer", Label("unit"), func() {
	It("keeps the last max bytes across writes of every size, and counts what it drops", func() {
		tb := NewTailBuffer(10)
		var all bytes.Buffer
		for _, w := range []string{"abc", "defgh", "ij", "klmnopq", "r", strings.Repeat("s", 25), "tu"} {
			n, err := tb.Write([]byte(w))
			Expect(err).NotTo(HaveOccurred())
			Expect(n).To(Equal(len(w)))
			all.WriteString(w)
			want := all.Bytes()[max(0, all.Len()-10):]
			Expect(tb.Bytes()).To(Equal(want))
			Expect(tb.Written()).To(Equal(int64(all.Len())))
			Expect(tb.Dropped()).To(Equal(int64(all.Len() - len(want))))
		}
		Expect(tb.Truncated()).To(BeTrue())
		Expect(tb.String()).To(Equal(string(all.Bytes()[all.Len()-10:])))
	})

	It("never allocates more than max however much is written", func() {
		tb := NewTailBuffer(100 << 10)
		chunk := bytes.Repeat([]byte("x"), 7<<10)
		for range 1000 {
			_, _ = tb.Write(chunk)
		}
		Expect(tb.buf).To(HaveCap(100 << 10))
		Expect(tb.Len()).To(Equal(100 << 10))
		Expect(TailMarker("stdout", tb.Dropped())).To(ContainSubstring("stdout: the first"))
	})

	It("keeps nothing with max 0 but still counts", func() {
		tb := NewTailBuffer(0)
		_, _ = tb.Write([]byte("hello"))
		Expect(tb.Len()).To(Equal(0))
		Expect(tb.Dropped()).To(Equal(int64(5)))
	})
})
