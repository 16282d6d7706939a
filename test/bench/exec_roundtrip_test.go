/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// execGoalOverhead is the goal for node API p50 minus raw Docker exec p50.
// Reported, never asserted.
const execGoalOverhead = 10 * time.Millisecond

// nodeAPIBench is a node API server for the benchmark's node and a client
// that calls it as the operator's aggregated API server does.
type nodeAPIBench struct {
	endpoint string
	client   *http.Client
	stop     func()
}

// benchUser is the identity the benchmark's requests carry in the
// front-proxy headers, as the aggregated API server passes on the caller's.
const benchUser = "bench-runner"

// startNodeAPI serves the node API for benchNode as the manager does: a
// cache-backed Sandbox reader, mutual TLS with a node serving certificate
// from an operator CA, and only that CA's aggregated API server client
// certificate accepted, the user in front-proxy headers. The client is the
// aggregated API server's: its client certificate, the node's certificate
// checked against the CA and the node's name, a kept-alive connection.
func (e *benchEnv) startNodeAPI(ctx context.Context) (*nodeAPIBench, error) {
	ca, err := operatorca.NewCA("bench-operator-ca", time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	serving, err := ca.IssueNode(benchNode, time.Hour)
	if err != nil {
		return nil, err
	}
	clientCert, err := ca.IssueClient(operatorca.AggregatorCommonName, nil, time.Hour)
	if err != nil {
		return nil, err
	}
	authn, err := nodeapi.NewFrontProxyAuthenticator(ca.Pool, []string{operatorca.AggregatorCommonName})
	if err != nil {
		return nil, err
	}
	tlsConfig, err := nodeapi.ServerTLSConfig(nodeapi.TLSOptions{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving, nil },
		ClientCAs:      ca.Pool,
	})
	if err != nil {
		return nil, err
	}

	sbxCache, err := cache.New(e.testEnv.Config, cache.Options{Scheme: e.k8s.Scheme()})
	if err != nil {
		return nil, err
	}
	// Informer for Sandboxes, as the manager's controller has.
	if _, err := sbxCache.GetInformer(ctx, &sandboxv1alpha1.Sandbox{}); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	go func() { _ = sbxCache.Start(runCtx) }()
	if !sbxCache.WaitForCacheSync(ctx) {
		cancel()
		return nil, fmt.Errorf("the node API's cache did not sync")
	}
	hist, err := history.New("", 0)
	if err != nil {
		cancel()
		return nil, err
	}
	srv, err := nodeapi.NewServer(nodeapi.Config{
		NodeName:      benchNode,
		Sandboxes:     sbxCache,
		APIReader:     e.k8s,
		Runtime:       e.docker,
		History:       hist,
		Authenticator: authn,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = nodeapi.NewRunnable("nodeapi", l, srv, tlsConfig).Start(runCtx)
	}()
	return &nodeAPIBench{
		endpoint: "https://" + l.Addr().String(),
		client: &http.Client{Transport: &http.Transport{
			ForceAttemptHTTP2: true,
			TLSClientConfig: &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*clientCert},
				// Verified by VerifyNode: chain and node name, not the
				// address.
				InsecureSkipVerify: true, //nolint:gosec
				VerifyConnection:   operatorca.VerifyNode(ca.Pool, benchNode),
			},
		}},
		stop: func() {
			cancel()
			<-done
		},
	}, nil
}

// execBenchFixture is the node API server and the Sandbox of one run of
// BenchmarkExecRoundTrip.
type execBenchFixture struct {
	api         *nodeAPIBench
	sandbox     string
	containerID string
}

func (fx execBenchFixture) teardown(ctx context.Context, e *benchEnv) error {
	err := e.deleteSandbox(ctx, fx.sandbox, fx.containerID)
	fx.api.stop()
	return err
}

// setupExecFixture starts the node API and a Ready Sandbox.
func (e *benchEnv) setupExecFixture(ctx context.Context, b *testing.B) (execBenchFixture, error) {
	api, err := e.startNodeAPI(ctx)
	if err != nil {
		return execBenchFixture{}, err
	}
	name := fmt.Sprintf("bench-exec-%s-%d", runID, seq.Add(1))
	_, containerID, err := e.operatorCreateToReady(ctx, b, name)
	b.StopTimer()
	if err != nil {
		api.stop()
		return execBenchFixture{}, err
	}
	return execBenchFixture{api: api, sandbox: name, containerID: containerID}, nil
}

// exec runs one command through the node API and checks its output.
func (n *nodeAPIBench) exec(ctx context.Context, sandbox string, req execio.Request, want string) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("%s%s%s/sandboxes/%s/%s", n.endpoint, subresource.PathPrefix, namespace, sandbox, subresource.SubresourceExec)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set(subresource.HeaderRemoteUser, benchUser)
	hreq.Header.Set(subresource.HeaderRemoteGroup, "system:authenticated")
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := n.client.Do(hreq)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("node API exec: %s: %s", resp.Status, msg)
	}
	var stdout bytes.Buffer
	var result *execio.Result
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var f subresource.Frame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fmt.Errorf("decoding frame %q: %w", sc.Text(), err)
		}
		switch {
		case f.Stream == subresource.StreamStdout:
			stdout.Write(f.Data)
		case f.Error != "":
			return fmt.Errorf("node API exec failed: %s", f.Error)
		case f.Result != nil:
			result = f.Result
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if result == nil || result.ExitCode != 0 || stdout.String() != want {
		return fmt.Errorf("node API exec: result %+v, stdout %q", result, stdout.String())
	}
	return nil
}

// rawExec is the baseline: ExecCreate, Attach, read to the end, Inspect, as
// any Docker client runs a command.
func (e *benchEnv) rawExec(ctx context.Context, containerID string, cmd []string, want string) error {
	created, err := e.raw.ContainerExecCreate(ctx, containerID, container.ExecOptions{Cmd: cmd, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return fmt.Errorf("raw ExecCreate: %w", err)
	}
	attach, err := e.raw.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return fmt.Errorf("raw ExecAttach: %w", err)
	}
	defer attach.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, attach.Reader); err != nil {
		return fmt.Errorf("raw exec output: %w", err)
	}
	insp, err := e.raw.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return fmt.Errorf("raw ExecInspect: %w", err)
	}
	if insp.ExitCode != 0 || stdout.String() != want {
		return fmt.Errorf("raw exec: exit %d, stdout %q, stderr %q", insp.ExitCode, stdout.String(), stderr.String())
	}
	return nil
}

// BenchmarkExecRoundTrip compares, per iteration and in alternating order,
// (a) `echo hi` through the node API (mutual TLS on a kept-alive
// connection, the caller in front-proxy headers, NDJSON frames, history
// recorded)
// against (b) a raw Docker exec of `echo hi` (ExecCreate + Attach + Inspect)
// in the same container. ns/op is the node API path alone; the custom
// metrics hold both paths' percentiles and the p50 overhead.
func BenchmarkExecRoundTrip(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()
	fx, err := e.setupExecFixture(ctx, b)
	if err != nil {
		b.Fatal(err)
	}
	// Everything goes before the environment's teardown: an open watch
	// would keep kube-apiserver from stopping.
	defer func() {
		if err := fx.teardown(ctx, e); err != nil {
			b.Error(err)
		}
	}()
	api, name, containerID := fx.api, fx.sandbox, fx.containerID

	echo := execio.Request{Command: []string{"echo", "hi"}}
	viaAPI := func() time.Duration {
		t0 := time.Now()
		if err := api.exec(ctx, name, echo, "hi\n"); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	// The runtime alone (helper, tree kill, caps), without HTTP, auth or
	// the ownership check: splits the overhead between the server and the
	// runtime.
	viaRuntime := func() time.Duration {
		t0 := time.Now()
		var stdout bytes.Buffer
		res, err := e.docker.RunCommand(ctx, containerID, echo, &stdout, io.Discard)
		if err != nil || res.ExitCode != 0 || stdout.String() != "hi\n" {
			b.Fatalf("RunCommand: %+v %q %v", res, stdout.String(), err)
		}
		return time.Since(t0)
	}
	viaDocker := func() time.Duration {
		t0 := time.Now()
		if err := e.rawExec(ctx, containerID, []string{"echo", "hi"}, "hi\n"); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}

	// Warm up: the TLS connection, the cache's copy of the Sandbox, and
	// Docker's own paths.
	for range 3 {
		viaAPI()
		viaRuntime()
		viaDocker()
	}
	b.ResetTimer()
	b.StopTimer()

	apis := make([]time.Duration, 0, b.N)
	rts := make([]time.Duration, 0, b.N)
	raws := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		// Alternate which path goes first so that drifting machine noise
		// lands on all evenly. Only the node API path is timed as ns/op.
		if i%2 == 0 {
			b.StartTimer()
			apis = append(apis, viaAPI())
			b.StopTimer()
			rts = append(rts, viaRuntime())
			raws = append(raws, viaDocker())
		} else {
			raws = append(raws, viaDocker())
			rts = append(rts, viaRuntime())
			b.StartTimer()
			apis = append(apis, viaAPI())
			b.StopTimer()
		}
	}

	apiP50, apiP90 := percentile(apis, 50), percentile(apis, 90)
	rawP50, rawP90 := percentile(raws, 50), percentile(raws, 90)
	rtP50 := percentile(rts, 50)
	overhead := apiP50 - rawP50
	b.ReportMetric(ms(apiP50), "api-p50-ms")
	b.ReportMetric(ms(apiP90), "api-p90-ms")
	b.ReportMetric(ms(rawP50), "raw-p50-ms")
	b.ReportMetric(ms(rawP90), "raw-p90-ms")
	b.ReportMetric(ms(rtP50), "runtime-p50-ms")
	b.ReportMetric(ms(overhead), "p50-overhead-ms")
	verdict := "meets"
	if overhead > execGoalOverhead {
		verdict = "MISSES"
	}
	b.Logf("exec round trip p50 %.1fms via the node API vs %.1fms raw Docker exec: overhead %.1fms (goal < %s; %s it) [n=%d, p90 %.1fms vs %.1fms]",
		ms(apiP50), ms(rawP50), ms(overhead), execGoalOverhead, verdict, b.N, ms(apiP90), ms(rawP90))
	b.Logf("of which the runtime (helper, tree kill, caps) takes %.1fms and the server (mutual TLS, front-proxy identity, lookup, ownership check, frames, history) %.1fms",
		ms(rtP50-rawP50), ms(apiP50-rtP50))
	b.Logf("per-sample ms (node API | runtime | raw):\n  %s\n  %s\n  %s", msList(apis), msList(rts), msList(raws))
}
