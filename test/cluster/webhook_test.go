//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

// The admission webhook as `make kind-deploy` deploys it: with
// config/components/webhook-client-auth, requiring the client certificate
// that this cluster's kube-apiserver presents (hack/kindwebhookclient,
// --admission-control-config-file).
func webhookSpecs() {
	Describe("the admission webhook's callers", func() {
		It("takes AdmissionReviews only from kube-apiserver's client certificate", func(ctx SpecContext) {
			args := mustKubectl(ctx, "get", "deployment", prefix+"webhook", "-n", operatorNS,
				"-o", "jsonpath={.spec.template.spec.containers[0].args}")
			Expect(args).To(ContainSubstring("--webhook-client-ca="),
				"the webhook runs without --webhook-client-ca: deploy with `make kind-deploy` (WEBHOOK_CLIENT_CA, docs/deploy.md)")

			// A TLS 1.3 server checks the client's certificate after the
			// client's side of the handshake is done: its verdict is the
			// alert read next (a request written first may meet a closed
			// connection instead). A server that accepted the certificate
			// waits for the request: the read times out.
			addr := prefix + "webhook-service." + operatorNS + ".svc:443"
			dial := serviceHTTPClient(ctx).Transport.(*http.Transport).DialContext
			handshake := func(ctx context.Context, cert *tls.Certificate) error {
				raw, err := dial(ctx, "tcp", addr)
				if err != nil {
					return err
				}
				// The server's certificate is not what is tested here.
				config := &tls.Config{InsecureSkipVerify: true} //nolint:gosec
				if cert != nil {
					// Sent whatever CAs the server names as acceptable
					// (Certificates would send nothing for a stranger's).
					config.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
				}
				conn := tls.Client(raw, config)
				defer func() { _ = conn.Close() }()
				if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
					return err
				}
				if err := conn.HandshakeContext(ctx); err != nil {
					return err
				}
				_, err = conn.Read(make([]byte, 1))
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					return nil
				}
				return fmt.Errorf("after the handshake: %w", err)
			}

			By("a caller without a client certificate")
			Expect(handshake(ctx, nil)).To(MatchError(ContainSubstring("certificate required")))

			By("a caller with a certificate from another CA")
			stranger, err := operatorca.SelfSigned(webhookclient.ClientName, nil, x509.ExtKeyUsageClientAuth, time.Hour)
			Expect(err).NotTo(HaveOccurred())
			Expect(handshake(ctx, stranger)).To(MatchError(ContainSubstring("unknown certificate authority")))

			By("kube-apiserver's own client certificate completes the handshake")
			// Beside its CA, which make test-kind passes.
			ca := os.Getenv("WEBHOOK_CLIENT_CA")
			Expect(ca).NotTo(BeEmpty(), "WEBHOOK_CLIENT_CA names the CA of kube-apiserver's webhook client certificate (make test-kind sets it)")
			dir := filepath.Dir(ca)
			own, err := tls.LoadX509KeyPair(filepath.Join(dir, "webhook-client.crt"), filepath.Join(dir, "webhook-client.key"))
			Expect(err).NotTo(HaveOccurred())
			Expect(handshake(ctx, &own)).To(Succeed())
		}, NodeTimeout(2*time.Minute))
	})
}
