/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// interactiveSample is one iteration of BenchmarkTimeToInteractive on one
// path, each figure from just before its own call.
type interactiveSample struct {
	create   time.Duration // create+start returned (ours: CreateAndStart)
	first    time.Duration // the first command, `true`
	tti      time.Duration // create + first command: time to interactive
	repeated time.Duration // a second command, `true`
	write    time.Duration // a 1 KiB file written
	read     time.Duration // the same file read back (ours only)
	// firstReady is the first command on a sandbox that has been Ready for
	// readyGap, as a client's next call after the create comes (raw: the
	// first exec, which no wait changes).
	firstReady time.Duration
	// claimed is a warm member's thaw and first command: created, checked
	// (ours: CheckHealth) and paused untimed, then unpaused and `true` run.
	claimed time.Duration
}

// serveStartSample splits one `helper serve` start, done with the raw
// client on our container, into Docker's calls: ExecCreate returned,
// ExecAttach (which starts the exec) returned, the helper's ready frame
// read. It is where a first command's time went before the helper was
// started with the container.
type serveStartSample struct {
	execCreate, execStart, ready time.Duration
}

// untarExecSample splits one upload by an exec of `helper untar` (the
// transfer path before the resident helper carried files): ExecCreate,
// ExecAttach, the archive written and the output read to its end, then
// ExecInspect for the exit code.
type untarExecSample struct {
	execCreate, execStart, streamed, inspected time.Duration
}

// oneKiB is the write_file figure's content.
var oneKiB = bytes.Repeat([]byte("0123456789abcdef"), 64)

// tarOf is a one-file archive of data named name.
func tarOf(name string, data []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(data)
	_ = tw.Close()
	return buf.Bytes()
}

// oursInteractive creates a sandbox container through the runtime (as the
// manager and the MCP server's Docker backend do) and times its first
// command, a repeated one, a 1 KiB write and a read.
func (e *benchEnv) oursInteractive(ctx context.Context) (interactiveSample, string, error) {
	var s interactiveSample
	uid := fmt.Sprintf("tti-%s-%d", runID, seq.Add(1))
	t0 := time.Now()
	ct, err := e.docker.CreateAndStart(ctx, dockerruntime.Spec{
		// rawNode: the manager's garbage collector would remove a container
		// of benchNode that no Sandbox owns.
		Owner: dockerruntime.Owner{UID: uid, Namespace: namespace, Name: uid, Node: rawNode},
		Image: e.image,
	})
	s.create = time.Since(t0)
	if err != nil {
		return s, "", err
	}
	run := func() (time.Duration, error) {
		t := time.Now()
		res, err := e.docker.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"true"}}, nil, nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return time.Since(t), err
	}
	if s.first, err = run(); err != nil {
		return s, ct.ID, fmt.Errorf("first command: %w", err)
	}
	s.tti = time.Since(t0)
	if s.repeated, err = run(); err != nil {
		return s, ct.ID, fmt.Errorf("repeated command: %w", err)
	}
	target := execio.Target{Root: "/tmp"}
	t := time.Now()
	if _, err := e.docker.CopyIn(ctx, ct.ID, target, bytes.NewReader(tarOf("f", oneKiB)), execio.UploadLimits{}); err != nil {
		return s, ct.ID, fmt.Errorf("writing 1 KiB: %w", err)
	}
	s.write = time.Since(t)
	t = time.Now()
	var out bytes.Buffer
	if _, err := e.docker.CopyOut(ctx, ct.ID, execio.Target{Root: "/tmp", Rel: "f"}, &out, 0); err != nil {
		return s, ct.ID, fmt.Errorf("reading 1 KiB: %w", err)
	}
	s.read = time.Since(t)
	if !bytes.Contains(out.Bytes(), oneKiB) {
		return s, ct.ID, errors.New("the file read back is not the one written")
	}
	s.firstReady, s.claimed, err = e.oursClaimed(ctx)
	return s, ct.ID, err
}

// readyGap is the pause between a create and the first command in the
// firstReady figure: a client's round trip and an agent's next tool call
// take at least that.
const readyGap = 150 * time.Millisecond

// oursClaimed times the first command on a sandbox that has been Ready
// for readyGap, then a warm pool member's claim as the node manager does
// it: the same container health-checked and frozen (untimed), then thawed
// and a command run.
func (e *benchEnv) oursClaimed(ctx context.Context) (firstReady, claimed time.Duration, err error) {
	uid := fmt.Sprintf("tti-warm-%s-%d", runID, seq.Add(1))
	ct, err := e.docker.CreateAndStart(ctx, dockerruntime.Spec{
		Owner: dockerruntime.Owner{UID: uid, Namespace: namespace, Name: uid, Node: rawNode},
		Image: e.image,
	})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = e.docker.Remove(context.WithoutCancel(ctx), ct.ID, 0) }()
	run := func() (time.Duration, error) {
		t := time.Now()
		res, err := e.docker.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"true"}}, nil, nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return time.Since(t), err
	}
	time.Sleep(readyGap)
	if firstReady, err = run(); err != nil {
		return 0, 0, err
	}
	if err := e.docker.CheckHealth(ctx, ct.ID); err != nil {
		return 0, 0, err
	}
	if err := e.docker.Pause(ctx, ct.ID); err != nil {
		return 0, 0, err
	}
	t := time.Now()
	if err := e.docker.BeginUnpause(ct.ID)(ctx); err != nil {
		return 0, 0, err
	}
	_, err = run()
	return firstReady, time.Since(t), err
}

// rawInteractive is the baseline: raw create+start until running, a raw
// exec of `true`, another, and a 1 KiB file written by a raw exec of
// `sh -c 'cat > /tmp/f'` fed on stdin.
func (e *benchEnv) rawInteractive(ctx context.Context) (interactiveSample, string, error) {
	t0 := time.Now()
	rs, id, err := e.rawCreateToRunning(ctx, fmt.Sprintf("tti-%d", seq.Add(1)))
	s := interactiveSample{create: rs.running}
	if err != nil {
		return s, id, err
	}
	t := time.Now()
	if err := e.rawExec(ctx, id, []string{"true"}, ""); err != nil {
		return s, id, err
	}
	s.first = time.Since(t)
	s.firstReady = s.first
	s.tti = time.Since(t0)
	t = time.Now()
	if err := e.rawExec(ctx, id, []string{"true"}, ""); err != nil {
		return s, id, err
	}
	s.repeated = time.Since(t)
	t = time.Now()
	if err := e.rawExecStdin(ctx, id, []string{"sh", "-c", "cat > /tmp/f"}, oneKiB); err != nil {
		return s, id, err
	}
	s.write = time.Since(t)
	// A claim: pause (untimed), then unpause and a raw exec.
	if err := e.raw.ContainerPause(ctx, id); err != nil {
		return s, id, err
	}
	t = time.Now()
	if err := e.raw.ContainerUnpause(ctx, id); err != nil {
		return s, id, err
	}
	// Docker records the thaw from containerd's event, a moment after
	// the unpause returns: an exec can still be refused as paused then.
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := e.rawExec(ctx, id, []string{"true"}, "")
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "is paused") || time.Now().After(deadline) {
			return s, id, err
		}
		time.Sleep(time.Millisecond)
	}
	s.claimed = time.Since(t)
	return s, id, nil
}

// rawExecStdin is rawExec with stdin.
func (e *benchEnv) rawExecStdin(ctx context.Context, id string, cmd []string, stdin []byte) error {
	created, err := e.raw.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: cmd, AttachStdin: true, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return fmt.Errorf("raw ExecCreate: %w", err)
	}
	attach, err := e.raw.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return fmt.Errorf("raw ExecAttach: %w", err)
	}
	defer attach.Close()
	if _, err := attach.Conn.Write(stdin); err != nil {
		return err
	}
	_ = attach.CloseWrite()
	var stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(io.Discard, &stderr, attach.Reader); err != nil {
		return err
	}
	insp, err := e.raw.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return err
	}
	if insp.ExitCode != 0 {
		return fmt.Errorf("raw exec %v: exit %d: %s", cmd, insp.ExitCode, stderr.String())
	}
	return nil
}

// serveStart times a `helper serve` exec's start on container id with the
// raw client, then ends it (its stdin closed).
func (e *benchEnv) serveStart(ctx context.Context, id string) (serveStartSample, error) {
	var s serveStartSample
	t0 := time.Now()
	created, err := e.raw.ContainerExecCreate(ctx, id, container.ExecOptions{
		Cmd: []string{dockerruntime.HelperPath, "serve"}, AttachStdin: true, AttachStdout: true, AttachStderr: true,
	})
	s.execCreate = time.Since(t0)
	if err != nil {
		return s, err
	}
	attach, err := e.raw.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	s.execStart = time.Since(t0)
	if err != nil {
		return s, err
	}
	defer attach.Close()
	// The stream is multiplexed: an 8-byte header, then the frame.
	var hdr [8]byte
	if _, err := io.ReadFull(attach.Reader, hdr[:]); err != nil {
		return s, fmt.Errorf("reading the ready frame: %w", err)
	}
	s.ready = time.Since(t0)
	kind, _, err := helperproto.ReadFrame(attach.Reader, helperproto.MaxReadyPayload)
	if err != nil || kind != helperproto.FrameReady {
		return s, fmt.Errorf("the helper's first frame is %q (%v), not ready", kind, err)
	}
	_ = attach.CloseWrite()
	return s, nil
}

// untarExec times an upload of a 1 KiB file by an exec of `helper untar`
// on container id, as every transfer ran before the resident helper
// carried them.
func (e *benchEnv) untarExec(ctx context.Context, id string) (untarExecSample, error) {
	var s untarExecSample
	t0 := time.Now()
	created, err := e.raw.ContainerExecCreate(ctx, id, container.ExecOptions{
		Cmd:         []string{dockerruntime.HelperPath, "untar", "--root=/tmp", "--dest=", "--max-bytes=1048576", "--max-entries=10"},
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
	})
	s.execCreate = time.Since(t0)
	if err != nil {
		return s, err
	}
	attach, err := e.raw.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	s.execStart = time.Since(t0)
	if err != nil {
		return s, err
	}
	defer attach.Close()
	if _, err := attach.Conn.Write(tarOf("g", oneKiB)); err != nil {
		return s, err
	}
	_ = attach.CloseWrite()
	var stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(io.Discard, &stderr, attach.Reader); err != nil {
		return s, err
	}
	s.streamed = time.Since(t0)
	insp, err := e.raw.ContainerExecInspect(ctx, created.ID)
	s.inspected = time.Since(t0)
	if err != nil {
		return s, err
	}
	if insp.ExitCode != 0 {
		return s, fmt.Errorf("helper untar exited %d: %s", insp.ExitCode, strings.TrimSpace(stderr.String()))
	}
	return s, nil
}

// BenchmarkTimeToInteractive compares, per iteration and in alternating
// order, (a) a sandbox container created through the runtime, its first
// command, a repeated command, a 1 KiB write_file and its read back,
// against (b) raw Docker create+start, a raw exec, another, and a raw exec
// writing 1 KiB from stdin, in the same run. ns/op is (a)'s time to
// interactive (create + first command). A warm member's claim (thaw and
// first command) is timed on both paths too. It also splits a resident helper's
// start and an exec-per-transfer upload into Docker's calls.
func BenchmarkTimeToInteractive(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()
	var ours, raws []interactiveSample
	var starts []serveStartSample
	var untars []untarExecSample
	sample := func(warm bool) {
		s, id, err := e.oursInteractive(ctx)
		if err == nil {
			var st serveStartSample
			if st, err = e.serveStart(ctx, id); err == nil && !warm {
				starts = append(starts, st)
			}
		}
		if err == nil {
			var ut untarExecSample
			if ut, err = e.untarExec(ctx, id); err == nil && !warm {
				untars = append(untars, ut)
			}
		}
		if id != "" {
			if rerr := e.docker.Remove(ctx, id, 0); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		if err != nil {
			b.Fatal(err)
		}
		if !warm {
			ours = append(ours, s)
		}
	}
	rawSample := func(warm bool) {
		s, id, err := e.rawInteractive(ctx)
		if rerr := e.removeRaw(ctx, id); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if err != nil {
			b.Fatal(err)
		}
		if !warm {
			raws = append(raws, s)
		}
	}
	// Warm up: the tools volume, Docker's paths.
	sample(true)
	rawSample(true)
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			sample(false)
			rawSample(false)
		} else {
			rawSample(false)
			sample(false)
		}
	}
	var total time.Duration
	for _, s := range ours {
		total += s.tti
	}
	// ns/op is the time to interactive alone.
	b.ReportMetric(float64(total.Nanoseconds())/float64(len(ours)), "ns/op")

	type figure struct {
		name string
		get  func(interactiveSample) time.Duration
		raw  bool
	}
	figures := []figure{
		{"create", func(s interactiveSample) time.Duration { return s.create }, true},
		{"first-exec", func(s interactiveSample) time.Duration { return s.first }, true},
		{"tti", func(s interactiveSample) time.Duration { return s.tti }, true},
		{"first-ready", func(s interactiveSample) time.Duration { return s.firstReady }, true},
		{"repeated-exec", func(s interactiveSample) time.Duration { return s.repeated }, true},
		{"write-1k", func(s interactiveSample) time.Duration { return s.write }, true},
		{"read-1k", func(s interactiveSample) time.Duration { return s.read }, false},
		{"claimed-first", func(s interactiveSample) time.Duration { return s.claimed }, true},
	}
	var t strings.Builder
	fmt.Fprintf(&t, "time to interactive, Docker backend (runtime) vs raw Docker, p50 [n=%d]:\n", len(ours))
	for _, f := range figures {
		o := percentile(collect(ours, f.get), 50)
		b.ReportMetric(ms(o), f.name+"-p50-ms")
		if !f.raw {
			fmt.Fprintf(&t, "  %-14s %7.1fms\n", f.name, ms(o))
			continue
		}
		r := percentile(collect(raws, f.get), 50)
		b.ReportMetric(ms(r), "raw-"+f.name+"-p50-ms")
		fmt.Fprintf(&t, "  %-14s %7.1fms vs raw %7.1fms: ratio %.2f\n", f.name, ms(o), ms(r), float64(o)/float64(r))
	}
	fmt.Fprintf(&t, "a resident helper's start (raw client, p50 from before ExecCreate): ExecCreate %.1fms, ExecAttach/start %.1fms, ready frame %.1fms\n",
		ms(percentile(collect(starts, func(s serveStartSample) time.Duration { return s.execCreate }), 50)),
		ms(percentile(collect(starts, func(s serveStartSample) time.Duration { return s.execStart }), 50)),
		ms(percentile(collect(starts, func(s serveStartSample) time.Duration { return s.ready }), 50)))
	fmt.Fprintf(&t, "an upload by an exec of helper untar (p50 from before ExecCreate): ExecCreate %.1fms, ExecAttach/start %.1fms, streamed %.1fms, ExecInspect %.1fms\n",
		ms(percentile(collect(untars, func(s untarExecSample) time.Duration { return s.execCreate }), 50)),
		ms(percentile(collect(untars, func(s untarExecSample) time.Duration { return s.execStart }), 50)),
		ms(percentile(collect(untars, func(s untarExecSample) time.Duration { return s.streamed }), 50)),
		ms(percentile(collect(untars, func(s untarExecSample) time.Duration { return s.inspected }), 50)))
	// go test keeps only the first run's b.Log of a benchmark; the table
	// of the measured run goes to the output as it is.
	if b.N > 1 {
		fmt.Print(t.String())
	}
}
