package dockerbackend

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// registryBackend is a Backend whose registry the tests fill by hand. What
// they check is decided before any Docker call, except the removals reap
// makes (of containers that do not exist), so Docker need not run.
func registryBackend(opts Options) *Backend {
	GinkgoHelper()
	client, err := dockerruntime.New(dockerruntime.Options{ManagedBy: dockerruntime.ManagedByMCP, CallTimeout: 2 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	opts.Client = client
	opts.Logger = slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	b, err := New(opts)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// addEntry registers a sandbox of owner, last used and created at now,
// expiring after an hour.
func addEntry(b *Backend, id, owner string, now time.Time) *entry {
	e := &entry{id: id, owner: owner, dockerID: "code-sandbox-test-absent-" + id, image: "img:1", network: mcpserver.NetworkNone, createdAt: now,
		Activity: mcpserver.Activity{LastUsedAt: now, ExpiresAt: now.Add(time.Hour)}}
	b.mu.Lock()
	b.sandboxes[id] = e
	b.mu.Unlock()
	return e
}

func (b *Backend) has(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.sandboxes[id]
	return ok
}

var _ = Describe("the Docker backend's registry", Label("unit"), func() {
	alice, bob := mcpserver.Caller{ID: "alice"}, mcpserver.Caller{ID: "bob"}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

	It("counts an identity's sandboxes and creates in flight against MaxSandboxes", func(ctx SpecContext) {
		b := registryBackend(Options{MaxSandboxes: 2})
		addEntry(b, "a1", "alice", t0)
		addEntry(b, "a2", "alice", t0)
		_, err := b.Create(ctx, alice, mcpserver.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError(mcpserver.ErrQuota))
		Expect(err).To(MatchError(ContainSubstring("you already have 2 sandboxes; the limit is 2")))

		b.mu.Lock()
		delete(b.sandboxes, "a2")
		b.pending["alice"] = 1
		b.mu.Unlock()
		_, err = b.Create(ctx, alice, mcpserver.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError(mcpserver.ErrQuota), "a create in flight counts")
	})

	It("does not count other identities' sandboxes or ones being removed", func(ctx SpecContext) {
		b := registryBackend(Options{MaxSandboxes: 1, PullPolicy: dockerruntime.PullNever})
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := b.docker.Ping(pctx); err != nil {
			Skip("no Docker Engine: " + err.Error())
		}
		addEntry(b, "a1", "alice", t0).Removing = true
		addEntry(b, "b1", "bob", t0)
		// Past the quota, Create reaches Docker, which has no such image.
		_, err := b.Create(ctx, alice, mcpserver.CreateRequest{Image: "code-sandbox-test/absent-image:1"})
		Expect(err).To(MatchError(mcpserver.ErrImageNotFound))
		_, err = b.Create(ctx, bob, mcpserver.CreateRequest{Image: "code-sandbox-test/absent-image:1"})
		Expect(err).To(MatchError(mcpserver.ErrQuota))
	})

	It("shows a sandbox only to its owner: to anyone else it does not exist", func(ctx SpecContext) {
		b := registryBackend(Options{})
		addEntry(b, "a1", "alice", t0)
		var sink strings.Builder
		_, err := b.Get(ctx, bob, "a1")
		Expect(err).To(MatchError(mcpserver.ErrNotFound))
		_, err = b.Exec(ctx, bob, "a1", execio.Request{Shell: "true"}, nil)
		Expect(err).To(MatchError(mcpserver.ErrNotFound))
		_, err = b.Upload(ctx, bob, "a1", "/app", strings.NewReader(""), execio.UploadLimits{MaxBytes: 1, MaxEntries: 1})
		Expect(err).To(MatchError(mcpserver.ErrNotFound))
		_, err = b.Download(ctx, bob, "a1", "/app/x", &sink, 1)
		Expect(err).To(MatchError(mcpserver.ErrNotFound))
		_, err = b.Logs(ctx, bob, "a1", mcpserver.LogsOptions{})
		Expect(err).To(MatchError(mcpserver.ErrNotFound))
		Expect(b.Stop(ctx, bob, "a1")).To(MatchError(mcpserver.ErrNotFound))
		list, err := b.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
		Expect(b.has("a1")).To(BeTrue())
		Expect(b.sandboxes["a1"].Removing).To(BeFalse(), "bob's sandbox_stop touched alice's sandbox")
		Expect(b.sandboxes["a1"].LastUsedAt).To(Equal(t0), "bob's calls counted as use of alice's sandbox")
	})

	It("reaps idle sandboxes by the clock, never busy ones, and expired ones even when busy", func(ctx SpecContext) {
		clock := &fakeClock{t: t0}
		b := registryBackend(Options{IdleTimeout: 10 * time.Minute, Clock: clock.Now})
		addEntry(b, "idle", "alice", t0)
		addEntry(b, "busy", "alice", t0).InFlight = 1
		addEntry(b, "used", "alice", t0)
		expiring := addEntry(b, "expiring", "alice", t0)
		expiring.InFlight, expiring.ExpiresAt = 1, t0.Add(15*time.Minute)

		clock.Advance(6 * time.Minute)
		_, err := b.lookup(alice, "used")
		Expect(err).NotTo(HaveOccurred())
		Expect(b.sandboxes["used"].LastUsedAt).To(Equal(t0.Add(6*time.Minute)), "a call marks the sandbox used at the clock's time")

		clock.Advance(5 * time.Minute) // t0+11m
		b.reap(clock.Now())
		Expect(b.has("idle")).To(BeFalse(), "unused for 11m with a 10m idle timeout")
		Expect(b.has("busy")).To(BeTrue(), "a sandbox running a command is never idle")
		Expect(b.has("used")).To(BeTrue(), "used 5m ago")
		Expect(b.has("expiring")).To(BeTrue())
		_, err = b.Get(ctx, alice, "idle")
		Expect(err).To(MatchError(mcpserver.ErrNotFound))

		clock.Advance(5 * time.Minute) // t0+16m
		b.reap(clock.Now())
		Expect(b.has("expiring")).To(BeFalse(), "past its lifetime, busy or not")
		Expect(b.has("busy")).To(BeTrue())
		Expect(b.has("used")).To(BeTrue(), "idle for exactly the timeout, not longer")

		// The end of an operation counts as use.
		done := b.busy(b.sandboxes["busy"])
		clock.Advance(time.Minute)
		done()
		b.mu.Lock()
		b.sandboxes["busy"].InFlight--
		b.mu.Unlock()
		Expect(b.sandboxes["busy"].LastUsedAt).To(Equal(t0.Add(17 * time.Minute)))

		clock.Advance(time.Second)
		b.reap(clock.Now())
		Expect(b.has("used")).To(BeFalse())
		Expect(b.has("busy")).To(BeTrue(), "used 1s ago")
		clock.Advance(10*time.Minute + time.Second)
		b.reap(clock.Now())
		Expect(b.has("busy")).To(BeFalse())
	})
})
