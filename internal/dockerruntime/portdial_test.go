package dockerruntime

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("DialPort", func() {
	var (
		ctx context.Context
		id  string
	)
	BeforeEach(func() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 90*time.Second)
		DeferCleanup(cancel)
		// The default spec has no network at all: the port is reached
		// through the helper in the sandbox's own namespace.
		ct, _ := startSandbox(ctx, nil)
		id = ct.ID
		res := sh(ctx, id, `mkdir -p /tmp/www && echo hello-from-the-sandbox > /tmp/www/index.html &&
			head -c 1048576 /dev/urandom > /tmp/www/big.bin && sha256sum /tmp/www/big.bin | cut -d' ' -f1 > /tmp/sum &&
			(httpd -f -p 127.0.0.1:8080 -h /tmp/www </dev/null >/dev/null 2>&1 &) &&
			for i in $(seq 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && break; sleep 0.1; done; cat /tmp/sum`)
		Expect(res.Code).To(BeZero(), "%v", res)
	})

	get := func(path string) (string, error) {
		conn, err := rt.DialPort(ctx, id, 8080)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path); err != nil {
			return "", err
		}
		Expect(conn.CloseWrite()).To(Succeed())
		body, err := io.ReadAll(conn)
		return string(body), err
	}

	It("relays an HTTP exchange to a loopback server in a sandbox with no network", func() {
		resp, err := get("/index.html")
		Expect(err).NotTo(HaveOccurred())
		Expect(resp).To(HavePrefix("HTTP/1.1 200 OK"))
		Expect(resp).To(HaveSuffix("hello-from-the-sandbox\n"))
	})

	It("relays a MiB intact", func() {
		want := strings.TrimSpace(sh(ctx, id, "cat /tmp/sum").Stdout)
		resp, err := get("/big.bin")
		Expect(err).NotTo(HaveOccurred())
		_, body, ok := strings.Cut(resp, "\r\n\r\n")
		Expect(ok).To(BeTrue())
		Expect(body).To(HaveLen(1 << 20))
		Expect(fmt.Sprintf("%x", sha256.Sum256([]byte(body)))).To(Equal(want))
	})

	It("names the port when nothing listens, and leaves no helper behind", func() {
		_, err := rt.DialPort(ctx, id, 9)
		Expect(errors.Is(err, ErrPortClosed)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("port 9"))
		Eventually(func() []string { return survivors(ctx, id, "helper dial") }).WithTimeout(5 * time.Second).Should(BeEmpty())
	})

	It("refuses ports outside 1-65535 before any exec", func() {
		for _, p := range []int{0, -1, 65536, 1 << 20} {
			_, err := rt.DialPort(ctx, id, p)
			Expect(errors.Is(err, ErrInvalidPort)).To(BeTrue(), "port %d: %v", p, err)
		}
	})

	It("ends the helper when the caller closes", func() {
		conn, err := rt.DialPort(ctx, id, 8080)
		Expect(err).NotTo(HaveOccurred())
		Expect(survivors(ctx, id, "helper dial")).NotTo(BeEmpty())
		Expect(conn.Close()).To(Succeed())
		Eventually(func() []string { return survivors(ctx, id, "helper dial") }).WithTimeout(10 * time.Second).Should(BeEmpty())
	})
})
