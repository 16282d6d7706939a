package session

import (
	"context"
	"fmt"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// DialPort makes fakeDriver a PortDialer: a connection that names the
// sandbox's Ref and port, for specs to check where a dial went.
func (f *fakeDriver) DialPort(_ context.Context, h Handle, port int) (contract.PortConn, error) {
	f.record("DialPort", &h)
	if !f.isLive(h.Ref) {
		return nil, Gone(fmt.Errorf("%w: %s", contract.ErrNotFound, h.ID))
	}
	a, b := net.Pipe()
	go func() {
		_, _ = fmt.Fprintf(b, "%s:%d", h.Ref, port)
		_ = b.Close()
	}()
	return pipeConn{a}, nil
}

type pipeConn struct{ net.Conn }

func (pipeConn) CloseWrite() error { return nil }

var _ = Describe("Manager exposures (expose_port)", Label("unit"), func() {
	var (
		d     *fakeDriver
		clock *fakeClock
		m     *Manager
	)
	BeforeEach(func() {
		d = newFakeDriver()
		clock = &fakeClock{t: t0}
		m = newManager(d, clock, Options{})
	})

	target := func(x contract.Exposure) string {
		GinkgoHelper()
		conn, err := m.DialExposed(context.Background(), x)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close()
		buf := make([]byte, 64)
		n, _ := conn.Read(buf)
		return string(buf[:n])
	}

	It("dials only the exposed port of the owner's sandbox, and only under the current nonce", func(ctx SpecContext) {
		a := create(m, alice, time.Hour).ID
		b := create(m, bob, time.Hour).ID
		Expect(m.Expose(ctx, alice, a, 8000, "n1", t0.Add(time.Hour))).To(Succeed())
		x := contract.Exposure{Owner: contract.IdentityHash("alice"), ID: a, Port: 8000, Nonce: "n1"}
		Expect(target(x)).To(Equal("ref-1:8000"))

		for name, bad := range map[string]contract.Exposure{
			"another port":           {Owner: x.Owner, ID: a, Port: 8001, Nonce: "n1"},
			"another nonce":          {Owner: x.Owner, ID: a, Port: 8000, Nonce: "n2"},
			"bob's sandbox as alice": {Owner: x.Owner, ID: b, Port: 8000, Nonce: "n1"},
			"alice's sandbox as bob": {Owner: contract.IdentityHash("bob"), ID: a, Port: 8000, Nonce: "n1"},
		} {
			_, err := m.DialExposed(ctx, bad)
			Expect(err).To(Or(MatchError(contract.ErrNotExposed), MatchError(contract.ErrNotFound)), name)
		}
		Expect(m.Expose(ctx, bob, a, 8000, "n9", t0.Add(time.Hour))).To(MatchError(contract.ErrNotFound), "bob exposed alice's port")
		_, err := m.DialExposed(ctx, contract.Exposure{Owner: contract.IdentityHash("bob"), ID: a, Port: 8000, Nonce: "n9"})
		Expect(err).To(HaveOccurred())
	})

	It("revokes on unexpose, on a newer exposure, at expiry and with the sandbox", func(ctx SpecContext) {
		a := create(m, alice, time.Hour).ID
		owner := contract.IdentityHash("alice")
		Expect(m.Expose(ctx, alice, a, 8000, "n1", t0.Add(time.Hour))).To(Succeed())
		Expect(m.Expose(ctx, alice, a, 8000, "n2", t0.Add(time.Hour))).To(Succeed())
		_, err := m.DialExposed(ctx, contract.Exposure{Owner: owner, ID: a, Port: 8000, Nonce: "n1"})
		Expect(err).To(MatchError(contract.ErrNotExposed))
		Expect(target(contract.Exposure{Owner: owner, ID: a, Port: 8000, Nonce: "n2"})).To(Equal("ref-1:8000"))

		revoked, err := m.Unexpose(ctx, alice, a, 8000)
		Expect(err).NotTo(HaveOccurred())
		Expect(revoked).To(BeTrue())
		_, err = m.DialExposed(ctx, contract.Exposure{Owner: owner, ID: a, Port: 8000, Nonce: "n2"})
		Expect(err).To(MatchError(contract.ErrNotExposed))
		revoked, err = m.Unexpose(ctx, alice, a, 8000)
		Expect(err).NotTo(HaveOccurred())
		Expect(revoked).To(BeFalse())

		Expect(m.Expose(ctx, alice, a, 8000, "n3", t0.Add(time.Minute))).To(Succeed())
		clock.Advance(time.Minute)
		_, err = m.DialExposed(ctx, contract.Exposure{Owner: owner, ID: a, Port: 8000, Nonce: "n3"})
		Expect(err).To(MatchError(contract.ErrNotExposed), "past its expiry")

		Expect(m.Expose(ctx, alice, a, 8000, "n4", t0.Add(time.Hour))).To(Succeed())
		Expect(m.Stop(ctx, alice, a)).To(Succeed())
		_, err = m.DialExposed(ctx, contract.Exposure{Owner: owner, ID: a, Port: 8000, Nonce: "n4"})
		Expect(err).To(MatchError(contract.ErrNotFound))
	})

	It("keeps a sandbox in use while a connection is open", func(ctx SpecContext) {
		a := create(m, alice, time.Hour).ID
		conn, err := m.DialPort(ctx, alice, a, 8000)
		Expect(err).NotTo(HaveOccurred())
		Expect(m.activity("alice", a).InFlight).To(Equal(1))
		Expect(conn.Close()).To(Succeed())
		Expect(conn.Close()).To(Succeed())
		Expect(m.activity("alice", a).InFlight).To(BeZero())
	})
})
