/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// The suite has two kinds of specs:
//
//   - Label("unit"): pure logic (BuildContainerConfig, validation, idleELF).
//     They need no Docker: `go test ./internal/dockerruntime -ginkgo.label-filter=unit`.
//   - Label("docker"): integration specs against the real Docker Engine. They
//     create containers whose owner UID starts with testUIDPrefix and remove
//     each of them in DeferCleanup; AfterSuite sweeps whatever a crashed run
//     left behind.
func TestDockerRuntime(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "dockerruntime suite (unit + real Docker Engine)", tier.Config()...) // -short: only specs labelled unit
}

const (
	// testUIDPrefix starts every owner UID (and so every container name)
	// this suite creates.
	testUIDPrefix = "rt-test-"
	// staleAfter is how old an rt-test container from another run must be
	// before AfterSuite removes it, so concurrent runs do not collide.
	staleAfter = 15 * time.Minute
)

var (
	busyboxImage = envOr("BUSYBOX_IMAGE", "code-sandbox-test/busybox:1")
	pythonImage  = envOr("PYTHON_IMAGE", "code-sandbox-test/python:3")

	// runID makes this run's UIDs distinct from any concurrent run's.
	runID = randid.Hex(4)
	// testNode is the node label of every sandbox this run creates.
	testNode = testUIDPrefix + "node-" + runID

	// rt is the client under test, connected to the local Docker Engine.
	rt *Client
)

var dockerLabel = Label("docker")

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// newUID returns a fresh owner UID for one test and registers cleanup of
// every container that carries it (by label) or holds its deterministic name,
// whoever created it.
func newUID() string {
	uid := testUIDPrefix + runID + "-" + randid.Hex(4)
	DeferCleanup(func() { removeUIDContainers(uid) })
	return uid
}

// removeUIDContainers force-removes every container labelled with uid or
// named after it. It does not go through the code under test.
func removeUIDContainers(uid string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := rt.Docker()
	ids := map[string]bool{}
	var volumes []string
	for _, f := range []filters.Args{
		filters.NewArgs(filters.Arg("label", LabelSandboxUID+"="+uid)),
		filters.NewArgs(filters.Arg("name", uid)),
	} {
		list, err := d.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
		if err != nil {
			GinkgoWriter.Printf("cleanup: listing containers of %s: %v\n", uid, err)
			continue
		}
		for _, ct := range list {
			ids[ct.ID] = true
			for _, m := range ct.Mounts {
				if v := MachineIDVolumeOf(m.Destination, m.Source); v != "" {
					volumes = append(volumes, v)
				}
			}
		}
	}
	for id := range ids {
		if err := d.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			GinkgoWriter.Printf("cleanup: removing %s: %v\n", ShortID(id), err)
		}
	}
	for _, v := range volumes {
		if err := d.VolumeRemove(ctx, v, true); err != nil && !cerrdefs.IsNotFound(err) {
			GinkgoWriter.Printf("cleanup: removing machine-id volume %s: %v\n", v, err)
		}
	}
}

// sweepTestContainers removes this run's containers and stale ones of
// earlier runs: anything labelled or named with testUIDPrefix.
func sweepTestContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := rt.Docker()
	list, err := d.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("name", testUIDPrefix))})
	if err != nil {
		GinkgoWriter.Printf("sweep: %v\n", err)
		return
	}
	labelled, err := d.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelSandboxUID))})
	if err == nil {
		list = append(list, labelled...)
	}
	mine := testUIDPrefix + runID
	for _, ct := range list {
		name := ""
		if len(ct.Names) > 0 {
			name = strings.TrimPrefix(ct.Names[0], "/")
		}
		uid := ct.Labels[LabelSandboxUID]
		ours := strings.HasPrefix(uid, testUIDPrefix) || strings.Contains(name, testUIDPrefix)
		if !ours {
			continue
		}
		thisRun := strings.Contains(uid, mine) || strings.Contains(name, mine)
		if !thisRun && time.Since(time.Unix(ct.Created, 0)) < staleAfter {
			continue
		}
		if thisRun {
			GinkgoWriter.Printf("sweep: container %s (%s) was left behind\n", ShortID(ct.ID), name)
		}
		_ = d.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
	}
}

var _ = BeforeSuite(func(ctx SpecContext) {
	if !dockerLabel.MatchesLabelFilter(GinkgoLabelFilter()) {
		return // unit specs only
	}
	var err error
	rt, err = New(Options{CallTimeout: 30 * time.Second, PullTimeout: 30 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	Expect(rt.Ping(ctx)).To(Succeed(),
		"the Docker Engine at %s is not answering; start it (make docker-up) or run only the unit specs with -ginkgo.label-filter=unit", rt.Host())
	for _, img := range []string{busyboxImage, pythonImage} {
		_, err := rt.Docker().ImageInspect(ctx, img)
		Expect(err).NotTo(HaveOccurred(), "test image %s is missing: run `make test-images` (or set BUSYBOX_IMAGE / PYTHON_IMAGE)", img)
	}
}, NodeTimeout(time.Minute))

var _ = AfterSuite(func() {
	if rt == nil {
		return
	}
	sweepTestContainers()
	_ = rt.Close()
})

// baseSpec is a busybox sandbox owned by uid on this run's node.
func baseSpec(uid string) Spec {
	return Spec{
		Owner:      Owner{UID: uid, Namespace: "rt-ns", Name: "rt-" + uid[len(uid)-8:], Node: testNode},
		Image:      busyboxImage,
		PullPolicy: PullNever,
	}
}

// mustStart creates and starts spec and expects it to be running.
func mustStart(ctx context.Context, spec Spec) Container {
	GinkgoHelper()
	ct, err := rt.CreateAndStart(ctx, spec)
	Expect(err).NotTo(HaveOccurred())
	Expect(ct.ID).NotTo(BeEmpty())
	Expect(ct.Owned(spec.Owner.UID)).To(BeTrue(), "labels: %v", ct.Labels)
	return ct
}

// startSandbox creates a fresh busybox sandbox (with its own UID), lets
// mutate adjust the spec, and expects it to have started.
func startSandbox(ctx context.Context, mutate func(*Spec)) (Container, Spec) {
	GinkgoHelper()
	spec := baseSpec(newUID())
	if mutate != nil {
		mutate(&spec)
	}
	ct := mustStart(ctx, spec)
	if len(spec.Command) == 0 {
		// The idle process never exits; a command may already have.
		Expect(ct.State.Running).To(BeTrue(), "state: %+v", ct.State)
	}
	return ct, spec
}

// execResult is the outcome of one command in a sandbox.
type execResult struct {
	Stdout, Stderr string
	Code           int
}

func (r execResult) String() string {
	return fmt.Sprintf("exit=%d stdout=%q stderr=%q", r.Code, r.Stdout, r.Stderr)
}

// sh runs script with /bin/sh -c in the sandbox, bounded by 30 s.
func sh(ctx context.Context, id, script string) execResult {
	GinkgoHelper()
	return execIn(ctx, id, ExecOptions{Cmd: []string{"/bin/sh", "-c", script}})
}

func execIn(ctx context.Context, id string, opts ExecOptions) execResult {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	res, err := rt.Exec(ctx, id, opts, &stdout, &stderr)
	Expect(err).NotTo(HaveOccurred(), "exec %q", opts.Cmd)
	return execResult{Stdout: stdout.String(), Stderr: stderr.String(), Code: res.ExitCode}
}

// waitExited polls Inspect until the container is no longer running.
func waitExited(ctx context.Context, id string, timeout time.Duration) Container {
	GinkgoHelper()
	var ct Container
	Eventually(func(g Gomega) {
		var err error
		ct, err = rt.Inspect(ctx, id)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ct.State.Running).To(BeFalse())
		g.Expect(ct.State.Status).To(BeElementOf("exited", "dead"))
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(200 * time.Millisecond).Should(Succeed())
	return ct
}

// isNotFound reports whether a raw Docker error means "no such object".
func isNotFound(err error) bool { return err != nil && cerrdefs.IsNotFound(err) }
