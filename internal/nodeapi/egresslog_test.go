/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

var _ = Describe("log?egress: the egress proxy's decisions", func() {
	It("serves the decisions about this Sandbox only, tailed, and refuses follow", func() {
		ns := newNamespace()
		sbx := waitReady(createSandbox(ns, uniqueName("egress-log")))
		t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
		asked := make(chan string, 10)
		ts := newTestServer(serverOptions{node: nodeName, runtime: docker, reader: k8sClient,
			egressEvents: func(s string) []subresource.EgressEvent {
				asked <- s
				return []subresource.EgressEvent{
					{Time: t0, Host: "evil.org", Port: 443, Decision: "Refused", Reason: "NotAllowed"},
					{Time: t0.Add(time.Second), Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/x", Decision: "Injected", Reason: "Injected"},
				}
			}}).start()

		resp := ts.do(request{method: http.MethodGet, namespace: ns, name: sbx.Name, subresource: "log", query: "egress=true&tail=1"})
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(resp.Header.Get("Content-Type")).To(Equal(subresource.ContentTypeNDJSON))
		evs := decodeEgress(resp.Body)
		resp.Body.Close()
		Expect(evs).To(Equal([]subresource.EgressEvent{{Time: t0.Add(time.Second), Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/x", Decision: "Injected", Reason: "Injected"}}))
		Expect(asked).To(Receive(Equal(ns + "/" + sbx.Name)))

		resp = ts.do(request{method: http.MethodGet, namespace: ns, name: sbx.Name, subresource: "log", query: "egress=true&follow=true"})
		Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
		Expect(readAll(resp)).To(ContainSubstring("follow is not supported with egress"))
	})

	It("says so on a node without an egress proxy", func() {
		ns := newNamespace()
		sbx := waitReady(createSandbox(ns, uniqueName("egress-none")))
		resp := api.do(request{method: http.MethodGet, namespace: ns, name: sbx.Name, subresource: "log", query: "egress=true"})
		Expect(resp.StatusCode).To(Equal(http.StatusNotFound))
		Expect(readAll(resp)).To(ContainSubstring("runs no egress proxy"))
	})
})

func decodeEgress(r io.Reader) []subresource.EgressEvent {
	GinkgoHelper()
	var out []subresource.EgressEvent
	dec := json.NewDecoder(r)
	for {
		var ev subresource.EgressEvent
		if err := dec.Decode(&ev); err != nil {
			Expect(errors.Is(err, io.EOF)).To(BeTrue(), "%v", err)
			return out
		}
		out = append(out, ev)
	}
}
