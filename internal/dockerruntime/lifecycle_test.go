/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// rawCreate creates (never starts) a container through the raw Docker client,
// bypassing every rule of the code under test.
func rawCreate(ctx context.Context, name string, labels map[string]string) string {
	GinkgoHelper()
	created, err := rt.Docker().ContainerCreate(ctx,
		&container.Config{Image: busyboxImage, Cmd: []string{"sleep", "300"}, Labels: labels},
		&container.HostConfig{NetworkMode: "none"}, nil, nil, name)
	Expect(err).NotTo(HaveOccurred())
	return created.ID
}

// containersWithUIDLabel lists every container (managed or not) carrying the
// UID label.
func containersWithUIDLabel(ctx context.Context, uid string) []container.Summary {
	GinkgoHelper()
	list, err := rt.Docker().ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelSandboxUID+"="+uid))})
	Expect(err).NotTo(HaveOccurred())
	return list
}

func expectGone(ctx context.Context, id string) {
	GinkgoHelper()
	_, err := rt.Docker().ContainerInspect(ctx, id)
	Expect(isNotFound(err)).To(BeTrue(), "container %s should be gone, inspect said %v", ShortID(id), err)
	_, err = rt.Inspect(ctx, id)
	Expect(err).To(MatchError(ErrNotFound))
}

var _ = Describe("Adoption and ownership", dockerLabel, func() {
	It("adopts its own container instead of creating a second one (F1)", func(ctx SpecContext) {
		spec := baseSpec(newUID())
		first := mustStart(ctx, spec)
		second := mustStart(ctx, spec)
		Expect(second.ID).To(Equal(first.ID))
		Expect(second.State.Running).To(BeTrue())

		listed, err := rt.ListManaged(ctx, ListFilter{UID: spec.Owner.UID})
		Expect(err).NotTo(HaveOccurred())
		Expect(listed).To(HaveLen(1))
		Expect(listed[0].ID).To(Equal(first.ID))
		Expect(listed[0].Name).To(Equal(ContainerName(spec.Owner.UID)))
		Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(HaveLen(1))

		found, err := rt.Find(ctx, spec.Owner.UID)
		Expect(err).NotTo(HaveOccurred())
		Expect(found.ID).To(Equal(first.ID))
		Expect(found.State.Running).To(BeTrue())
		Expect(found.State.StartedAt).NotTo(BeZero())
		Expect(found.Owned(spec.Owner.UID)).To(BeTrue())

		byNode, err := rt.ListManaged(ctx, ListFilter{Node: testNode})
		Expect(err).NotTo(HaveOccurred())
		Expect(byNode).To(ContainElement(HaveField("ID", first.ID)))
		otherNode, err := rt.ListManaged(ctx, ListFilter{Node: testNode + "-elsewhere"})
		Expect(err).NotTo(HaveOccurred())
		Expect(otherNode).NotTo(ContainElement(HaveField("ID", first.ID)))
	}, SpecTimeout(60*time.Second))

	It("starts its own container that was created but never started", func(ctx SpecContext) {
		spec := baseSpec(newUID())
		spec.Command = []string{"sh", "-c", "while :; do sleep 1; done"}
		cfg, hc, err := BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())
		created, err := rt.Docker().ContainerCreate(ctx, cfg, hc, nil, nil, ContainerName(spec.Owner.UID))
		Expect(err).NotTo(HaveOccurred())

		ct := mustStart(ctx, spec)
		Expect(ct.ID).To(Equal(created.ID))
		Expect(ct.State.Running).To(BeTrue())
		Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(HaveLen(1))
	}, SpecTimeout(60*time.Second))

	DescribeTable("fails closed when a foreign container holds the deterministic name, leaving it untouched (F5)",
		func(ctx SpecContext, labelsFor func(uid string) map[string]string) {
			spec := baseSpec(newUID())
			uid := spec.Owner.UID
			squatterLabels := labelsFor(uid)
			squatter := rawCreate(ctx, ContainerName(uid), squatterLabels)

			_, err := rt.Find(ctx, uid)
			Expect(err).To(MatchError(ErrMultipleContainers))
			Expect(err.Error()).To(ContainSubstring("holds name " + ContainerName(uid) + " without our labels"))
			Expect(err.Error()).To(ContainSubstring(ShortID(squatter)))

			ct, err := rt.CreateAndStart(ctx, spec)
			Expect(err).To(MatchError(ErrMultipleContainers))
			Expect(err.Error()).To(ContainSubstring("without our labels"))
			Expect(ct.ID).To(BeEmpty())

			// The squatter was neither started, relabelled nor removed.
			info, err := rt.Docker().ContainerInspect(ctx, squatter)
			Expect(err).NotTo(HaveOccurred())
			Expect(info.State.Status).To(Equal(container.StateCreated))
			// Images contribute labels of their own; ours are what matter.
			ourLabels := map[string]string{}
			for k, v := range info.Config.Labels {
				if strings.HasPrefix(k, LabelPrefix) {
					ourLabels[k] = v
				}
			}
			Expect(ourLabels).To(Equal(squatterLabels))
			Expect(info.Name).To(Equal("/" + ContainerName(uid)))

			// Nothing was created under another name either.
			listed, err := rt.ListManaged(ctx, ListFilter{UID: uid})
			Expect(err).NotTo(HaveOccurred())
			Expect(listed).To(BeEmpty())
			all, err := rt.Docker().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("name", uid))})
			Expect(err).NotTo(HaveOccurred())
			Expect(all).To(HaveLen(1))
		},
		Entry("no labels at all", func(string) map[string]string { return map[string]string{} }, SpecTimeout(60*time.Second)),
		Entry("forged UID label without managed-by", func(uid string) map[string]string {
			return map[string]string{LabelSandboxUID: uid}
		}, SpecTimeout(60*time.Second)),
		Entry("managed-by with another sandbox's UID", func(uid string) map[string]string {
			return map[string]string{LabelManagedBy: ManagedByValue, LabelSandboxUID: uid + "-other", LabelNode: "rt-test-nowhere"}
		}, SpecTimeout(60*time.Second)),
	)

	It("fails closed when two labelled containers claim one UID (F5)", func(ctx SpecContext) {
		spec := baseSpec(newUID())
		uid := spec.Owner.UID
		a := rawCreate(ctx, "rt-dup-a-"+uid, spec.Owner.Labels())
		b := rawCreate(ctx, "rt-dup-b-"+uid, spec.Owner.Labels())

		ct, err := rt.Find(ctx, uid)
		Expect(err).To(MatchError(ErrMultipleContainers))
		Expect(err).NotTo(MatchError(ErrNotFound))
		Expect(err.Error()).To(ContainSubstring("2 containers carry sandbox UID " + uid))
		Expect(err.Error()).To(ContainSubstring(ShortID(a)))
		Expect(err.Error()).To(ContainSubstring(ShortID(b)))
		Expect(ct.ID).To(BeEmpty())

		// Adding our own container under the deterministic name makes three.
		_ = mustStart(ctx, spec)
		_, err = rt.Find(ctx, uid)
		Expect(err).To(MatchError(ErrMultipleContainers))
		Expect(err.Error()).To(ContainSubstring("3 containers"))
	}, SpecTimeout(60*time.Second))

	It("refuses to adopt a single labelled container that lacks the deterministic name (F5)", func(ctx SpecContext) {
		spec := baseSpec(newUID())
		forged := rawCreate(ctx, "rt-forged-"+spec.Owner.UID, spec.Owner.Labels())

		_, err := rt.Find(ctx, spec.Owner.UID)
		Expect(err).To(MatchError(ErrMultipleContainers))
		Expect(err.Error()).To(ContainSubstring("refusing to adopt"))
		Expect(err.Error()).To(ContainSubstring(ShortID(forged)))
		_, err = rt.Inspect(ctx, forged)
		Expect(err).NotTo(HaveOccurred(), "the forged container is left for an operator")
	}, SpecTimeout(30*time.Second))

	It("returns ErrNotFound for an unknown UID", func(ctx SpecContext) {
		uid := newUID()
		_, err := rt.Find(ctx, uid)
		Expect(err).To(MatchError(ErrNotFound))
		Expect(err).NotTo(MatchError(ErrMultipleContainers))
		Expect(err).NotTo(MatchError(ErrUnavailable))
		Expect(err.Error()).To(ContainSubstring(uid))
	}, SpecTimeout(30*time.Second))
})

var _ = Describe("Remove", dockerLabel, func() {
	It("stops with grace, removes, and is idempotent", func(ctx SpecContext) {
		ct, spec := startSandbox(ctx, nil)
		// A Remove that waited out the grace period would take all of it;
		// one that did not takes a stop's round trip, far below half.
		const grace = 20 * time.Second
		start := time.Now()
		Expect(rt.Remove(ctx, ct.ID, grace)).To(Succeed())
		Expect(time.Since(start)).To(BeNumerically("<", grace/2), "the idle process ends on SIGTERM; no need to wait for the grace period")
		expectGone(ctx, ct.ID)

		_, err := rt.Find(ctx, spec.Owner.UID)
		Expect(err).To(MatchError(ErrNotFound))
		Expect(err).NotTo(MatchError(ErrMultipleContainers))

		Expect(rt.Remove(ctx, ct.ID, 5*time.Second)).To(Succeed(), "a second Remove is a no-op")
		Expect(rt.Remove(ctx, ct.ID, 0)).To(Succeed())
		Expect(rt.Remove(ctx, "0123456789abcdef0123", time.Second)).To(Succeed(), "a container that never existed counts as gone")
	}, SpecTimeout(60*time.Second))

	It("stops a paused container gracefully, without waiting out the grace period", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
		Expect(rt.Pause(ctx, ct.ID)).To(Succeed(), "pausing a paused container is not an error")
		paused, err := rt.Inspect(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(paused.State.Paused).To(BeTrue())
		const grace = 20 * time.Second
		start := time.Now()
		Expect(rt.Remove(ctx, ct.ID, grace)).To(Succeed())
		Expect(time.Since(start)).To(BeNumerically("<", grace/2), "Docker's stop must reach a frozen container's processes; it waited for the grace period")
		expectGone(ctx, ct.ID)
	}, SpecTimeout(60*time.Second))

	It("kills a container that ignores SIGTERM after the grace period", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, func(s *Spec) {
			s.Command = []string{"sh", "-c", "trap '' TERM; while :; do sleep 1; done"}
		})
		const grace = time.Second
		start := time.Now()
		Expect(rt.Remove(ctx, ct.ID, grace)).To(Succeed())
		elapsed := time.Since(start)
		Expect(elapsed).To(BeNumerically(">=", grace-100*time.Millisecond), "SIGTERM was ignored, so Docker had to wait for the grace period")
		Expect(elapsed).To(BeNumerically("<", grace+10*time.Second))
		expectGone(ctx, ct.ID)
	}, SpecTimeout(60*time.Second))

	It("removes an exited container and with zero grace a running one", func(ctx SpecContext) {
		exited, _ := startSandbox(ctx, func(s *Spec) { s.Command = []string{"true"} })
		waitExited(ctx, exited.ID, 15*time.Second)
		start := time.Now()
		Expect(rt.Remove(ctx, exited.ID, time.Second)).To(Succeed())
		removal := time.Since(start) // the baseline: one removal on this machine now
		expectGone(ctx, exited.ID)

		running, _ := startSandbox(ctx, func(s *Spec) {
			s.Command = []string{"sh", "-c", "trap '' TERM; while :; do sleep 1; done"}
		})
		start = time.Now()
		Expect(rt.Remove(ctx, running.ID, 0)).To(Succeed())
		// Relative to the baseline: zero grace kills at once, so this is a
		// removal and a SIGKILL; a zero taken for "unset" would wait out
		// DefaultStopGracePeriod (10 s) first, half of which fails it.
		Expect(time.Since(start)).To(BeNumerically("<", 2*removal+DefaultStopGracePeriod/2))
		expectGone(ctx, running.ID)
	}, SpecTimeout(60*time.Second))
})

var _ = Describe("Images", dockerLabel, func() {
	It("is satisfied by a present image without pulling", func(ctx SpecContext) {
		// No registry is reachable, so success means nothing was pulled.
		Expect(rt.EnsureImage(ctx, busyboxImage, PullNever)).To(Succeed())
		Expect(rt.EnsureImage(ctx, busyboxImage, PullIfNotPresent)).To(Succeed())
	}, SpecTimeout(30*time.Second))

	It("reports ErrImageNotFound for a missing image with PullNever", func(ctx SpecContext) {
		ref := "code-sandbox-test/does-not-exist:" + randid.Hex(4)
		err := rt.EnsureImage(ctx, ref, PullNever)
		Expect(err).To(MatchError(ErrImageNotFound))
		Expect(err).NotTo(MatchError(ErrUnavailable))
		Expect(err.Error()).To(ContainSubstring(ref))
		Expect(err.Error()).To(ContainSubstring("imagePullPolicy is Never"))

		spec := baseSpec(newUID())
		spec.Image = ref
		_, err = rt.CreateAndStart(ctx, spec)
		Expect(err).To(MatchError(ErrImageNotFound))
		Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(BeEmpty())
	}, SpecTimeout(30*time.Second))

	It("reports ErrImageNotFound (not ErrUnavailable) when a pull fails, and leaks no container", func(ctx SpecContext) {
		ref := "localhost:1/nope:latest"
		// localhost is refused by the default image policy; allow it here.
		rt := clientWithPolicy("localhost:1")
		start := time.Now()
		err := rt.EnsureImage(ctx, ref, PullIfNotPresent)
		Expect(err).To(MatchError(ErrImageNotFound))
		Expect(err).NotTo(MatchError(ErrUnavailable), "the registry is unreachable, not the Docker Engine")
		Expect(err.Error()).To(ContainSubstring("pulling " + ref))
		// Relative to the client's own PullTimeout: the refused connection
		// ends the pull; only a pull left to run into its timeout fails this.
		Expect(time.Since(start)).To(BeNumerically("<", rt.pullTimeout))

		spec := baseSpec(newUID())
		spec.Image = ref
		spec.PullPolicy = PullIfNotPresent
		ct, err := rt.CreateAndStart(ctx, spec)
		Expect(err).To(MatchError(ErrImageNotFound))
		Expect(err).NotTo(MatchError(ErrUnavailable))
		Expect(ct.ID).To(BeEmpty())
		Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(BeEmpty())
		_, err = rt.Docker().ContainerInspect(ctx, ContainerName(spec.Owner.UID))
		Expect(isNotFound(err)).To(BeTrue(), "no container may hold the name: %v", err)

		err = rt.EnsureImage(ctx, ref, PullAlways)
		Expect(err).To(MatchError(ErrImageNotFound))
	}, SpecTimeout(90*time.Second))

	It("rejects an invalid spec before touching Docker", func(ctx SpecContext) {
		spec := baseSpec(newUID())
		spec.User = "0:0"
		_, err := rt.CreateAndStart(ctx, spec)
		Expect(err).To(MatchError(ErrInvalidSpec))
		Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(BeEmpty())
	}, SpecTimeout(30*time.Second))
})

// blackholeDocker listens on a unix socket, accepts connections and never
// answers: a hung Docker Engine.
func blackholeDocker() string {
	GinkgoHelper()
	dir, err := shortTempDir()
	Expect(err).NotTo(HaveOccurred())
	sock := filepath.Join(dir, "hung.sock")
	ln, err := net.Listen("unix", sock)
	Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	DeferCleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return "unix://" + sock
}

var _ = Describe("Docker unavailable (F6)", Label("docker"), func() {
	validSpec := func() Spec {
		return Spec{Owner: Owner{UID: testUIDPrefix + "unavailable", Node: "rt-test-nowhere"}, Image: busyboxImage}
	}

	// every runs each operation and expects a prompt ErrUnavailable.
	// Its bound on each call is a generous hang guard relative to the
	// client's CallTimeout: ten of them, plus the second "Remove with grace"
	// waits first. Nothing answers these calls, so what it catches is a call
	// that Docker's client would let wait for its caller's context.
	every := func(ctx context.Context, c *Client) {
		bound := 10*c.callTimeout + time.Second
		GinkgoHelper()
		ops := map[string]func(context.Context) error{
			"Ping": c.Ping,
			"Find": func(ctx context.Context) error { _, err := c.Find(ctx, "some-uid"); return err },
			"CreateAndStart": func(ctx context.Context) error {
				_, err := c.CreateAndStart(ctx, validSpec())
				return err
			},
			"Remove with grace": func(ctx context.Context) error { return c.Remove(ctx, "0123456789ab", time.Second) },
			"Remove":            func(ctx context.Context) error { return c.Remove(ctx, "0123456789ab", 0) },
			"ListManaged":       func(ctx context.Context) error { _, err := c.ListManaged(ctx, ListFilter{}); return err },
			"Inspect":           func(ctx context.Context) error { _, err := c.Inspect(ctx, "0123456789ab"); return err },
			"HasRuntime":        func(ctx context.Context) error { _, err := c.HasRuntime(ctx, "runsc"); return err },
			"EnsureImage":       func(ctx context.Context) error { return c.EnsureImage(ctx, busyboxImage, PullIfNotPresent) },
			"Start":             func(ctx context.Context) error { return c.Start(ctx, "0123456789ab") },
			"Exec": func(ctx context.Context) error {
				_, err := c.Exec(ctx, "0123456789ab", ExecOptions{Cmd: []string{"true"}}, nil, nil)
				return err
			},
			"RunCommand": func(ctx context.Context) error {
				_, err := c.RunCommand(ctx, "0123456789ab", execio.Request{Command: []string{"true"}}, nil, nil)
				return err
			},
			"CopyIn": func(ctx context.Context) error {
				_, err := c.CopyIn(ctx, "0123456789ab", execio.Target{Root: "/app"}, strings.NewReader(""), execio.UploadLimits{})
				return err
			},
			"CopyOut": func(ctx context.Context) error {
				_, err := c.CopyOut(ctx, "0123456789ab", execio.Target{Root: "/app", Rel: "x"}, io.Discard, 0)
				return err
			},
		}
		for name, op := range ops {
			start := time.Now()
			err := op(ctx)
			Expect(err).To(HaveOccurred(), name)
			Expect(errors.Is(err, ErrUnavailable)).To(BeTrue(), "%s: %v", name, err)
			Expect(err).NotTo(MatchError(ErrNotFound), name)
			Expect(time.Since(start)).To(BeNumerically("<", bound), name)
		}
	}

	It("returns ErrUnavailable at once when the socket is missing", func(ctx SpecContext) {
		c, err := New(Options{Host: "unix:///tmp/definitely-missing-docker.sock", CallTimeout: 2 * time.Second, PullTimeout: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred(), "New connects lazily")
		defer c.Close()
		Expect(c.Host()).To(Equal("unix:///tmp/definitely-missing-docker.sock"))
		err = c.Ping(ctx)
		Expect(err).To(MatchError(ErrUnavailable))
		Expect(err.Error()).To(ContainSubstring("definitely-missing-docker.sock"))
		every(ctx, c)

		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err = c.WatchEvents(wctx, "n", func(Event) {})
		Expect(err).To(MatchError(ErrUnavailable))
		Expect(wctx.Err()).To(Succeed(), "WatchEvents returned before its context ended")
	}, SpecTimeout(60*time.Second))

	It("returns ErrUnavailable when nothing listens on a TCP endpoint", func(ctx SpecContext) {
		c, err := New(Options{Host: "tcp://127.0.0.1:1", CallTimeout: 2 * time.Second, PullTimeout: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		defer c.Close()
		every(ctx, c)
	}, SpecTimeout(60*time.Second))

	It("bounds every call by CallTimeout when the daemon hangs", func(ctx SpecContext) {
		c, err := New(Options{Host: blackholeDocker(), CallTimeout: 500 * time.Millisecond, PullTimeout: time.Second})
		Expect(err).NotTo(HaveOccurred())
		defer c.Close()
		// Remove with grace waits grace+CallTimeout for the stop; the rest
		// are one CallTimeout (plus API-version negotiation within it).
		every(ctx, c)
	}, SpecTimeout(90*time.Second))
})

var _ = Describe("Exec and Logs", dockerLabel, Ordered, ContinueOnFailure, func() {
	var ct Container

	BeforeAll(func(ctx SpecContext) {
		ct, _ = startSandbox(ctx, nil)
	}, NodeTimeout(60*time.Second))

	It("separates stdout and stderr and propagates the exit code", func(ctx SpecContext) {
		res := sh(ctx, ct.ID, "echo out; echo err >&2; echo out2; exit 3")
		Expect(res.Stdout).To(Equal("out\nout2\n"))
		Expect(res.Stderr).To(Equal("err\n"))
		Expect(res.Code).To(Equal(3))

		res = sh(ctx, ct.ID, "true")
		Expect(res.Code).To(BeZero())
		Expect(res.Stdout).To(BeEmpty())
		Expect(res.Stderr).To(BeEmpty())
		Expect(sh(ctx, ct.ID, "kill -9 $$").Code).To(Equal(137))
	}, SpecTimeout(30*time.Second))

	It("delivers stdin and closes it", func(ctx SpecContext) {
		res := execIn(ctx, ct.ID, ExecOptions{Cmd: []string{"cat"}, Stdin: strings.NewReader("hello\nworld")})
		Expect(res.Code).To(BeZero(), "%v", res)
		Expect(res.Stdout).To(Equal("hello\nworld"))

		big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
		res = execIn(ctx, ct.ID, ExecOptions{Cmd: []string{"sh", "-c", "wc -c"}, Stdin: bytes.NewReader(big)})
		Expect(res.Code).To(BeZero(), "%v", res)
		Expect(strings.TrimSpace(res.Stdout)).To(Equal("1048576"))

		// Without Stdin the command sees EOF instead of hanging.
		res = execIn(ctx, ct.ID, ExecOptions{Cmd: []string{"cat"}})
		Expect(res.Code).To(BeZero(), "%v", res)
		Expect(res.Stdout).To(BeEmpty())
	}, SpecTimeout(30*time.Second))

	It("honours env and workdir, and defaults to the sandbox's user and workdir", func(ctx SpecContext) {
		res := execIn(ctx, ct.ID, ExecOptions{
			Cmd:        []string{"sh", "-c", `echo "$FOO"; echo "$BAR"; pwd; id -u`},
			Env:        []string{"FOO=bar baz", "BAR=$(id)"},
			WorkingDir: "/tmp",
		})
		Expect(res.Code).To(BeZero(), "%v", res)
		Expect(res.Stdout).To(Equal("bar baz\n$(id)\n/tmp\n65534\n"))

		res = execIn(ctx, ct.ID, ExecOptions{Cmd: []string{"sh", "-c", `pwd; echo "$HOME"; id -u`}})
		Expect(res.Stdout).To(Equal("/app\n/app\n65534\n"))
	}, SpecTimeout(30*time.Second))

	It("passes arguments as argv, never through a shell (A18)", func(ctx SpecContext) {
		arg := "; rm -rf /app $(id) `id`\nline2"
		res := execIn(ctx, ct.ID, ExecOptions{Cmd: []string{"echo", arg}})
		Expect(res.Code).To(BeZero(), "%v", res)
		Expect(res.Stdout).To(Equal(arg + "\n"))
	}, SpecTimeout(30*time.Second))

	It("rejects an empty command and reports a missing container", func(ctx SpecContext) {
		_, err := rt.Exec(ctx, ct.ID, ExecOptions{}, nil, nil)
		Expect(err).To(MatchError(ErrInvalidSpec))
		_, err = rt.Exec(ctx, "rt-test-no-such-container", ExecOptions{Cmd: []string{"true"}}, nil, nil)
		Expect(err).To(MatchError(ErrNotFound))
		Expect(err).NotTo(MatchError(ErrUnavailable))
	}, SpecTimeout(30*time.Second))

	It("returns promptly when the caller's context ends", func(ctx SpecContext) {
		// The baseline: a trivial exec on this machine now.
		start := time.Now()
		Expect(execIn(ctx, ct.ID, ExecOptions{Cmd: []string{"true"}}).Code).To(BeZero())
		baseline := time.Since(start)
		AddReportEntry("trivial exec baseline", baseline.String())
		ectx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start = time.Now()
		_, err := rt.Exec(ectx, ct.ID, ExecOptions{Cmd: []string{"sleep", "30"}}, nil, nil)
		Expect(err).To(MatchError(context.DeadlineExceeded))
		Expect(err).NotTo(MatchError(ErrUnavailable), "the caller's deadline is not a Docker outage")
		// Relative: the 1 s deadline plus ten trivial execs, capped well
		// under the 30 s sleep that a call ignoring its context waits for.
		Expect(time.Since(start)).To(BeNumerically("<", min(time.Second+max(2*time.Second, 10*baseline), 20*time.Second)))
	}, SpecTimeout(30*time.Second))

	It("reads a container's logs, separated by stream", func(ctx SpecContext) {
		logged, _ := startSandbox(ctx, func(s *Spec) {
			s.Command = []string{"sh", "-c", "echo hello-out; echo hello-err >&2; sleep 0.5; echo line3"}
		})
		waitExited(ctx, logged.ID, 15*time.Second)
		var stdout, stderr bytes.Buffer
		Expect(rt.Logs(ctx, logged.ID, LogsOptions{}, &stdout, &stderr)).To(Succeed())
		Expect(stdout.String()).To(Equal("hello-out\nline3\n"))
		Expect(stderr.String()).To(Equal("hello-err\n"))

		stdout.Reset()
		stderr.Reset()
		Expect(rt.Logs(ctx, logged.ID, LogsOptions{Tail: 1}, &stdout, &stderr)).To(Succeed())
		Expect(stdout.String() + stderr.String()).To(Equal("line3\n"))

		err := rt.Logs(ctx, "rt-test-no-such-container", LogsOptions{}, &stdout, &stderr)
		Expect(err).To(MatchError(ErrNotFound))
	}, SpecTimeout(60*time.Second))

	It("follows logs until the container stops", func(ctx SpecContext) {
		followed, _ := startSandbox(ctx, func(s *Spec) {
			s.Command = []string{"sh", "-c", "echo one; sleep 1; echo two"}
		})
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var stdout bytes.Buffer
		Expect(rt.Logs(lctx, followed.ID, LogsOptions{Follow: true}, &stdout, nil)).To(Succeed())
		Expect(lctx.Err()).To(Succeed(), "Follow returned because the container stopped, not by timeout")
		Expect(stdout.String()).To(Equal("one\ntwo\n"))
	}, SpecTimeout(60*time.Second))
})

var _ = Describe("WatchEvents", dockerLabel, func() {
	It("streams start and die events of one node's containers with owner labels", func(ctx SpecContext) {
		node := testUIDPrefix + "events-" + randid.Hex(4)
		wctx, cancel := context.WithCancel(ctx)
		events := make(chan Event, 256)
		watchDone := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			watchDone <- rt.WatchEvents(wctx, node, func(e Event) {
				select {
				case events <- e:
				default:
				}
			})
		}()
		DeferCleanup(func() {
			cancel()
			Eventually(watchDone, 5*time.Second).Should(Receive())
		})
		// WatchEvents has no "subscribed" signal; give the stream a moment.
		time.Sleep(500 * time.Millisecond)

		// A container on another node must not show up.
		elsewhere := baseSpec(newUID())
		elsewhere.Owner.Node = node + "-other"
		otherCt := mustStart(ctx, elsewhere)

		spec := baseSpec(newUID())
		spec.Owner.Node = node
		ct := mustStart(ctx, spec)
		Expect(rt.Docker().ContainerKill(ctx, ct.ID, "KILL")).To(Succeed())

		var seen []Event
		wait := func(action string) Event {
			GinkgoHelper()
			for _, e := range seen {
				if e.ContainerID == ct.ID && e.Action == action {
					return e
				}
			}
			var got Event
			Eventually(func() bool {
				for {
					select {
					case e := <-events:
						seen = append(seen, e)
						if e.ContainerID == ct.ID && e.Action == action {
							got = e
							return true
						}
					default:
						return false
					}
				}
			}).WithContext(ctx).WithTimeout(15*time.Second).WithPolling(50*time.Millisecond).Should(BeTrue(), "no %s event; saw %+v", action, seen)
			return got
		}
		start := wait("start")
		die := wait("die")
		for _, e := range []Event{start, die} {
			Expect(e.Owner).To(Equal(spec.Owner))
		}
		Expect(rt.Remove(ctx, ct.ID, time.Second)).To(Succeed())
		wait("destroy")

		var order []string
		for _, e := range seen {
			Expect(e.Owner.UID).NotTo(Equal(elsewhere.Owner.UID), "event of another node's container leaked: %+v", e)
			Expect(e.ContainerID).NotTo(Equal(otherCt.ID))
			Expect(e.Owner.Node).To(Equal(node))
			if e.ContainerID == ct.ID {
				order = append(order, e.Action)
			}
		}
		Expect(order).To(Equal([]string{"create", "start", "die", "destroy"}))

		cancel()
		var err error
		Eventually(watchDone, 5*time.Second).Should(Receive(&err))
		Expect(err).To(MatchError(context.Canceled))
		watchDone <- err // for the cleanup
	}, SpecTimeout(60*time.Second))
})

// shortTempDir makes a temporary directory with a short path (unix socket
// paths are limited to about 100 bytes) and removes it after the spec.
func shortTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "rt")
	if err != nil {
		return "", err
	}
	DeferCleanup(func() { _ = os.RemoveAll(dir) })
	return dir, nil
}

var _ = Describe("The tools volume", dockerLabel, Label("disruptive"), func() {
	// This spec removes the node-wide tools volume (only when no container
	// uses it, which Docker enforces) to simulate `docker volume prune`.
	// Exclude it with -ginkgo.label-filter='!disruptive' on a shared node.
	It("is re-created and refilled when pruned under a running client (F12)", func(ctx SpecContext) {
		c, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		defer c.Close()
		first, err := c.CreateAndStart(ctx, baseSpec(newUID()))
		Expect(err).NotTo(HaveOccurred())
		Expect(first.State.Running).To(BeTrue())
		// The steady state costs one VolumeInspect: it matches what was
		// recorded when the volume was verified.
		vol, err := rt.Docker().VolumeInspect(ctx, toolsVolumeName())
		Expect(err).NotTo(HaveOccurred())
		Expect(c.toolsCreatedAt).NotTo(BeEmpty())
		Expect(c.toolsCreatedAt).To(Equal(vol.CreatedAt))
		Expect(c.Remove(ctx, first.ID, 0)).To(Succeed())

		if err := rt.Docker().VolumeRemove(ctx, toolsVolumeName(), false); err != nil {
			Skip("cannot simulate a prune, the tools volume is in use: " + err.Error())
		}
		// Both clients verified the old volume; both must notice it is gone.
		for _, client := range []*Client{c, rt} {
			ct, err := client.CreateAndStart(ctx, baseSpec(newUID()))
			Expect(err).NotTo(HaveOccurred())
			Consistently(func(g Gomega) {
				got, err := rt.Inspect(ctx, ct.ID)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(got.State.Running).To(BeTrue(), "state: %+v", got.State)
			}).WithContext(ctx).WithTimeout(time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
			Expect(sh(ctx, ct.ID, "echo ok").Stdout).To(Equal("ok\n"))
			Expect(rt.Remove(ctx, ct.ID, 0)).To(Succeed())
		}
	}, SpecTimeout(60*time.Second))
})
