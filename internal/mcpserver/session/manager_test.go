package session

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

var (
	alice = contract.Caller{ID: "alice"}
	bob   = contract.Caller{ID: "bob"}
	t0    = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
)

func newManager(d Driver, clock *fakeClock, opts Options) *Manager {
	opts.Clock = clock.Now
	opts.Logger = slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	return New(d, opts)
}

func create(m *Manager, caller contract.Caller, lifetime time.Duration) contract.Sandbox {
	GinkgoHelper()
	sb, err := m.Create(context.Background(), caller, contract.CreateRequest{Image: "img:1", Lifetime: lifetime})
	Expect(err).NotTo(HaveOccurred())
	return sb
}

// holds reports whether the Manager has the sandbox in its registry.
func (m *Manager) holds(owner, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.entries[key{owner, id}]
	return ok
}

func (m *Manager) activity(owner, id string) Activity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[key{owner, id}].Activity
}

var _ = Describe("Manager", Label("unit"), func() {
	var (
		d     *fakeDriver
		clock *fakeClock
	)
	BeforeEach(func() {
		d = newFakeDriver()
		clock = &fakeClock{t: t0}
	})

	It("records a new sandbox with the clock's time and the request's lifetime", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		sb := create(m, alice, time.Hour)
		Expect(sb.ID).To(Equal("sbx-1"))
		Expect(sb.CreatedAt).To(Equal(t0))
		Expect(sb.LastUsedAt).To(Equal(t0))
		Expect(sb.ExpiresAt).To(Equal(t0.Add(time.Hour)))
		clock.Advance(time.Minute)
		got, err := m.Get(ctx, alice, sb.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.CreatedAt).To(Equal(t0), "the driver is handed what was recorded at create")
		Expect(got.LastUsedAt).To(Equal(t0.Add(time.Minute)), "a call marks the sandbox used at the clock's time")
		Expect(d.handles[len(d.handles)-1].Ref).To(Equal("ref-1"), "the driver gets its own reference back")
	})

	It("shows a sandbox only to its owner: to anyone else it does not exist", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		id := create(m, alice, time.Hour).ID
		clock.Advance(time.Minute)
		var sink strings.Builder
		_, err := m.Get(ctx, bob, id)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = m.Exec(ctx, bob, id, execio.Request{Shell: "true"}, nil)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = m.Upload(ctx, bob, id, "/app", strings.NewReader(""), execio.UploadLimits{MaxBytes: 1, MaxEntries: 1})
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = m.Download(ctx, bob, id, "/app/x", &sink, 1)
		Expect(err).To(MatchError(contract.ErrNotFound))
		_, err = m.Logs(ctx, bob, id, contract.LogsOptions{})
		Expect(err).To(MatchError(contract.ErrNotFound))
		Expect(m.Stop(ctx, bob, id)).To(MatchError(contract.ErrNotFound))
		list, err := m.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
		Expect(d.callList()).To(Equal([]string{"Create"}), "bob's calls reached the driver")

		a := m.activity("alice", id)
		Expect(a.Removing).To(BeFalse(), "bob's sandbox_stop touched alice's sandbox")
		Expect(a.LastUsedAt).To(Equal(t0), "bob's calls counted as use of alice's sandbox")
		list, err = m.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(1))
		Expect(list[0].ID).To(Equal(id))
		Expect(d.isLive("ref-1")).To(BeTrue())
	})

	It("lists a caller's sandboxes oldest first, with their use", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		first := create(m, alice, time.Hour).ID
		clock.Advance(time.Second)
		second := create(m, alice, time.Hour).ID
		clock.Advance(time.Second)
		_, err := m.Exec(ctx, alice, first, execio.Request{Shell: "true"}, func(string, []byte) {})
		Expect(err).NotTo(HaveOccurred())
		list, err := m.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(2))
		Expect([]string{list[0].ID, list[1].ID}).To(Equal([]string{first, second}))
		Expect(list[0].LastUsedAt).To(Equal(t0.Add(2 * time.Second)))
		Expect(list[1].LastUsedAt).To(Equal(t0.Add(time.Second)))
	})

	It("holds each identity to MaxSandboxes, counting creates in flight, under concurrent creates", func(ctx SpecContext) {
		const limit, tries = 3, 10
		d.createGate, d.creating = make(chan struct{}), make(chan struct{}, tries)
		m := newManager(d, clock, Options{MaxSandboxes: limit})
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			ok, quota int
			messages  []string
		)
		for range tries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				_, err := m.Create(ctx, alice, contract.CreateRequest{Image: "img:1", Lifetime: time.Hour})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, contract.ErrQuota):
					quota++
					messages = append(messages, err.Error())
				default:
					Fail("unexpected error: " + err.Error())
				}
			}()
		}
		// limit creates reach the driver and wait there; the rest are
		// refused meanwhile, counting those in flight.
		for range limit {
			Eventually(d.creating).Should(Receive())
		}
		Eventually(func() int { mu.Lock(); defer mu.Unlock(); return quota }).Should(Equal(tries - limit))
		Consistently(d.creating, 50*time.Millisecond).ShouldNot(Receive())
		for _, msg := range messages {
			Expect(msg).To(Equal("sandbox quota exceeded: you already have 3 sandboxes; the limit is 3"))
		}
		close(d.createGate)
		wg.Wait()
		Expect(ok).To(Equal(limit))
		Expect(m.pending).To(BeEmpty(), "pending creates are counted back")

		_, err := m.Create(ctx, alice, contract.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError(contract.ErrQuota), "the created sandboxes count")
		create(m, bob, time.Hour)
	})

	It("does not count sandboxes being removed, and counts a failed create back", func(ctx SpecContext) {
		m := newManager(d, clock, Options{MaxSandboxes: 1, LimitError: func(have, limit int) error {
			return errors.New("custom refusal")
		}})
		id := create(m, alice, time.Hour).ID
		_, err := m.Create(ctx, alice, contract.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError("custom refusal"))

		// A create that fails leaves no pending count behind.
		cctx, cancel := context.WithCancel(ctx)
		d.createGate = make(chan struct{})
		Expect(m.Stop(ctx, alice, id)).To(Succeed())
		cancel()
		_, err = m.Create(cctx, alice, contract.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError(context.Canceled))
		d.createGate = nil
		create(m, alice, time.Hour)
	})

	It("reaps idle sandboxes by the clock, never busy ones, and expired ones even when busy", func(ctx SpecContext) {
		d.execGate, d.execing = make(chan struct{}), make(chan struct{}, 1)
		m := newManager(d, clock, Options{IdleTimeout: 10 * time.Minute})
		idle := create(m, alice, time.Hour).ID
		busy := create(m, alice, time.Hour).ID
		used := create(m, alice, time.Hour).ID
		expiring := create(m, alice, 15*time.Minute).ID

		var execs sync.WaitGroup
		for _, id := range []string{busy, expiring} {
			execs.Add(1)
			go func() {
				defer execs.Done()
				defer GinkgoRecover()
				_, _ = m.Exec(ctx, alice, id, execio.Request{Shell: "sleep"}, func(string, []byte) {})
			}()
			Eventually(d.execing).Should(Receive())
		}

		clock.Advance(6 * time.Minute)
		_, err := m.Get(ctx, alice, used)
		Expect(err).NotTo(HaveOccurred())

		clock.Advance(5 * time.Minute) // t0+11m
		m.reap(clock.Now())
		Expect(m.holds("alice", idle)).To(BeFalse(), "unused for 11m with a 10m idle timeout")
		Expect(d.isLive("ref-1")).To(BeFalse(), "the driver removed it")
		Expect(m.holds("alice", busy)).To(BeTrue(), "a sandbox running a command is never idle")
		Expect(m.holds("alice", used)).To(BeTrue(), "used 5m ago")
		Expect(m.holds("alice", expiring)).To(BeTrue())
		_, err = m.Get(ctx, alice, idle)
		Expect(err).To(MatchError(contract.ErrNotFound))

		clock.Advance(5 * time.Minute) // t0+16m
		m.reap(clock.Now())
		Expect(m.holds("alice", expiring)).To(BeFalse(), "past its lifetime, busy or not")
		Expect(m.holds("alice", busy)).To(BeTrue())
		Expect(m.holds("alice", used)).To(BeTrue(), "idle for exactly the timeout, not longer")

		// The end of an operation counts as use.
		clock.Advance(time.Minute) // t0+17m
		close(d.execGate)
		execs.Wait()
		Expect(m.activity("alice", busy).LastUsedAt).To(Equal(t0.Add(17 * time.Minute)))
		Expect(m.activity("alice", busy).InFlight).To(BeZero())

		clock.Advance(time.Second)
		m.reap(clock.Now())
		Expect(m.holds("alice", used)).To(BeFalse())
		Expect(m.holds("alice", busy)).To(BeTrue(), "used 1s ago")
		clock.Advance(10*time.Minute + time.Second)
		m.reap(clock.Now())
		Expect(m.holds("alice", busy)).To(BeFalse())
		Expect(d.callList()).To(ContainElements("Reap "+idle, "Reap "+expiring, "Reap "+used, "Reap "+busy))
	})

	It("pauses a sandbox idle for IdlePause, resumes it before the next exec, and still reaps it at IdleTimeout", func(ctx SpecContext) {
		m := newManager(d, clock, Options{IdleTimeout: 10 * time.Minute, IdlePause: 2 * time.Minute})
		sleepy := create(m, alice, time.Hour)
		awake := create(m, alice, time.Hour).ID

		clock.Advance(90 * time.Second)
		_, err := m.Exec(ctx, alice, awake, execio.Request{Shell: "true"}, func(string, []byte) {})
		Expect(err).NotTo(HaveOccurred())
		clock.Advance(time.Minute) // sleepy idle 2m30s, awake 1m
		m.reap(clock.Now())
		Expect(d.isPaused("ref-1")).To(BeTrue(), "idle for longer than IdlePause")
		Expect(m.activity("alice", sleepy.ID).Paused).To(BeTrue())
		Expect(d.isPaused("ref-2")).To(BeFalse(), "used a minute ago")
		m.reap(clock.Now())
		Expect(d.callList()).To(HaveEach(Not(Equal("Pause " + awake))))
		Expect(countOf(d.callList(), "Pause "+sleepy.ID)).To(Equal(1), "a paused sandbox is not paused again")

		// The next exec thaws it first, transparently.
		var out string
		_, err = m.Exec(ctx, alice, sleepy.ID, execio.Request{Shell: "echo back"}, func(_ string, p []byte) { out += string(p) })
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("echo back"))
		Expect(d.isPaused("ref-1")).To(BeFalse())
		Expect(m.activity("alice", sleepy.ID).Paused).To(BeFalse())
		Expect(d.callList()).To(ContainElements("Resume "+sleepy.ID, "Exec "+sleepy.ID))

		// Uploads and downloads resume too; Get and Logs do not need to.
		clock.Advance(3 * time.Minute)
		m.reap(clock.Now())
		Expect(d.isPaused("ref-1")).To(BeTrue())
		_, err = m.Get(ctx, alice, sleepy.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(d.isPaused("ref-1")).To(BeTrue())
		_, err = m.Download(ctx, alice, sleepy.ID, "/app/", io.Discard, 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(d.isPaused("ref-1")).To(BeFalse())

		// Paused or not, an unused sandbox goes at the idle timeout.
		clock.Advance(11 * time.Minute)
		m.reap(clock.Now())
		Expect(m.holds("alice", sleepy.ID)).To(BeFalse())
		Expect(m.holds("alice", awake)).To(BeFalse())
	})

	It("keeps a sandbox running whose pause failed, and never pauses one running a command", func(ctx SpecContext) {
		d.execGate, d.execing = make(chan struct{}), make(chan struct{}, 1)
		m := newManager(d, clock, Options{IdleTimeout: 10 * time.Minute, IdlePause: time.Minute})
		busy := create(m, alice, time.Hour).ID
		failing := create(m, alice, time.Hour).ID
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer GinkgoRecover()
			_, _ = m.Exec(ctx, alice, busy, execio.Request{Shell: "sleep"}, func(string, []byte) {})
		}()
		Eventually(d.execing).Should(Receive())
		d.pauseErr = errors.New("docker said no")
		clock.Advance(2 * time.Minute)
		m.reap(clock.Now())
		Expect(d.callList()).NotTo(ContainElement("Pause " + busy))
		Expect(m.activity("alice", failing).Paused).To(BeFalse(), "the pause failed")
		close(d.execGate)
		<-done
		_, err := m.Exec(ctx, alice, failing, execio.Request{Shell: "true"}, func(string, []byte) {})
		Expect(err).NotTo(HaveOccurred())
		Expect(d.callList()).NotTo(ContainElement("Resume " + failing))
	})

	It("stops a paused sandbox as it is, without resuming it", func(ctx SpecContext) {
		m := newManager(d, clock, Options{IdleTimeout: 10 * time.Minute, IdlePause: time.Minute})
		id := create(m, alice, time.Hour).ID
		clock.Advance(2 * time.Minute)
		m.reap(clock.Now())
		Expect(d.isPaused("ref-1")).To(BeTrue())
		Expect(m.Stop(ctx, alice, id)).To(Succeed())
		Expect(d.callList()).To(ContainElement("Stop " + id))
		Expect(d.callList()).NotTo(ContainElement("Resume " + id))
		Expect(m.holds("alice", id)).To(BeFalse())
	})

	It("reaps on its own at the reap interval, then runs the driver's sweep", func() {
		m := newManager(d, clock, Options{IdleTimeout: 2 * time.Second})
		id := create(m, alice, time.Hour).ID
		clock.Advance(time.Minute)
		m.Start(context.Background())
		DeferCleanup(func() { Expect(m.Close(context.Background())).To(Succeed()) })
		Eventually(func() bool { return m.holds("alice", id) }, 5*time.Second).Should(BeFalse())
		Eventually(d.callList, 5*time.Second).Should(ContainElement("Sweep"))
	})

	It("forgets a sandbox the reaper failed to remove, for RemoveAll at Close", func(ctx SpecContext) {
		m := newManager(d, clock, Options{IdleTimeout: time.Minute})
		id := create(m, alice, time.Hour).ID
		d.removeErr = errors.New("docker said no")
		clock.Advance(2 * time.Minute)
		m.reap(clock.Now())
		Expect(d.callList()).To(ContainElement("Reap " + id))
		Expect(m.holds("alice", id)).To(BeFalse(), "not retried by every pass")
		Expect(d.isLive("ref-1")).To(BeTrue())
		Expect(m.Close(ctx)).To(Succeed())
		Expect(d.callList()).To(ContainElement("RemoveAll"))
		Expect(d.isLive("ref-1")).To(BeFalse(), "Close removed what the reaper left")
	})

	It("reports a failed sandbox_stop and keeps the sandbox usable, so that it can be retried", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		id := create(m, alice, time.Hour).ID
		d.removeErr = errors.New("docker said no")
		Expect(m.Stop(ctx, alice, id)).To(MatchError("docker said no"))
		Expect(m.activity("alice", id).Removing).To(BeFalse())
		_, err := m.Get(ctx, alice, id)
		Expect(err).NotTo(HaveOccurred())
		d.removeErr = nil
		Expect(m.Stop(ctx, alice, id)).To(Succeed())
		Expect(m.holds("alice", id)).To(BeFalse())
		Expect(d.isLive("ref-1")).To(BeFalse())
		Expect(m.Stop(ctx, alice, id)).To(MatchError(contract.ErrNotFound))
		Expect(d.callList()).To(HaveEach(Not(Equal("Reap " + id))))
	})

	It("does not let a sandbox being stopped be used or stopped twice", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		id := create(m, alice, time.Hour).ID
		m.mu.Lock()
		m.entries[key{"alice", id}].Removing = true
		m.mu.Unlock()
		_, err := m.Exec(ctx, alice, id, execio.Request{Shell: "true"}, nil)
		Expect(err).To(MatchError(contract.ErrNotFound))
		Expect(m.Stop(ctx, alice, id)).To(MatchError(contract.ErrNotFound))
		m.reap(clock.Now().Add(1000 * time.Hour))
		Expect(d.callList()).To(Equal([]string{"Create"}))
	})

	It("forgets a sandbox the driver finds gone", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		id := create(m, alice, time.Hour).ID
		d.getErr = Gone(errors.New("its container was removed outside this server"))
		_, err := m.Get(ctx, alice, id)
		Expect(err).To(MatchError("its container was removed outside this server"))
		Expect(m.holds("alice", id)).To(BeFalse())
		d.getErr = errors.New("docker is down")
		id2 := create(m, alice, time.Hour).ID
		_, err = m.Get(ctx, alice, id2)
		Expect(err).To(HaveOccurred())
		Expect(m.holds("alice", id2)).To(BeTrue(), "other failures keep the sandbox")
	})

	It("removes everything at Close and closes the driver", func(ctx SpecContext) {
		m := newManager(d, clock, Options{})
		a := create(m, alice, time.Hour).ID
		create(m, bob, time.Hour)
		d.removeAllErr = errors.New("one container is stuck")
		Expect(m.Close(ctx)).To(MatchError("one container is stuck"))
		Expect(d.callList()[len(d.callList())-2:]).To(Equal([]string{"RemoveAll", "Close"}))
		_, err := m.Get(ctx, alice, a)
		Expect(err).To(MatchError(contract.ErrNotFound))
		list, err := m.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
		Expect(m.Close(ctx)).To(MatchError("one container is stuck"), "Close may be called again")
	})

	It("leaves every sandbox in place at Close with KeepOnClose, and still closes the driver", func(ctx SpecContext) {
		m := newManager(d, clock, Options{KeepOnClose: true})
		a := create(m, alice, time.Hour).ID
		Expect(m.Close(ctx)).To(Succeed())
		Expect(d.callList()).NotTo(ContainElement("RemoveAll"), "a replica's stop removed sandboxes")
		Expect(d.callList()[len(d.callList())-1]).To(Equal("Close"))
		Expect(d.isLive("ref-1")).To(BeTrue(), "sandbox %s was removed at Close", a)
	})
})

var _ = Describe("Manager on a shared driver", Label("unit"), func() {
	var (
		s     *sharedDriver
		clock *fakeClock
	)
	BeforeEach(func() {
		s = &sharedDriver{fakeDriver: newFakeDriver(), others: map[string]int{}, deny: map[Op]bool{}, foreign: map[string]string{}}
		clock = &fakeClock{t: t0}
	})

	It("authorizes every operation before looking anything up", func(ctx SpecContext) {
		m := newManager(s, clock, Options{})
		for op := range map[Op]bool{OpCreate: true, OpGet: true, OpList: true, OpExec: true, OpUpload: true, OpDownload: true, OpLogs: true, OpStop: true} {
			s.deny[op] = true
		}
		calls := map[Op]func() error{
			OpCreate: func() error { _, err := m.Create(ctx, alice, contract.CreateRequest{}); return err },
			OpGet:    func() error { _, err := m.Get(ctx, alice, "x"); return err },
			OpList:   func() error { _, err := m.List(ctx, alice); return err },
			OpExec: func() error {
				_, err := m.Exec(ctx, alice, "x", execio.Request{Shell: "true"}, nil)
				return err
			},
			OpUpload: func() error {
				_, err := m.Upload(ctx, alice, "x", "/app", strings.NewReader(""), execio.UploadLimits{})
				return err
			},
			OpDownload: func() error { _, err := m.Download(ctx, alice, "x", "/app/x", io.Discard, 1); return err },
			OpLogs:     func() error { _, err := m.Logs(ctx, alice, "x", contract.LogsOptions{}); return err },
			OpStop:     func() error { return m.Stop(ctx, alice, "x") },
		}
		for op, call := range calls {
			Expect(call()).To(MatchError(ContainSubstring("may not "+string(op))), "%s", op)
		}
		Expect(s.callList()).To(BeEmpty(), "a refused operation reached the driver")
	})

	It("finds the caller's sandboxes of other instances through the driver, and counts them", func(ctx SpecContext) {
		s.foreign["mcp-b1"] = "bob"
		s.others["bob"] = 1
		m := newManager(s, clock, Options{MaxSandboxes: 2})
		sb, err := m.Get(ctx, bob, "mcp-b1")
		Expect(err).NotTo(HaveOccurred())
		Expect(sb.ID).To(Equal("mcp-b1"))
		Expect(s.handles[len(s.handles)-1].Ref).To(BeEmpty(), "not the Manager's: no Ref")
		_, err = m.Get(ctx, alice, "mcp-b1")
		Expect(err).To(MatchError(contract.ErrNotFound), "the driver's ownership check")
		create(m, bob, time.Hour)
		_, err = m.Create(ctx, bob, contract.CreateRequest{Image: "img:1"})
		Expect(err).To(MatchError("sandbox quota exceeded: you already have 2 sandboxes; the limit is 2"))
		list, err := m.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(2))
	})

	It("forgets its sandboxes that the driver's list no longer has", func(ctx SpecContext) {
		m := newManager(s, clock, Options{MaxSandboxes: 1})
		id := create(m, alice, time.Hour).ID
		s.mu.Lock()
		delete(s.live, "ref-1") // deleted outside this server
		s.mu.Unlock()
		list, err := m.List(ctx, alice)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())
		Expect(m.holds("alice", id)).To(BeFalse())
		create(m, alice, time.Hour)
	})
})

// countOf counts the elements of list equal to want.
func countOf(list []string, want string) int {
	n := 0
	for _, s := range list {
		if s == want {
			n++
		}
	}
	return n
}
