/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package integration_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// The extra cost of the trust model's data path, reported (never asserted:
// these machines are noisy) as p50s measured in the same run: an exec
// through the API server and the aggregated API server, the same exec
// sent straight to the node API with the aggregated server's client
// certificate, and `docker exec` of the same command in the same
// container. Run with CODE_SANDBOX_LATENCY=1 (make bench does).
var _ = Describe("exec latency through the API server", Label("integration", "latency"), func() {
	It("reports p50s against a direct node API call and raw docker exec", func() {
		if os.Getenv("CODE_SANDBOX_LATENCY") == "" {
			Skip("set CODE_SANDBOX_LATENCY=1 to measure")
		}
		const rounds = 40
		ns := newNamespace()
		sbx := createSandbox(ns, "latency")
		waitReady(sbx)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c := newClient(cfg)
		req := execio.Request{Command: []string{"echo", "hi"}}

		viaAPIServer := func() error {
			var out bytes.Buffer
			_, err := c.Exec(ctx, sandboxclient.Named(ns, "latency"), req, &out, nil)
			return err
		}
		endpoint := latest(sbx).Status.NodeAPIEndpoint
		direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			GetClientCertificate: operator.Authority.ClientCertificate(operatorca.AggregatorCommonName),
			InsecureSkipVerify:   true, //nolint:gosec // VerifyNode below
			VerifyConnection:     operatorca.VerifyNode(operator.Authority.Pool, nodeName),
		}, ForceAttemptHTTP2: true}}
		body, _ := json.Marshal(req)
		viaNode := func() error {
			hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+subresource.PathPrefix+ns+"/sandboxes/latency/exec", bytes.NewReader(body))
			hreq.Header.Set(subresource.HeaderRemoteUser, "latency-test")
			resp, err := direct.Do(hreq)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("node API: %s", resp.Status)
			}
			return nil
		}
		containerID := latest(sbx).Status.ContainerID
		rawDockerExec := func() error {
			return exec.CommandContext(ctx, "docker", "exec", containerID, "echo", "hi").Run()
		}
		p50 := func(f func() error) time.Duration {
			GinkgoHelper()
			Expect(f()).To(Succeed()) // warm connections and caches
			var d []time.Duration
			for range rounds {
				t0 := time.Now()
				Expect(f()).To(Succeed())
				d = append(d, time.Since(t0))
			}
			slices.Sort(d)
			return d[len(d)/2]
		}
		// The innermost hop: the node's runtime, the resident helper's own
		// round trip (dockerd's attach stream, the helper, fork/exec).
		viaRuntime := func() error {
			var out bytes.Buffer
			_, err := node.Docker.RunCommand(ctx, containerID, req, &out, io.Discard)
			return err
		}
		// A Sandbox GET through the API server: what kube-apiserver's own
		// authentication, routing and a round trip cost, with no proxying.
		apiGet := func() error {
			return k8sClient.Get(ctx, client.ObjectKeyFromObject(sbx), &sandboxv1alpha1.Sandbox{})
		}
		var api, viaNodeP50, rt, get, raw time.Duration
		for range 2 { // interleaved twice, so that a burst of load hits both
			api, viaNodeP50, rt, get, raw = p50(viaAPIServer), p50(viaNode), p50(viaRuntime), p50(apiGet), p50(rawDockerExec)
		}
		r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
		AddReportEntry("exec p50", fmt.Sprintf("through the API server %v, direct node API %v (API server + aggregated server add %v), runtime (helper round trip) %v (node API server adds %v), Sandbox GET through the API server %v, raw docker exec CLI %v",
			r(api), r(viaNodeP50), r(api-viaNodeP50), r(rt), r(viaNodeP50-rt), r(get), r(raw)))
		GinkgoWriter.Printf("exec p50: API server %v, node API %v, runtime %v, GET %v, docker exec %v; load %s\n", api, viaNodeP50, rt, get, raw, loadAverage())
	})

	It("reports create-to-Ready, the first exec after Ready and time to interactive against raw docker run + exec", func() {
		if os.Getenv("CODE_SANDBOX_LATENCY") == "" {
			Skip("set CODE_SANDBOX_LATENCY=1 to measure")
		}
		const rounds = 8
		ns := newNamespace()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c := newClient(cfg)
		wc, err := client.NewWithWatch(cfg, client.Options{Scheme: cp.Scheme})
		Expect(err).NotTo(HaveOccurred())
		req := execio.Request{Command: []string{"echo", "hi"}}
		var ready, first, tti, rawRun, rawFirst, rawTTI []time.Duration
		one := func(i int) {
			name := fmt.Sprintf("tti-%d", i)
			w, err := wc.Watch(ctx, &sandboxv1alpha1.SandboxList{}, &client.ListOptions{Namespace: ns,
				FieldSelector: fields.OneTermEqualSelector("metadata.name", name), Raw: &metav1.ListOptions{ResourceVersion: "0"}})
			Expect(err).NotTo(HaveOccurred())
			defer w.Stop()
			t0 := time.Now()
			createSandbox(ns, name)
			for ev := range w.ResultChan() {
				got, ok := ev.Object.(*sandboxv1alpha1.Sandbox)
				if ok && meta.IsStatusConditionTrue(got.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) && got.Status.NodeAPIEndpoint != "" {
					break
				}
			}
			tReady := time.Since(t0)
			var out bytes.Buffer
			_, err = c.Exec(ctx, sandboxclient.Named(ns, name), req, &out, nil)
			Expect(err).NotTo(HaveOccurred())
			total := time.Since(t0)
			ready, first, tti = append(ready, tReady), append(first, total-tReady), append(tti, total)

			cname := fmt.Sprintf("sandbox-latency-raw-%x-%d", time.Now().UnixNano()&0xffffff, i)
			t0 = time.Now()
			Expect(exec.CommandContext(ctx, "docker", "run", "-d", "--name", cname, busyboxImage, "sleep", "3600").Run()).To(Succeed())
			tRun := time.Since(t0)
			Expect(exec.CommandContext(ctx, "docker", "exec", cname, "echo", "hi").Run()).To(Succeed())
			total = time.Since(t0)
			rawRun, rawFirst, rawTTI = append(rawRun, tRun), append(rawFirst, total-tRun), append(rawTTI, total)
			_ = exec.Command("docker", "rm", "-f", cname).Run()
		}
		for i := range rounds {
			one(i)
		}
		med := func(d []time.Duration) time.Duration {
			slices.Sort(d)
			return d[len(d)/2].Round(100 * time.Microsecond)
		}
		AddReportEntry("time to interactive p50", fmt.Sprintf("through the API server: create-to-Ready %v, first exec %v, total %v; raw docker CLI: run -d %v, first exec %v, total %v (n=%d, load %s)",
			med(ready), med(first), med(tti), med(rawRun), med(rawFirst), med(rawTTI), rounds, loadAverage()))
	})
})

// loadAverage is the host's 1/5/15-minute load: these figures are only
// comparable within a run, and the machine is shared.
func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func latest(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	got := &sandboxv1alpha1.Sandbox{}
	Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(sbx), got)).To(Succeed())
	return got
}
