package dockerbackend

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

// stubDriver is the Docker driver with Create and Remove stubbed while
// stub is set: Create registers a sandbox whose container does not exist,
// and Remove waits for removeGate (when set) and succeeds. Everything else
// is the real driver.
type stubDriver struct {
	*driver
	mu         sync.Mutex
	stub       bool
	next       int
	removeGate chan struct{}
}

func (s *stubDriver) Create(ctx context.Context, caller contract.Caller, req contract.CreateRequest) (string, contract.Sandbox, error) {
	s.mu.Lock()
	if !s.stub {
		s.mu.Unlock()
		return s.driver.Create(ctx, caller, req)
	}
	s.next++
	id := fmt.Sprintf("%s%d", caller.ID, s.next)
	s.mu.Unlock()
	return "code-sandbox-test-absent-" + id, contract.Sandbox{ID: id, Image: req.Image, Network: contract.NetworkNone}, nil
}

func (s *stubDriver) Remove(ctx context.Context, h session.Handle, how session.Removal) error {
	s.mu.Lock()
	stub, gate := s.stub, s.removeGate
	s.mu.Unlock()
	if !stub {
		return s.driver.Remove(ctx, h, how)
	}
	if gate != nil {
		<-gate
	}
	return nil
}

// stubbedBackend is a Backend whose creates are stubbed (stubDriver), so
// that what the tests check is decided before any Docker call.
func stubbedBackend(opts Options) (*Backend, *stubDriver) {
	GinkgoHelper()
	client, err := dockerruntime.New(dockerruntime.Options{ManagedBy: dockerruntime.ManagedByMCP, CallTimeout: 2 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	opts.Client = client
	opts.Logger = slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	b, err := New(opts)
	Expect(err).NotTo(HaveOccurred())
	stub := &stubDriver{driver: b.driver, stub: true}
	b.Manager = session.New(stub, session.Options{MaxSandboxes: opts.MaxSandboxes, IdleTimeout: opts.IdleTimeout, Clock: opts.Clock, Logger: opts.Logger})
	return b, stub
}

func createStub(b *Backend, caller contract.Caller) string {
	GinkgoHelper()
	sb, err := b.Create(context.Background(), caller, contract.CreateRequest{Image: "img:1", Lifetime: time.Hour})
	Expect(err).NotTo(HaveOccurred())
	return sb.ID
}

var _ = Describe("the Docker backend's registry", Label("unit"), func() {
	alice, bob := contract.Caller{ID: "alice"}, contract.Caller{ID: "bob"}

	It("counts an identity's sandboxes against MaxSandboxes", func(ctx SpecContext) {
		b, _ := stubbedBackend(Options{MaxSandboxes: 2})
		createStub(b, alice)
		createStub(b, alice)
		_, err := b.Create(ctx, alice, contract.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError(contract.ErrQuota))
		Expect(err).To(MatchError(ContainSubstring("you already have 2 sandboxes; the limit is 2")))
		Expect(err.Error()).To(Equal("sandbox quota exceeded: you already have 2 sandboxes; the limit is 2"))
	})

	It("does not count other identities' sandboxes or ones being removed", func(ctx SpecContext) {
		b, stub := stubbedBackend(Options{MaxSandboxes: 1, PullPolicy: dockerruntime.PullNever})
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := b.driver.docker.Ping(pctx); err != nil {
			Skip("no Docker Engine: " + err.Error())
		}
		a1 := createStub(b, alice)
		createStub(b, bob)
		// alice's sandbox is being removed while she creates another.
		stub.removeGate = make(chan struct{})
		stopped := make(chan error, 1)
		go func() { stopped <- b.Stop(context.Background(), alice, a1) }()
		Eventually(func() error {
			_, err := b.Get(ctx, alice, a1)
			return err
		}).Should(MatchError(contract.ErrNotFound))
		stub.mu.Lock()
		stub.stub = false
		stub.mu.Unlock()
		// Past the quota, Create reaches Docker, which has no such image.
		_, err := b.Create(ctx, alice, contract.CreateRequest{Image: "code-sandbox-test/absent-image:1"})
		Expect(err).To(MatchError(contract.ErrImageNotFound))
		_, err = b.Create(ctx, bob, contract.CreateRequest{Image: "code-sandbox-test/absent-image:1"})
		Expect(err).To(MatchError(contract.ErrQuota))
		stub.mu.Lock()
		stub.stub = true
		stub.mu.Unlock()
		close(stub.removeGate)
		Eventually(stopped).Should(Receive(Succeed()))
	})

	It("shows a sandbox only to its owner: to anyone else it does not exist", func(ctx SpecContext) {
		b, _ := stubbedBackend(Options{})
		a1 := createStub(b, alice)
		var sink strings.Builder
		_, err := b.Get(ctx, bob, a1)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = b.Exec(ctx, bob, a1, execio.Request{Shell: "true"}, nil)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = b.Upload(ctx, bob, a1, "/app", strings.NewReader(""), execio.UploadLimits{MaxBytes: 1, MaxEntries: 1})
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = b.Download(ctx, bob, a1, "/app/x", &sink, 1)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = b.Logs(ctx, bob, a1, contract.LogsOptions{})
		Expect(err).To(MatchError(contract.ErrNotFound))
		Expect(b.Stop(ctx, bob, a1)).To(MatchError(contract.ErrNotFound))
		list, err := b.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
		// Still alice's: she stops it (the stubbed removal) exactly once.
		Expect(b.Stop(ctx, alice, a1)).To(Succeed(), "bob's sandbox_stop touched alice's sandbox")
		Expect(b.Stop(ctx, alice, a1)).To(MatchError(contract.ErrNotFound))
	})

	It("reports a container removed outside the server as not found, and forgets it", func(ctx SpecContext) {
		b, _ := stubbedBackend(Options{})
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := b.driver.docker.Ping(pctx); err != nil {
			Skip("no Docker Engine: " + err.Error())
		}
		a1 := createStub(b, alice)
		_, err := b.Get(ctx, alice, a1)
		Expect(err).To(MatchError(contract.ErrNotFound))
		Expect(err).To(MatchError(ContainSubstring("its container was removed outside this server")))
		list, err := b.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty(), "forgotten")
	})
})
