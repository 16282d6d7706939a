/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// BenchmarkPreviewDial measures what a preview URL's (and a port-forward's)
// new connection costs on the Docker backend below the MCP server, one HTTP
// GET to busybox httpd in a network-none sandbox on a new connection, three
// ways, alternating: (a) DialPort, which takes the sandbox's idle resident
// helper (portdial_serve.go: a request frame, no exec) and then parks the
// next one in the background; (b) what DialPort cost before, a raw Docker
// exec of `helper dial` carrying the connection; (c) a raw Docker exec of
// `echo hi`, the floor of any exec. ns/op is (a).
func BenchmarkPreviewDial(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()
	fx, err := e.setupExecFixture(ctx, b)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := fx.teardown(ctx, e); err != nil {
			b.Error(err)
		}
	}()
	id := fx.containerID
	var out bytes.Buffer
	res, err := e.docker.RunCommand(ctx, id, execio.Request{Shell: `mkdir -p /tmp/www && echo preview-bench > /tmp/www/index.html &&
		(httpd -f -p 127.0.0.1:8080 -h /tmp/www </dev/null >/dev/null 2>&1 &) &&
		for i in $(seq 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && break; sleep 0.1; done`, TimeoutSeconds: 30}, &out, &out)
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("starting httpd: %+v %v %s", res, err, out.String())
	}

	const get = "GET / HTTP/1.0\r\nHost: 127.0.0.1:8080\r\n\r\n"
	viaDial := func() time.Duration {
		t0 := time.Now()
		conn, err := e.docker.DialPort(ctx, id, 8080)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.WriteString(conn, get); err != nil {
			b.Fatal(err)
		}
		_ = conn.CloseWrite()
		body, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || !strings.Contains(string(body), "preview-bench") {
			b.Fatalf("GET through DialPort: %v %q", err, body)
		}
		return time.Since(t0)
	}
	viaExecDial := func() time.Duration {
		t0 := time.Now()
		created, err := e.raw.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: []string{dockerruntime.HelperPath, "dial", "--port=8080"},
			AttachStdin: true, AttachStdout: true, AttachStderr: true})
		if err != nil {
			b.Fatal(err)
		}
		attach, err := e.raw.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.WriteString(attach.Conn, get); err != nil {
			b.Fatal(err)
		}
		_ = attach.CloseWrite()
		var stdout, stderr bytes.Buffer
		_, err = stdcopy.StdCopy(&stdout, &stderr, attach.Reader)
		attach.Close()
		if err != nil || !strings.Contains(stdout.String(), "preview-bench") {
			b.Fatalf("GET through an exec of helper dial: %v %q %q", err, stdout.String(), stderr.String())
		}
		return time.Since(t0)
	}
	viaDocker := func() time.Duration {
		t0 := time.Now()
		if err := e.rawExec(ctx, id, []string{"echo", "hi"}, "hi\n"); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for range 3 {
		viaDial()
		viaExecDial()
		viaDocker()
	}
	dials := make([]time.Duration, 0, b.N)
	execDials := make([]time.Duration, 0, b.N)
	raws := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			b.StartTimer()
			dials = append(dials, viaDial())
			b.StopTimer()
			execDials = append(execDials, viaExecDial())
			raws = append(raws, viaDocker())
		} else {
			raws = append(raws, viaDocker())
			execDials = append(execDials, viaExecDial())
			b.StartTimer()
			dials = append(dials, viaDial())
			b.StopTimer()
		}
	}
	dialP50, execP50, rawP50 := percentile(dials, 50), percentile(execDials, 50), percentile(raws, 50)
	b.ReportMetric(ms(dialP50), "dial-get-p50-ms")
	b.ReportMetric(ms(percentile(dials, 90)), "dial-get-p90-ms")
	b.ReportMetric(ms(execP50), "exec-dial-get-p50-ms")
	b.ReportMetric(ms(rawP50), "raw-exec-p50-ms")
	b.Logf("new connection + GET p50: %.1fms through the idle resident helper, %.1fms through an exec of helper dial (before), raw Docker exec of echo %.1fms; ratios to raw exec %.2f and %.2f [n=%d]",
		ms(dialP50), ms(execP50), ms(rawP50), float64(dialP50)/float64(max(rawP50, 1)), float64(execP50)/float64(max(rawP50, 1)), b.N)
	b.Logf("per-sample ms (helper | exec dial | raw exec):\n  %s\n  %s\n  %s", msList(dials), msList(execDials), msList(raws))
}
