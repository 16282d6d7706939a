/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// BenchmarkForkPhases says where BenchmarkMCPFork's time goes, on the
// runtime directly (no MCP, no API server): for a snapshot of a sandbox
// holding 100 MiB in /app, the helper's exec round trip (spawn, freeze and
// thaw of an idle sandbox: `helper thaw`), the snapshot into io.Discard
// (freeze + tar read + the recount on this side) and into a file (+ the
// store write); for a fork ×8 done in parallel, each child's create+start,
// its resident helper's start (CheckHealth), and its restore, from the
// snapshot file. Reported, never asserted.
func BenchmarkForkPhases(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	src, err := e.oursIdle(ctx, "phases-src", false)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = e.docker.Remove(context.WithoutCancel(ctx), src, 0) }()
	fill := fmt.Sprintf("head -c %d /dev/urandom >/app/data", forkDataSize)
	if res, err := e.docker.Exec(ctx, src, dockerruntime.ExecOptions{Cmd: []string{"sh", "-c", fill}}, io.Discard, io.Discard); err != nil || res.ExitCode != 0 {
		b.Fatalf("filling /app: %v %+v", err, res)
	}
	dir := b.TempDir()
	roots := dockerruntime.SnapshotRoots("")
	type phases map[string][]time.Duration
	got := phases{}
	var mu sync.Mutex
	add := func(k string, d time.Duration) {
		mu.Lock()
		got[k] = append(got[k], d)
		mu.Unlock()
	}
	timed := func(k string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", k, err)
		}
		add(k, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		timed("snapshot: helper exec round trip (thaw)", func() error {
			_, err := e.docker.Exec(ctx, src, dockerruntime.ExecOptions{Cmd: []string{dockerruntime.HelperPath, "thaw"}}, io.Discard, io.Discard)
			return err
		})
		timed("snapshot: freeze+tar read into io.Discard", func() error {
			_, err := e.docker.Snapshot(ctx, src, roots, io.Discard, 0)
			return err
		})
		path := filepath.Join(dir, fmt.Sprintf("s%d.tar", i))
		timed("snapshot: freeze+tar read+file write", func() error {
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			if _, err := e.docker.Snapshot(ctx, src, roots, f, 0); err != nil {
				return err
			}
			return f.Close()
		})
		open := func() (io.ReadCloser, error) { return os.Open(path) }
		ids := make([]string, forkChildren)
		t0 := time.Now()
		var wg sync.WaitGroup
		for k := range forkChildren {
			wg.Go(func() {
				t := time.Now()
				ct, err := e.docker.CreateAndStart(ctx, dockerruntime.Spec{
					Owner: dockerruntime.Owner{UID: fmt.Sprintf("phases-%s-%d", runID, seq.Add(1)), Namespace: namespace, Name: "phases", Node: rawNode},
					Image: e.image,
				})
				ids[k] = ct.ID
				if err != nil {
					b.Error(err)
					return
				}
				add("fork child: create+start", time.Since(t))
				t = time.Now()
				if err := e.docker.CheckHealth(ctx, ct.ID); err != nil {
					b.Error(err)
					return
				}
				add("fork child: resident helper start (CheckHealth)", time.Since(t))
				t = time.Now()
				if _, err := e.docker.Restore(ctx, ct.ID, roots, open, execio.UploadLimits{MaxBytes: 3 * dockerruntime.DefaultDiskBytes}); err != nil {
					b.Error(err)
					return
				}
				add("fork child: restore write", time.Since(t))
			})
		}
		wg.Wait()
		add("fork x8 total", time.Since(t0))
		// One restore alone, to see what 8 at once cost each other, and
		// raw Docker's `tar -x` of the same 100 MiB alone into the same
		// child, after it.
		if ids[0] != "" {
			timed("restore alone (into child 0 again)", func() error {
				_, err := e.docker.Restore(ctx, ids[0], roots, open, execio.UploadLimits{MaxBytes: 3 * dockerruntime.DefaultDiskBytes})
				return err
			})
			archive, err := rawExecIO(ctx, e.raw, src, []string{"tar", "-c", "-C", "/app", "."}, nil)
			if err != nil {
				b.Fatal(err)
			}
			timed("raw exec tar -x alone (into child 0 again)", func() error {
				_, err := rawExecIO(ctx, e.raw, ids[0], []string{"tar", "-x", "-C", "/app"}, archive)
				return err
			})
		}
		for _, id := range ids {
			if id != "" {
				_ = e.docker.Remove(context.WithoutCancel(ctx), id, 0)
			}
		}
		_ = os.Remove(path)
		if b.Failed() {
			b.FailNow()
		}
	}
	b.StopTimer()
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	fmt.Fprintf(&sb, "fork phases (100 MiB in /app, %d children in parallel), load %s:\n", forkChildren, loadavg())
	for _, k := range keys {
		fmt.Fprintf(&sb, "  %-50s p50 %6.0fms  max %6.0fms  n=%d\n", k, ms(percentile(got[k], 50)), ms(percentile(got[k], 100)), len(got[k]))
	}
	b.Log(sb.String())
}
