package execio

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// rawHeader builds one 512-byte tar header block by hand, as a forger
// writing into the helper's stdout would: archive/tar's writer refuses to
// write sparse entries.
func rawHeader(name string, typeflag byte, size int64, gnu bool, realsize int64) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], "00000000000\x00")
	b[156] = typeflag
	if gnu {
		copy(b[257:265], "ustar  \x00")
		// No sparse entries: the whole file is one hole of realsize
		// bytes, in base-256 so it can be astronomically large.
		b[483] = 0x80
		binary.BigEndian.PutUint64(b[487:495], uint64(realsize))
	} else {
		copy(b[257:265], "ustar\x0000")
	}
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func paxRecord(k, v string) string {
	rec := " " + k + "=" + v + "\n"
	n := len(rec)
	for {
		l := len(fmt.Sprint(n)) + len(rec)
		if l == n {
			return fmt.Sprint(n) + rec
		}
		n = l
	}
}

func pad(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

// gnuSparseTar is an old-GNU-format sparse entry (type 'S') whose whole
// content is a hole of 2^60 bytes: archive/tar yields it as zeros without
// reading input.
func gnuSparseTar() []byte {
	out := rawHeader("hole", tar.TypeGNUSparse, 0, true, 1<<60)
	return append(out, make([]byte, 1024)...)
}

// paxSparseTar is a PAX (GNU sparse 1.0) regular file whose content is a
// hole of realsize bytes, the sparse map (no data) in its first block.
func paxSparseTar(realsize int64) []byte {
	recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "hole") + paxRecord("GNU.sparse.realsize", fmt.Sprint(realsize))
	out := rawHeader("PaxHeaders/hole", tar.TypeXHeader, int64(len(recs)), false, 0)
	out = append(out, pad([]byte(recs))...)
	out = append(out, rawHeader("GNUSparseFile.0/hole", tar.TypeReg, 512, false, 0)...)
	out = append(out, pad([]byte("0\n"))...)
	return append(out, make([]byte, 1024)...)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	Expect(syscall.Getrusage(syscall.RUSAGE_SELF, &ru)).To(Succeed())
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var _ = Describe("ForwardTar on a forged sparse stream", Label("unit"), func() {
	// The helper's stdout is writable by the sandbox user; a sandbox can
	// put any bytes in a download's stream.
	DescribeTable("refuses a sparse entry promptly, before reading its holes",
		func(stream []byte, maxBytes int64) {
			cpu0, t0 := cpuTime(), time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := ForwardTar(context.Background(), bytes.NewReader(stream), io.Discard, maxBytes)
				done <- err
			}()
			var err error
			returned := false
			select {
			case err = <-done:
				returned = true
			case <-time.After(5 * time.Second):
			}
			cpu, wall := cpuTime()-cpu0, time.Since(t0)
			fmt.Fprintf(GinkgoWriter, "forged sparse stream: returned=%v after %v wall, %v CPU (the process's)\n", returned, wall, cpu)
			Expect(returned).To(BeTrue(), "ForwardTar is still spinning on the holes")
			Expect(err).To(MatchError(ErrUnsupportedEntry))
			Expect(err.Error()).To(ContainSubstring(`"hole" is a sparse file`))
		},
		Entry("old GNU sparse (type S), a 2^60-byte hole", gnuSparseTar(), DefaultDownloadLimit),
		Entry("PAX GNU sparse 1.0, a hole within the cap", paxSparseTar(50<<20), DefaultDownloadLimit),
	)

	It("stops reading when the request's context ends", func() {
		pr, pw := io.Pipe()
		defer pw.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := ForwardTar(ctx, pr, io.Discard, 100)
			done <- err
		}()
		// A header that promises content that never comes.
		go func() { _, _ = pw.Write(rawHeader("slow", tar.TypeReg, 10, false, 0)) }()
		cancel()
		go func() { _, _ = pw.Write(make([]byte, 1)) }() // wakes the blocked read
		var err error
		Eventually(done, 5*time.Second).Should(Receive(&err))
		Expect(err).To(MatchError(context.Canceled))
	})

	It("refuses hard links and devices but forwards symbolic links (the node API's download contract)", func() {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		Expect(tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})).To(Succeed())
		Expect(tw.Close()).To(Succeed())
		stats, err := ForwardTar(context.Background(), bytes.NewReader(buf.Bytes()), io.Discard, 100)
		Expect(err).NotTo(HaveOccurred())
		Expect(stats).To(Equal(TransferStats{}))
		for _, h := range []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}, {Name: "c", Typeflag: tar.TypeChar}, {Name: "f", Typeflag: tar.TypeFifo}} {
			buf.Reset()
			tw := tar.NewWriter(&buf)
			Expect(tw.WriteHeader(h)).To(Succeed())
			Expect(tw.Close()).To(Succeed())
			_, err := ForwardTar(context.Background(), bytes.NewReader(buf.Bytes()), io.Discard, 100)
			Expect(err).To(MatchError(ErrUnsupportedEntry), h.Name)
		}
	})
})

var _ = Describe("EntryKind", Label("unit"), func() {
	It("refuses a PAX sparse file that archive/tar reports as a regular file", func() {
		tr := tar.NewReader(bytes.NewReader(paxSparseTar(1 << 20)))
		h, err := tr.Next()
		Expect(err).NotTo(HaveOccurred())
		Expect(h.Typeflag).To(Equal(byte(tar.TypeReg)))
		_, err = EntryKind(h)
		Expect(err).To(MatchError(ErrUnsupportedEntry))
	})
})
