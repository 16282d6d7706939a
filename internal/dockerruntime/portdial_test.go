package dockerruntime

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"

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

	Context("through an exec of helper dial (no idle resident helper)", func() {
		BeforeEach(func() {
			rt.awaitPrestart(ctx, id)
			rt.dropStandby(id)
		})

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

	// countServer is a one-connection server on port that answers with the
	// count of bytes it received, once its input ends (busybox nc).
	countServer := func(port int) string {
		return fmt.Sprintf(`printf '#!/bin/sh\nwc -c\n' > /tmp/count.sh && chmod +x /tmp/count.sh &&
			(nc -l -p %d -e /tmp/count.sh </dev/null >/dev/null 2>&1 &) && sleep 0.3`, port)
	}

	Context("through the sandbox's idle resident helper", func() {
		hasStandby := func() bool {
			rt.standby.mu.Lock()
			defer rt.standby.mu.Unlock()
			return rt.standby.idle[id] != nil
		}
		BeforeEach(func() {
			// A command leaves its resident helper parked as the idle one.
			res, err := rt.RunCommand(ctx, id, execio.Request{Command: []string{"true"}}, io.Discard, io.Discard)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(BeZero())
			Expect(hasStandby()).To(BeTrue())
		})

		It("relays an exchange and a MiB intact with no exec of its own, and parks a new idle helper", func() {
			conn, err := rt.DialPort(ctx, id, 8080)
			Expect(err).NotTo(HaveOccurred())
			Expect(survivors(ctx, id, "helper dial")).To(BeEmpty(), "the connection took an exec")
			Expect(survivors(ctx, id, "helper serve")).NotTo(BeEmpty())
			_, err = fmt.Fprint(conn, "GET /big.bin HTTP/1.0\r\nHost: x\r\n\r\n")
			Expect(err).NotTo(HaveOccurred())
			Expect(conn.CloseWrite()).To(Succeed())
			resp, err := io.ReadAll(conn)
			Expect(err).NotTo(HaveOccurred())
			Expect(conn.Close()).To(Succeed())
			_, body, ok := strings.Cut(string(resp), "\r\n\r\n")
			Expect(ok).To(BeTrue(), "%.200q", resp)
			Expect(body).To(HaveLen(1 << 20))
			Expect(fmt.Sprintf("%x", sha256.Sum256([]byte(body)))).To(Equal(strings.TrimSpace(sh(ctx, id, "cat /tmp/sum").Stdout)))
			// The helper that held the connection exits; its successor is
			// parked for the next command or connection.
			Eventually(hasStandby).WithTimeout(10 * time.Second).Should(BeTrue())
			Eventually(func() []string { return survivors(ctx, id, "helper serve") }).WithTimeout(10 * time.Second).Should(HaveLen(1))
			res, err := rt.RunCommand(ctx, id, execio.Request{Command: []string{"echo", "after"}}, io.Discard, io.Discard)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(BeZero())
		})

		It("sends the client's bytes to the server, half-close included (an upload)", func() {
			Expect(sh(ctx, id, countServer(9090)).Code).To(BeZero())
			conn, err := rt.DialPort(ctx, id, 9090)
			Expect(err).NotTo(HaveOccurred())
			defer conn.Close()
			n, err := conn.Write(make([]byte, 200<<10))
			Expect(err).NotTo(HaveOccurred())
			Expect(n).To(Equal(200 << 10))
			Expect(conn.CloseWrite()).To(Succeed())
			out, err := io.ReadAll(conn)
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.TrimSpace(string(out))).To(Equal(fmt.Sprint(200 << 10)))
		})

		It("names the port when nothing listens", func() {
			_, err := rt.DialPort(ctx, id, 9)
			Expect(errors.Is(err, ErrPortClosed)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("port 9"))
			Expect(survivors(ctx, id, "helper dial")).To(BeEmpty())
			Eventually(hasStandby).WithTimeout(10 * time.Second).Should(BeTrue())
		})

		It("serves connections at once: the first through the helper, the others through execs", func() {
			first, err := rt.DialPort(ctx, id, 8080)
			Expect(err).NotTo(HaveOccurred())
			defer first.Close()
			second, err := rt.DialPort(ctx, id, 8080)
			Expect(err).NotTo(HaveOccurred())
			defer second.Close()
			for _, c := range []PortConn{second, first} {
				_, err := fmt.Fprint(c, "GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
				Expect(err).NotTo(HaveOccurred())
				Expect(c.CloseWrite()).To(Succeed())
				resp, err := io.ReadAll(c)
				Expect(err).NotTo(HaveOccurred())
				Expect(string(resp)).To(HaveSuffix("hello-from-the-sandbox\n"))
			}
		})

		It("ends the helper in the sandbox when the caller closes mid-connection", func() {
			Expect(sh(ctx, id, countServer(9091)).Code).To(BeZero())
			conn, err := rt.DialPort(ctx, id, 9091)
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() []string { return survivors(ctx, id, "helper serve") }).WithTimeout(10 * time.Second).Should(HaveLen(2))
			Expect(conn.Close()).To(Succeed())
			Eventually(func() []string { return survivors(ctx, id, "helper serve") }).WithTimeout(10 * time.Second).Should(HaveLen(1))
			_, err = conn.Read(make([]byte, 1))
			Expect(err).To(HaveOccurred())
		})
	})
})
