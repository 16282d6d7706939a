/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// fileSample is one iteration of BenchmarkTransfers on one path.
type fileSample struct {
	// repeated is a command of `true`: one round trip through the
	// resident helper (raw: one exec), the floor of a transfer.
	repeated time.Duration
	// goStart is a command of the helper's own `statfs` (ours only): the
	// round trip plus a fork and exec of the Go helper binary, which is
	// what each transfer cost when it ran `helper untar`/`tar` as a
	// command.
	goStart time.Duration
	// write and read are a 1 KiB write_file and read_file (raw: an exec of
	// `sh -c 'cat >f'` and of `cat f`).
	write, read time.Duration
	// cpIn and cpOut are raw `docker cp` of the same 1 KiB (the archive
	// API: PUT and GET /containers/{id}/archive).
	cpIn, cpOut time.Duration
}

// BenchmarkTransfers times, on one sandbox and one raw container, in
// alternating order: a repeated command, a 1 KiB write_file and read_file,
// and (ours) a command that starts the Go helper binary, against raw
// `docker exec` and `docker cp` of the same bytes, in the same run; then a
// 64 MiB upload both ways. p50 and p99, and the load average (the machine
// is shared).
func BenchmarkTransfers(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()
	load0 := loadavg()
	uid := fmt.Sprintf("files-%s-%d", runID, seq.Add(1))
	ct, err := e.docker.CreateAndStart(ctx, dockerruntime.Spec{
		Owner: dockerruntime.Owner{UID: uid, Namespace: namespace, Name: uid, Node: rawNode},
		Image: e.image,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = e.docker.Remove(context.WithoutCancel(ctx), ct.ID, 0) }()
	_, rawID, err := e.rawCreateToRunning(ctx, fmt.Sprintf("files-%d", seq.Add(1)))
	defer func() { _ = e.removeRaw(context.WithoutCancel(ctx), rawID) }()
	if err != nil {
		b.Fatal(err)
	}

	// docker cp refuses a container whose rootfs is read-only, even for a
	// tmpfs in it (Docker 20.10), so its baseline gets a twin of the raw
	// container with a writable rootfs, and copies to its /.
	cpID, err := e.rawWritable(ctx, fmt.Sprintf("files-cp-%d", seq.Add(1)))
	defer func() { _ = e.removeRaw(context.WithoutCancel(ctx), cpID) }()
	if err != nil {
		b.Fatal(err)
	}

	oursOne := func() (fileSample, error) {
		var s fileSample
		t := time.Now()
		if err := runOK(ctx, e.docker, ct.ID, []string{"true"}); err != nil {
			return s, err
		}
		s.repeated = time.Since(t)
		t = time.Now()
		if err := runOK(ctx, e.docker, ct.ID, []string{dockerruntime.HelperPath, "statfs", "--root=/tmp"}); err != nil {
			return s, err
		}
		s.goStart = time.Since(t)
		t = time.Now()
		if _, err := e.docker.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(tarOf("f", oneKiB)), execio.UploadLimits{}); err != nil {
			return s, fmt.Errorf("writing 1 KiB: %w", err)
		}
		s.write = time.Since(t)
		t = time.Now()
		var out bytes.Buffer
		if _, err := e.docker.CopyOut(ctx, ct.ID, execio.Target{Root: "/tmp", Rel: "f"}, &out, 0); err != nil {
			return s, fmt.Errorf("reading 1 KiB: %w", err)
		}
		s.read = time.Since(t)
		if !bytes.Contains(out.Bytes(), oneKiB) {
			return s, errors.New("the file read back is not the one written")
		}
		return s, nil
	}
	rawOne := func() (fileSample, error) {
		var s fileSample
		t := time.Now()
		if err := e.rawExec(ctx, rawID, []string{"true"}, ""); err != nil {
			return s, err
		}
		s.repeated = time.Since(t)
		t = time.Now()
		if err := e.rawExecStdin(ctx, rawID, []string{"sh", "-c", "cat > /tmp/f"}, oneKiB); err != nil {
			return s, err
		}
		s.write = time.Since(t)
		t = time.Now()
		if err := e.rawExec(ctx, rawID, []string{"cat", "/tmp/f"}, string(oneKiB)); err != nil {
			return s, err
		}
		s.read = time.Since(t)
		t = time.Now()
		if err := e.raw.CopyToContainer(ctx, cpID, "/", bytes.NewReader(tarOf("g", oneKiB)), container.CopyToContainerOptions{}); err != nil {
			return s, fmt.Errorf("raw docker cp in: %w", err)
		}
		s.cpIn = time.Since(t)
		t = time.Now()
		rc, _, err := e.raw.CopyFromContainer(ctx, cpID, "/g")
		if err != nil {
			return s, fmt.Errorf("raw docker cp out: %w", err)
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		s.cpOut = time.Since(t)
		return s, err
	}
	// Warm up: the helper's pages, Docker's paths.
	if _, err := oursOne(); err != nil {
		b.Fatal(err)
	}
	if _, err := rawOne(); err != nil {
		b.Fatal(err)
	}
	var ours, raws []fileSample
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		for _, first := range []bool{i%2 == 0, i%2 != 0} {
			if first {
				s, err := oursOne()
				if err != nil {
					b.Fatal(err)
				}
				ours = append(ours, s)
			} else {
				s, err := rawOne()
				if err != nil {
					b.Fatal(err)
				}
				raws = append(raws, s)
			}
		}
	}
	// ns/op is ours write_file 1 KiB.
	var total time.Duration
	for _, s := range ours {
		total += s.write
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(len(ours)), "ns/op")

	// A 64 MiB upload, once each way, after the timed loop.
	big := tarOf("big", bytes.Repeat([]byte("0123456789abcdef"), 4<<20))
	t := time.Now()
	if _, err := e.docker.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(big), execio.UploadLimits{MaxBytes: 128 << 20}); err != nil {
		b.Fatalf("uploading 64 MiB: %v", err)
	}
	big64 := time.Since(t)
	t = time.Now()
	if err := e.raw.CopyToContainer(ctx, cpID, "/", bytes.NewReader(big), container.CopyToContainerOptions{}); err != nil {
		b.Fatalf("raw docker cp of 64 MiB: %v", err)
	}
	rawBig64 := time.Since(t)

	var out strings.Builder
	fmt.Fprintf(&out, "file transfers, Docker backend (runtime) vs raw Docker on one container each, [n=%d], load %s -> %s:\n", len(ours), load0, loadavg())
	type figure struct {
		name string
		get  func(fileSample) time.Duration
		raw  string // the raw figure's name, "" for none
	}
	for _, f := range []figure{
		{"repeated-exec", func(s fileSample) time.Duration { return s.repeated }, "exec true"},
		{"go-helper-cmd", func(s fileSample) time.Duration { return s.goStart }, ""},
		{"write-1k", func(s fileSample) time.Duration { return s.write }, "exec cat>f"},
		{"read-1k", func(s fileSample) time.Duration { return s.read }, "exec cat f"},
	} {
		o50, o99 := percentile(collect(ours, f.get), 50), percentile(collect(ours, f.get), 99)
		b.ReportMetric(ms(o50), f.name+"-p50-ms")
		b.ReportMetric(ms(o99), f.name+"-p99-ms")
		if f.raw == "" {
			fmt.Fprintf(&out, "  %-14s p50 %6.1fms p99 %6.1fms\n", f.name, ms(o50), ms(o99))
			continue
		}
		r50, r99 := percentile(collect(raws, f.get), 50), percentile(collect(raws, f.get), 99)
		fmt.Fprintf(&out, "  %-14s p50 %6.1fms p99 %6.1fms vs raw %s p50 %6.1fms p99 %6.1fms: ratio p50 %.2f p99 %.2f\n",
			f.name, ms(o50), ms(o99), f.raw, ms(r50), ms(r99), float64(o50)/float64(r50), float64(o99)/float64(r99))
	}
	for _, f := range []figure{
		{"write-1k", func(s fileSample) time.Duration { return s.cpIn }, "docker cp in"},
		{"read-1k", func(s fileSample) time.Duration { return s.cpOut }, "docker cp out"},
	} {
		get := func(s fileSample) time.Duration { return s.write }
		if f.name == "read-1k" {
			get = func(s fileSample) time.Duration { return s.read }
		}
		o50, o99 := percentile(collect(ours, get), 50), percentile(collect(ours, get), 99)
		r50, r99 := percentile(collect(raws, f.get), 50), percentile(collect(raws, f.get), 99)
		fmt.Fprintf(&out, "  %-14s vs raw %s p50 %6.1fms p99 %6.1fms: ratio p50 %.2f p99 %.2f\n",
			f.name, f.raw, ms(r50), ms(r99), float64(o50)/float64(r50), float64(o99)/float64(r99))
	}
	fmt.Fprintf(&out, "  upload 64 MiB  %6.0fms vs raw docker cp %6.0fms: ratio %.2f\n", ms(big64), ms(rawBig64), float64(big64)/float64(rawBig64))
	b.ReportMetric(ms(big64), "upload-64m-ms")
	if b.N > 1 {
		fmt.Print(out.String())
	}
}

// BenchmarkNodeAPITransfers times a 1 KiB write_file and read_file through
// the node API (mutual TLS, front-proxy identity, the Sandbox lookup and
// ownership check, the exec slots, then the runtime), as the aggregated API
// server forwards them for the kubernetes backend, next to the runtime
// alone and raw `docker exec`, in the same run. What kube-apiserver and the
// aggregated API server add on top is not in it (the e2e part of make
// bench, label bench, measures the whole path on kind).
func BenchmarkNodeAPITransfers(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()
	load0 := loadavg()
	fx, err := e.setupExecFixture(ctx, b)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := fx.teardown(ctx, e); err != nil {
			b.Error(err)
		}
	}()
	api, name, id := fx.api, fx.sandbox, fx.containerID
	url := fmt.Sprintf("%s%s%s/sandboxes/%s/%s?path=/tmp/f", api.endpoint, subresource.PathPrefix, namespace, name, subresource.SubresourceFiles)
	call := func(method string, body []byte) ([]byte, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, url, rd)
		if err != nil {
			return nil, err
		}
		req.Header.Set(subresource.HeaderRemoteUser, benchUser)
		req.Header.Set(subresource.HeaderRemoteGroup, "system:authenticated")
		if body != nil {
			req.Header.Set("Content-Type", subresource.ContentTypeBinary)
		}
		resp, err := api.client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("node API %s files: %s: %s", method, resp.Status, out)
		}
		return out, err
	}
	type sample struct{ apiWrite, apiRead, rtWrite, rawWrite time.Duration }
	one := func() (sample, error) {
		var s sample
		t := time.Now()
		if _, err := call(http.MethodPost, oneKiB); err != nil {
			return s, err
		}
		s.apiWrite = time.Since(t)
		t = time.Now()
		out, err := call(http.MethodGet, nil)
		if err != nil {
			return s, err
		}
		s.apiRead = time.Since(t)
		if !bytes.Contains(out, oneKiB) {
			return s, errors.New("the file read back is not the one written")
		}
		t = time.Now()
		if _, err := e.docker.CopyIn(ctx, id, execio.Target{Root: "/tmp"}, bytes.NewReader(tarOf("g", oneKiB)), execio.UploadLimits{}); err != nil {
			return s, err
		}
		s.rtWrite = time.Since(t)
		t = time.Now()
		if err := e.rawExecStdin(ctx, id, []string{"sh", "-c", "cat > /tmp/h"}, oneKiB); err != nil {
			return s, err
		}
		s.rawWrite = time.Since(t)
		return s, nil
	}
	for range 3 {
		if _, err := one(); err != nil {
			b.Fatal(err)
		}
	}
	var samples []sample
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		s, err := one()
		if err != nil {
			b.Fatal(err)
		}
		samples = append(samples, s)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "file transfers through the node API (mTLS), 1 KiB, [n=%d], load %s -> %s:\n", len(samples), load0, loadavg())
	for _, f := range []struct {
		name string
		get  func(sample) time.Duration
	}{
		{"node API write_file", func(s sample) time.Duration { return s.apiWrite }},
		{"node API read_file", func(s sample) time.Duration { return s.apiRead }},
		{"runtime write_file", func(s sample) time.Duration { return s.rtWrite }},
		{"raw exec cat>f", func(s sample) time.Duration { return s.rawWrite }},
	} {
		p50, p99 := percentile(collect(samples, f.get), 50), percentile(collect(samples, f.get), 99)
		fmt.Fprintf(&out, "  %-20s p50 %6.1fms p99 %6.1fms\n", f.name, ms(p50), ms(p99))
	}
	w50 := percentile(collect(samples, func(s sample) time.Duration { return s.apiWrite }), 50)
	r50 := percentile(collect(samples, func(s sample) time.Duration { return s.rawWrite }), 50)
	fmt.Fprintf(&out, "  node API write_file vs raw exec: ratio p50 %.2f\n", float64(w50)/float64(r50))
	b.ReportMetric(ms(w50), "api-write-1k-p50-ms")
	if b.N > 1 {
		fmt.Print(out.String())
	}
}

// runOK runs argv through the runtime and wants exit 0.
func runOK(ctx context.Context, rt *dockerruntime.Client, id string, argv []string) error {
	var stderr bytes.Buffer
	res, err := rt.RunCommand(ctx, id, execio.Request{Command: argv}, io.Discard, &stderr)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%v exited %d: %s", argv, res.ExitCode, stderr.String())
	}
	return err
}

// rawWritable is a raw container as rawCreateToRunning makes one, but with
// a writable rootfs (for docker cp), running.
func (e *benchEnv) rawWritable(ctx context.Context, name string) (string, error) {
	uid := fmt.Sprintf("raw-%s-%s", runID, name)
	cfg, hostCfg, err := dockerruntime.BuildContainerConfig(dockerruntime.Spec{
		Owner: dockerruntime.Owner{UID: uid, Namespace: namespace, Name: name, Node: rawNode},
		Image: e.image,
	})
	if err != nil {
		return "", err
	}
	hostCfg.ReadonlyRootfs = false
	created, err := e.raw.ContainerCreate(ctx, cfg, hostCfg, nil, nil, dockerruntime.ContainerName(uid))
	if err != nil {
		return "", fmt.Errorf("raw ContainerCreate: %w", err)
	}
	if err := e.raw.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return created.ID, fmt.Errorf("raw ContainerStart: %w", err)
	}
	return created.ID, nil
}
