package execio

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("ForwardTar", Label("unit"), func() {
	archive := func(sizes ...int) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		Expect(tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})).To(Succeed())
		for i, size := range sizes {
			Expect(tw.WriteHeader(&tar.Header{Name: "d/" + string(rune('a'+i)), Typeflag: tar.TypeReg, Size: int64(size), Mode: 0o644})).To(Succeed())
			_, err := tw.Write(bytes.Repeat([]byte("x"), size))
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(tw.Close()).To(Succeed())
		return buf.Bytes()
	}

	It("copies the stream byte for byte and counts what it carries", func() {
		in := archive(10, 10)
		var out bytes.Buffer
		stats, err := ForwardTar(context.Background(), bytes.NewReader(in), &out, 20)
		Expect(err).NotTo(HaveOccurred())
		Expect(stats).To(Equal(TransferStats{Files: 2, Dirs: 1, Bytes: 20}))
		Expect(out.Bytes()).To(Equal(in), "the end-of-archive padding is forwarded too")
	})

	It("stops with ErrTooLarge at the file that passes the cap, naming it", func() {
		_, err := ForwardTar(context.Background(), bytes.NewReader(archive(10, 10)), io.Discard, 15)
		Expect(err).To(MatchError(ErrTooLarge))
		Expect(err.Error()).To(ContainSubstring(`"d/b"`))
	})

	It("bounds the framing too, so a stream of empty entries cannot flood the receiver", func() {
		sizes := make([]int, 40000) // 40000 headers of 512 bytes: about 20 MiB of framing
		_, err := ForwardTar(context.Background(), bytes.NewReader(archive(sizes...)), io.Discard, 1)
		Expect(err).To(MatchError(ErrTooLarge))
		Expect(err.Error()).To(ContainSubstring("including tar headers"))
	})

	It("reports a corrupt archive and a failing writer", func() {
		_, err := ForwardTar(context.Background(), bytes.NewReader([]byte("not a tar archive at all, but long enough to be read as a header block......")), io.Discard, 100)
		Expect(err).To(HaveOccurred())
		_, err = ForwardTar(context.Background(), bytes.NewReader(archive(10)), brokenWriter{}, 100)
		Expect(err).To(MatchError(ContainSubstring("writing the download")))
	})
})

type brokenWriter struct{}

func (brokenWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }
