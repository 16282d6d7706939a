/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
)

// Issue 27's goals, p50 on one node: forking a sandbox holding 100 MiB in
// /app into 8 children, and a snapshot of it. Reported, never asserted.
const (
	forkGoal     = 2 * time.Second
	snapshotGoal = time.Second
	forkChildren = 8
	forkDataSize = 100 << 20
)

// BenchmarkMCPFork measures sandbox_snapshot and sandbox_fork(snapshot_id,
// count 8) of a sandbox holding 100 MiB of random data in /app, through the
// MCP server on the Docker backend (--warm-pool 0: children are created
// cold), against raw Docker doing the same work on the same hardened spec
// in the same run: a snapshot is `tar -c` of /app through one exec into
// memory; a fork is 8 containers created and started in parallel, each
// fed the tar through an exec of `tar -x`. Cleanup is outside the
// measurement.
func BenchmarkMCPFork(b *testing.B) {
	raw, image := rawDocker(b)
	ctx := context.Background()
	callTool := startMCP(b, buildMCP(b), image, "--warm-pool", "0", "--max-sandboxes", "16")

	out, err := callTool("sandbox_initialize", nil)
	if err != nil {
		b.Fatal(err)
	}
	src := out["container_id"].(string)
	fill := fmt.Sprintf("head -c %d /dev/urandom >/app/data", forkDataSize)
	if _, err := callTool("sandbox_exec", map[string]any{"container_id": src, "commands": []string{fill}}); err != nil {
		b.Fatal(err)
	}
	rawSrc, _, removeSrc := rawCreateStart(ctx, b, raw, image)
	defer removeSrc()
	if _, err := rawExecIO(ctx, raw, rawSrc, []string{"sh", "-c", fill}, nil); err != nil {
		b.Fatal(err)
	}

	mcpSample := func() (snap, fork time.Duration) {
		t0 := time.Now()
		out, err := callTool("sandbox_snapshot", map[string]any{"container_id": src})
		if err != nil {
			b.Fatal(err)
		}
		snap = time.Since(t0)
		id := out["snapshot_id"].(string)
		t1 := time.Now()
		out, err = callTool("sandbox_fork", map[string]any{"snapshot_id": id, "count": forkChildren})
		if err != nil {
			b.Fatal(err)
		}
		fork = time.Since(t1)
		for _, k := range out["sandboxes"].([]any) {
			if _, err := callTool("sandbox_stop", map[string]any{"container_id": k.(map[string]any)["container_id"]}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := callTool("delete_snapshot", map[string]any{"snapshot_id": id}); err != nil {
			b.Fatal(err)
		}
		return snap, fork
	}
	rawSample := func() (snap, fork time.Duration) {
		t0 := time.Now()
		archive, err := rawExecIO(ctx, raw, rawSrc, []string{"tar", "-c", "-C", "/app", "."}, nil)
		if err != nil {
			b.Fatal(err)
		}
		snap = time.Since(t0)
		t1 := time.Now()
		var wg sync.WaitGroup
		removes := make([]func(), forkChildren)
		errs := make([]error, forkChildren)
		for i := range forkChildren {
			wg.Go(func() {
				id, _, remove := rawCreateStart(ctx, b, raw, image)
				removes[i] = remove
				_, errs[i] = rawExecIO(ctx, raw, id, []string{"tar", "-x", "-C", "/app"}, archive)
			})
		}
		wg.Wait()
		fork = time.Since(t1)
		for i := range forkChildren {
			if removes[i] != nil {
				removes[i]()
			}
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
		}
		return snap, fork
	}

	mcpSample()
	rawSample()
	b.ResetTimer()
	b.StopTimer()
	var mSnap, mFork, rSnap, rFork []time.Duration
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			s, f := mcpSample()
			mSnap, mFork = append(mSnap, s), append(mFork, f)
			s, f = rawSample()
			rSnap, rFork = append(rSnap, s), append(rFork, f)
		} else {
			s, f := rawSample()
			rSnap, rFork = append(rSnap, s), append(rFork, f)
			s, f = mcpSample()
			mSnap, mFork = append(mSnap, s), append(mFork, f)
		}
	}
	ms50, rs50 := percentile(mSnap, 50), percentile(rSnap, 50)
	mf50, rf50 := percentile(mFork, 50), percentile(rFork, 50)
	b.ReportMetric(ms(ms50), "mcp-snapshot-p50-ms")
	b.ReportMetric(ms(rs50), "raw-tar-p50-ms")
	b.ReportMetric(ms(mf50), "mcp-fork8-p50-ms")
	b.ReportMetric(ms(rf50), "raw-fork8-p50-ms")
	verdict := func(ok bool) string {
		if ok {
			return "meets"
		}
		return "MISSES"
	}
	b.Logf("sandbox_snapshot (100 MiB) p50 %.0fms vs raw tar p50 %.0fms (goal <= %v; %s it) [n=%d]", ms(ms50), ms(rs50), snapshotGoal, verdict(ms50 <= snapshotGoal), b.N)
	b.Logf("sandbox_fork x%d p50 %.0fms vs raw create+start+untar x%d p50 %.0fms (goal <= %v; %s it)", forkChildren, ms(mf50), forkChildren, ms(rf50), forkGoal, verdict(mf50 <= forkGoal))
}

// rawExecIO runs cmd in container id with stdin and returns its stdout; a
// non-zero exit is an error.
func rawExecIO(ctx context.Context, raw *dockerclient.Client, id string, cmd []string, stdin []byte) ([]byte, error) {
	created, err := raw.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: cmd, AttachStdin: stdin != nil, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return nil, err
	}
	att, err := raw.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, err
	}
	defer att.Close()
	if stdin != nil {
		go func() {
			_, _ = io.Copy(att.Conn, bytes.NewReader(stdin))
			_ = att.CloseWrite()
		}()
	}
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, att.Reader); err != nil {
		return nil, err
	}
	insp, err := raw.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return nil, err
	}
	if insp.ExitCode != 0 {
		return nil, fmt.Errorf("raw exec %v: exit %d: %s", cmd, insp.ExitCode, errOut.String())
	}
	return out.Bytes(), nil
}
