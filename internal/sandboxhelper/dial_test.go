package sandboxhelper

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

var _ = Describe("dial", unit, func() {
	It("takes --port=N with N in 1-65535 only", func() {
		for _, ok := range []string{"1", "8080", "65535"} {
			port, err := parseDial([]string{"--port=" + ok})
			Expect(err).NotTo(HaveOccurred())
			Expect(strconv.Itoa(port)).To(Equal(ok))
		}
		for _, bad := range [][]string{{}, {"--port=0"}, {"--port=65536"}, {"--port=-1"}, {"--port=http"}, {"--port="}, {"8080"}, {"--port=80", "--port=81"}} {
			_, err := parseDial(bad)
			Expect(err).To(HaveOccurred(), "%q", bad)
		}
	})

	It("relays stdin to the port and the port to stdout, after saying connected", func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		defer ln.Close()
		go func() {
			defer GinkgoRecover()
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			in, _ := io.ReadAll(c) // until the helper passes stdin's end on
			_, _ = c.Write([]byte("got:" + string(in)))
		}()
		var stdout, stderr bytes.Buffer
		code := dial(ln.Addr().(*net.TCPAddr).Port, strings.NewReader("hello"), &stdout, &stderr)
		Expect(code).To(BeZero(), stderr.String())
		Expect(stderr.String()).To(Equal(helperproto.DialConnected))
		Expect(stdout.String()).To(Equal("got:hello"))
	})

	It("reports a closed port as port_closed, naming it", func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		var stdout, stderr bytes.Buffer
		code := dial(port, strings.NewReader(""), &stdout, &stderr)
		Expect(code).To(Equal(helperproto.ExitPortClosed))
		he, ok := helperproto.ParseError(stderr.Bytes())
		Expect(ok).To(BeTrue(), stderr.String())
		Expect(he.Kind).To(Equal(helperproto.KindPortClosed))
		Expect(he.Message).To(ContainSubstring("port " + strconv.Itoa(port)))
		Expect(stdout.Len()).To(BeZero())
	})
})
