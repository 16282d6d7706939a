/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// The webhook writes quota status on every admitted create, so a forged
// AdmissionReview from any pod that reaches its port would add
// reservations at will. It takes requests only from kube-apiserver, which
// proves itself with the client certificate of its admission
// configuration.
var _ = Describe("the webhook's callers", func() {
	forge := func(ns string, cert *tls.Certificate) (*http.Response, error) {
		sbx := newSandbox(ns)
		sbx.Name, sbx.UID = "forged", types.UID("forged-uid")
		sbx.TypeMeta = metav1.TypeMeta{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "Sandbox"}
		obj, err := json.Marshal(sbx)
		Expect(err).NotTo(HaveOccurred())
		review := admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "forged-request", Operation: admissionv1.Create, Namespace: ns, Name: sbx.Name,
				Kind:     metav1.GroupVersionKind{Group: sandboxv1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: "Sandbox"},
				Resource: metav1.GroupVersionResource{Group: sandboxv1alpha1.GroupVersion.Group, Version: "v1alpha1", Resource: "sandboxes"},
				Object:   runtime.RawExtension{Raw: obj}, DryRun: ptr.To(false)},
		}
		body, err := json.Marshal(review)
		Expect(err).NotTo(HaveOccurred())
		tlsConfig := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the attacker does not care who serves
		if cert != nil {
			// Sent whatever CAs the server names as acceptable.
			tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
		wio := cp.Env.WebhookInstallOptions
		url := "https://" + net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort)) + admission.Path
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return resp, err
	}

	It("refuses a forged AdmissionReview without kube-apiserver's client certificate, and admits kube-apiserver's own call", func() {
		ns := cp.NewNamespace("quota-auth-")
		q := newQuota(ns, "team", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1000)}})

		_, err := forge(ns, nil)
		Expect(err).To(MatchError(ContainSubstring("certificate required")), "no client certificate")

		// A certificate from any other CA (say the operator's own, or one
		// a pod made up) is refused just the same.
		other, err := operatorca.NewCA("not-kube-apiserver", time.Hour, time.Now())
		Expect(err).NotTo(HaveOccurred())
		cert, err := other.IssueClient("kube-apiserver-webhook-client", nil, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		_, err = forge(ns, cert)
		Expect(err).To(MatchError(ContainSubstring("unknown certificate authority")), "a client certificate from another CA")

		Consistently(func(g Gomega) {
			g.Expect(getQuota(q).Status.Reservations).To(BeEmpty())
		}, time.Second, 100*time.Millisecond).Should(Succeed())

		// kube-apiserver presents its certificate, so its calls go through
		// and charge the quota.
		sbx := newSandbox(ns)
		Expect(create(sbx)).To(Succeed())
		settled(q, 1)
		Expect(cp.Client.Delete(context.Background(), sbx)).To(Succeed())
	})
})
