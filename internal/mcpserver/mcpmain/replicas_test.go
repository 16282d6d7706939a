/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// Two servers on the kubernetes backend against one API server, as two
// replicas behind a Service would be (same owner key: one process). A
// 2025-11-25 client's session goes wherever the balancer sends each
// request. No manager runs here: markReady stands in for one.
var _ = Describe("two kubernetes-backend replicas", Ordered, func() {
	const aliceToken, bobToken = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef01"
	var (
		ns   string
		a, b string
	)

	BeforeAll(func() {
		ns = cp.NewNamespace("mcp-replicas-")
		markReady(ns)
		tokens := filepath.Join(GinkgoT().TempDir(), "tokens")
		Expect(os.WriteFile(tokens, []byte(aliceToken+" alice\n"+bobToken+" bob\n"), 0o600)).To(Succeed())
		replica := func() string {
			return startServer(onHTTP("127.0.0.1:0", "token"), func(o *Config) {
				o.Backend, o.Kubeconfig, o.Namespace, o.TokenFile = "kubernetes", adminKubeconfig, ns, tokens
				o.MaxSandboxes = 2
			})
		}
		a, b = replica(), replica()
	})

	post := func(ctx context.Context, url, token, session, body string) (int, string, string) {
		GinkgoHelper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("MCP-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(out)
	}
	call := func(tool, args string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
	}
	sandboxID := regexp.MustCompile(`mcp-[0-9a-f]{12}`)

	It("serves a session begun on A from B, and a sandbox made through A through B", func(ctx SpecContext) {
		code, sid, body := post(ctx, a, aliceToken, "", initializeBody)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(sid).NotTo(BeEmpty())
		code, _, body = post(ctx, b, aliceToken, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		Expect(code).To(Equal(http.StatusAccepted), "replica B refused replica A's session: %s", body)

		code, _, body = post(ctx, b, aliceToken, sid, call("sandbox_initialize", `{"image":"busybox:1"}`))
		Expect(code).To(Equal(http.StatusOK), body)
		id := sandboxID.FindString(body)
		Expect(id).NotTo(BeEmpty(), "no container_id in %s", body)

		code, _, body = post(ctx, a, aliceToken, sid, call("list_sandboxes", `{}`))
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).To(ContainSubstring(id), "replica A does not list the sandbox made through B")

		// Bob: neither alice's session nor her sandbox, on either replica.
		for _, url := range []string{a, b} {
			code, _, _ = post(ctx, url, bobToken, sid, call("list_sandboxes", `{}`))
			Expect(code).To(Equal(http.StatusNotFound), "bob used alice's session")
		}
		code, bobSID, _ := post(ctx, b, bobToken, "", initializeBody)
		Expect(code).To(Equal(http.StatusOK))
		code, _, body = post(ctx, a, bobToken, bobSID, call("sandbox_stop", `{"container_id":"`+id+`"}`))
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).To(ContainSubstring(`"isError":true`), "bob stopped alice's sandbox: %s", body)

		// A forged session ID (alice's with another MAC) is unknown.
		forged := sid[:len(sid)-1] + map[bool]string{true: "1", false: "0"}[strings.HasSuffix(sid, "0")]
		code, _, _ = post(ctx, b, aliceToken, forged, call("list_sandboxes", `{}`))
		Expect(code).To(Equal(http.StatusNotFound))

		code, _, body = post(ctx, a, aliceToken, sid, call("sandbox_stop", `{"container_id":"`+id+`"}`))
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).NotTo(ContainSubstring(`"isError":true`), "replica A could not stop the sandbox made through B: %s", body)
	}, NodeTimeout(2*time.Minute))
})

// markReady marks every Sandbox in ns Ready, as a node's manager would,
// until the calling container ends.
func markReady(ns string) {
	ctx, cancel := context.WithCancel(context.Background())
	DeferCleanup(cancel)
	go func() {
		defer GinkgoRecover()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var list sandboxv1alpha1.SandboxList
			if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
				continue
			}
			for i := range list.Items {
				sbx := &list.Items[i]
				if sbx.DeletionTimestamp != nil || meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
					continue
				}
				sbx.Status.NodeName = "node-1"
				sbx.Status.NodeAPIEndpoint = "https://127.0.0.1:1"
				meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SandboxConditionReady),
					Status: metav1.ConditionTrue, Reason: "Running", Message: "marked by the test", ObservedGeneration: sbx.Generation})
				if err := cp.Client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
					GinkgoWriter.Printf("marking %s ready: %v\n", sbx.Name, err)
				}
			}
		}
	}()
}
