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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
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
		api, node, raw := p50(viaAPIServer), p50(viaNode), p50(rawDockerExec)
		AddReportEntry("exec p50", fmt.Sprintf("through the API server %v, direct node API %v (API server + aggregated server add %v), raw docker exec CLI %v",
			api.Round(100*time.Microsecond), node.Round(100*time.Microsecond), (api-node).Round(100*time.Microsecond), raw.Round(100*time.Microsecond)))
		GinkgoWriter.Printf("exec p50: API server %v, node API %v, docker exec %v\n", api, node, raw)
	})
})

func latest(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	got := &sandboxv1alpha1.Sandbox{}
	Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(sbx), got)).To(Succeed())
	return got
}
