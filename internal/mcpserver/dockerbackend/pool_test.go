/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// poolBackend is a started Docker backend with a warm pool of size on the
// busybox test image, removed (Close) when the spec ends.
func poolBackend(size int) *Backend {
	GinkgoHelper()
	return poolBackendWith(size, nil)
}

// poolBackendWith is poolBackend that calls before(b) before it starts b
// (and with it the pool's refill loop).
func poolBackendWith(size int, before func(*Backend)) *Backend {
	GinkgoHelper()
	client, err := dockerruntime.New(dockerruntime.Options{ManagedBy: dockerruntime.ManagedByMCP, CallTimeout: 30 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(pctx); err != nil {
		Skip("no Docker Engine: " + err.Error())
	}
	Expect(client.EnsureImage(pctx, testenv.BusyboxImage, dockerruntime.PullNever)).To(Succeed(), "run `make test-images`")
	// Specs run one after another, each removing its run's containers
	// (checked below), so they share this process's instance.
	inst, err := CurrentInstance()
	Expect(err).NotTo(HaveOccurred())
	b, err := New(Options{
		Client: client, Instance: inst, PullPolicy: dockerruntime.PullNever, MaxSandboxes: 10,
		Logger:   slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelDebug})),
		WarmPool: size, DefaultImage: testenv.BusyboxImage,
	})
	Expect(err).NotTo(HaveOccurred())
	if before != nil {
		before(b)
	}
	b.Start(context.Background())
	DeferCleanup(func(ctx context.Context) {
		Expect(b.Close(ctx)).To(Succeed())
		Expect(containersOfRun(ctx, b)).To(BeEmpty(), "Close left containers of this run")
	})
	return b
}

// containersOfRun lists every container with b's instance label.
func containersOfRun(ctx context.Context, b *Backend) []dockerruntime.Container {
	GinkgoHelper()
	list, err := b.driver.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: b.driver.node})
	Expect(err).NotTo(HaveOccurred())
	return list
}

// idleMembers is the pool's idle members' container IDs.
func idleMembers(b *Backend) []string {
	p := b.driver.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, m := range p.idle {
		ids = append(ids, m.ref)
	}
	return ids
}

// waitFull waits until the pool holds its size of idle members, each a
// paused container, and returns their container IDs.
func waitFull(ctx context.Context, b *Backend) []string {
	GinkgoHelper()
	Eventually(func() []string { return idleMembers(b) }).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(HaveLen(b.driver.pool.size))
	ids := idleMembers(b)
	for _, id := range ids {
		ct, err := b.driver.docker.Inspect(ctx, id)
		Expect(err).NotTo(HaveOccurred())
		Expect(ct.State.Paused).To(BeTrue(), "pool member %s is not paused", dockerruntime.ShortID(id))
		Expect(ct.Labels[dockerruntime.LabelNamespace]).To(Equal(PoolNamespace))
		Expect(ct.Labels[dockerruntime.LabelNode]).To(Equal(b.driver.node))
	}
	return ids
}

// refOf is the container ID the session Manager holds for a sandbox.
func refOf(ctx context.Context, b *Backend, id string) string {
	GinkgoHelper()
	for _, c := range containersOfRun(ctx, b) {
		if c.Labels[dockerruntime.LabelSandboxUID] == id {
			return c.ID
		}
	}
	Fail("no container for sandbox " + id)
	return ""
}

// run runs a shell command in a sandbox and returns its stdout.
func run(ctx context.Context, b *Backend, caller contract.Caller, id, shell string) string {
	GinkgoHelper()
	var out bytes.Buffer
	res, err := b.Exec(ctx, caller, id, execio.Request{Shell: shell}, func(stream string, p []byte) {
		if stream == "stdout" {
			out.Write(p)
		}
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(res.ExitCode).To(BeZero(), "%s: %s", shell, out.String())
	return out.String()
}

var defaultReq = contract.CreateRequest{Image: testenv.BusyboxImage, Network: contract.NetworkNone, Lifetime: time.Hour}

var _ = Describe("the warm pool", Label("docker"), func() {
	caller := contract.Caller{ID: "pool-test"}

	It("refuses a negative or absurd size", func() {
		client, err := dockerruntime.New(dockerruntime.Options{ManagedBy: dockerruntime.ManagedByMCP})
		Expect(err).NotTo(HaveOccurred())
		for _, n := range []int{-1, MaxWarmPool + 1} {
			_, err := New(Options{Client: client, WarmPool: n})
			Expect(err).To(MatchError(ContainSubstring("warm pool size")), "size %d", n)
		}
	})

	It("fills with paused members, hands one to a default create at once, running, and refills", func(ctx SpecContext) {
		fillStart := time.Now()
		b := poolBackend(2)
		members := waitFull(ctx, b)
		fill := time.Since(fillStart)

		t0 := time.Now()
		sb, err := b.Create(ctx, caller, defaultReq)
		took := time.Since(t0)
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("claim took %s, filling the pool %s\n", took, fill)
		// Relative to this machine's speed: filling the pool created and
		// paused containers; a claim only unpauses one.
		Expect(took).To(BeNumerically("<", fill), "a claim must not wait for a create")
		ref := refOf(ctx, b, sb.ID)
		Expect(members).To(ContainElement(ref), "the sandbox is not a pool member")
		Expect(sb.Image).To(Equal(testenv.BusyboxImage))
		Expect(sb.Status).To(Equal("running"))
		Expect(sb.MemoryBytes).To(Equal(dockerruntime.DefaultMemoryBytes))
		Expect(sb.ExpiresAt).To(BeTemporally("~", time.Now().Add(time.Hour), 5*time.Second), "the lifetime counts from the claim")
		// It is thawed in the background; the first command waits for that.
		Expect(run(ctx, b, caller, sb.ID, "echo hi")).To(Equal("hi\n"))
		ct, err := b.driver.docker.Inspect(ctx, ref)
		Expect(err).NotTo(HaveOccurred())
		Expect(ct.State.Running).To(BeTrue())
		Expect(ct.State.Paused).To(BeFalse())

		refilled := waitFull(ctx, b)
		Expect(refilled).NotTo(ContainElement(ref))
		// The pool is not the caller's: only the claimed one counts.
		list, err := b.List(ctx, caller)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(1))
	}, SpecTimeout(3*time.Minute))

	It("retries a member that failed on its own, without waiting for a claim to wake it", func(ctx SpecContext) {
		// A member's creation can fail for a passing reason (runc's cgroup
		// v1 freeze gives up while a task cannot be frozen in time); the
		// refill loop must try again after its backoff. It used to wait out
		// the backoff over and over until a claim kicked it, so the pool
		// stayed short.
		var failed atomic.Bool
		b := poolBackendWith(1, func(b *Backend) {
			p := b.driver.pool
			orig := p.makeMember
			p.makeMember = func() (poolMember, error) {
				if failed.CompareAndSwap(false, true) {
					return poolMember{}, errors.New("injected: unable to freeze")
				}
				return orig()
			}
		})
		start := time.Now()
		waitFull(ctx, b)
		Expect(failed.Load()).To(BeTrue(), "the injected failure was not hit")
		// One backoff (poolBackoffFirst) and one member's creation.
		GinkgoWriter.Printf("filled after one failure in %s\n", time.Since(start))
	}, SpecTimeout(2*time.Minute))

	It("hands out a member indistinguishable from a fresh sandbox: empty /app and /tmp, no leftover process, no history", func(ctx SpecContext) {
		b := poolBackend(2)
		members := waitFull(ctx, b)
		warm, err := b.Create(ctx, caller, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		Expect(members).To(ContainElement(refOf(ctx, b, warm.ID)))
		// Another memory size: made cold, not from the pool.
		coldReq := defaultReq
		coldReq.MemoryBytes = 256 << 20
		cold, err := b.Create(ctx, caller, coldReq)
		Expect(err).NotTo(HaveOccurred())
		Expect(members).NotTo(ContainElement(refOf(ctx, b, cold.ID)))

		logs, err := b.Logs(ctx, caller, warm.ID, contract.LogsOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(logs.History).To(BeEmpty(), "the health check is in the history")
		Expect(logs.Output).To(BeEmpty())

		// The same commands in both, so that both have the same helpers
		// winding down when the processes are counted; a command's helper
		// may outlive the exec by a moment, hence Eventually.
		for _, id := range []string{warm.ID, cold.ID} {
			Expect(run(ctx, b, caller, id, "ls -A /app /tmp")).To(Equal("/app:\n\n/tmp:\n"))
		}
		procs := "ls -d /proc/[0-9]* | wc -l"
		Eventually(func() string { return run(ctx, b, caller, warm.ID, procs) }).WithContext(ctx).WithTimeout(30*time.Second).
			Should(Equal(run(ctx, b, caller, cold.ID, procs)), "a process is left over in the claimed member")
		logs, err = b.Logs(ctx, caller, warm.ID, contract.LogsOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(logs.History).NotTo(BeEmpty())
		Expect(logs.History[0].Shell).To(Equal("ls -A /app /tmp"), "the first record is the caller's first command")
		for _, r := range logs.History {
			Expect(r.Shell).To(Or(Equal("ls -A /app /tmp"), Equal(procs)), "the history holds only the caller's commands: %+v", r)
		}
	}, SpecTimeout(3*time.Minute))

	It("creates a non-default sandbox cold, leaving the pool alone", func(ctx SpecContext) {
		b := poolBackend(2)
		members := waitFull(ctx, b)
		for _, req := range []contract.CreateRequest{
			{Image: testenv.BusyboxImage, MemoryBytes: 256 << 20, Lifetime: time.Hour},
			{Image: testenv.BusyboxImage, NanoCPUs: 500_000_000, Lifetime: time.Hour},
		} {
			sb, err := b.Create(ctx, caller, req)
			Expect(err).NotTo(HaveOccurred())
			Expect(members).NotTo(ContainElement(refOf(ctx, b, sb.ID)))
			ct, err := b.driver.docker.Inspect(ctx, refOf(ctx, b, sb.ID))
			Expect(err).NotTo(HaveOccurred())
			Expect(ct.Labels[dockerruntime.LabelNamespace]).To(Equal(contract.IdentityHash(caller.ID)))
			// Answered with the resident helper up, not still starting.
			Expect(b.driver.docker.HelperStarting(ct.ID)).To(BeFalse())
			Expect(b.driver.docker.HelperParked(ct.ID)).To(BeTrue())
		}
		Expect(idleMembers(b)).To(ConsistOf(members))
	}, SpecTimeout(3*time.Minute))

	It("skips members removed behind its back and falls back to a cold create", func(ctx SpecContext) {
		b := poolBackend(2)
		members := waitFull(ctx, b)
		// One member gone: the other serves.
		Expect(b.driver.docker.Remove(ctx, members[0], 0)).To(Succeed())
		sb, err := b.Create(ctx, caller, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		Expect(refOf(ctx, b, sb.ID)).To(Equal(members[1]))
		Expect(run(ctx, b, caller, sb.ID, "echo hi")).To(Equal("hi\n"))

		// Every member gone: cold.
		members = waitFull(ctx, b)
		for _, id := range members {
			Expect(b.driver.docker.Remove(ctx, id, 0)).To(Succeed())
		}
		sb, err = b.Create(ctx, caller, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		ref := refOf(ctx, b, sb.ID)
		Expect(members).NotTo(ContainElement(ref))
		Expect(run(ctx, b, caller, sb.ID, "echo hi")).To(Equal("hi\n"))
		waitFull(ctx, b)
	}, SpecTimeout(3*time.Minute))

	It("gives each member to exactly one of many concurrent creates", func(ctx SpecContext) {
		b := poolBackend(2)
		members := waitFull(ctx, b)
		const n = 6
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			ids  []string
			errs []error
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				sb, err := b.Create(ctx, contract.Caller{ID: fmt.Sprintf("concurrent-%d", i)}, defaultReq)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				ids = append(ids, sb.ID)
			}()
		}
		wg.Wait()
		Expect(errs).To(BeEmpty())
		Expect(ids).To(HaveLen(n))
		refs := map[string]bool{}
		warm := 0
		for _, id := range ids {
			ref := refOf(ctx, b, id)
			Expect(refs).NotTo(HaveKey(ref), "container %s handed out twice", dockerruntime.ShortID(ref))
			refs[ref] = true
			if slices.Contains(members, ref) {
				warm++
			}
			Eventually(func(g Gomega) {
				ct, err := b.driver.docker.Inspect(ctx, ref)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(ct.State.Running && !ct.State.Paused).To(BeTrue())
			}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		}
		Expect(warm).To(BeNumerically(">=", 1), "no create took a member")
		Expect(warm).To(BeNumerically("<=", 2))
		Expect(slices.Compact(slices.Sorted(slices.Values(ids)))).To(HaveLen(n), "a sandbox ID handed out twice")
	}, SpecTimeout(3*time.Minute))

	It("removes every member at Close, and stops refilling first", func(ctx SpecContext) {
		b := poolBackend(2)
		waitFull(ctx, b)
		_, err := b.Create(ctx, caller, defaultReq)
		Expect(err).NotTo(HaveOccurred())
		// The refill is under way now; Close must wait for it and remove
		// what it made.
		Expect(b.Close(ctx)).To(Succeed())
		Expect(containersOfRun(ctx, b)).To(BeEmpty())
		Consistently(func() []dockerruntime.Container { return containersOfRun(ctx, b) }).
			WithContext(ctx).WithTimeout(2 * time.Second).WithPolling(200 * time.Millisecond).Should(BeEmpty())
	}, SpecTimeout(3*time.Minute))
})
