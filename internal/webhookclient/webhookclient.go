/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package webhookclient makes the admission webhook accept only
// kube-apiserver: the webhook server requires a client certificate signed
// by the CA given with the manager's --webhook-client-ca, and
// kube-apiserver presents one through its admission configuration (an
// AdmissionConfiguration whose WebhookAdmissionConfiguration names a
// kubeconfig file with the client certificate). Without it any pod that
// reaches the webhook's port could POST a forged AdmissionReview and have
// the webhook write quota status.
//
// Write produces kube-apiserver's side of it (internal/testenv and the
// local control plane in hack/devcluster pass it to envtest; this package
// must not import envtest, which is linked into the manager binary and
// creates a directory under /tmp at init); docs/deploy.md explains it for
// real clusters.
package webhookclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// ClientName is the CommonName of the client certificate Configure gives
// kube-apiserver for calling admission webhooks.
const ClientName = "kube-apiserver-webhook-client"

// Files Configure writes into its directory.
const (
	CAFile          = "webhook-client-ca.crt"
	CertFile        = "webhook-client.crt"
	KeyFile         = "webhook-client.key"
	KubeconfigFile  = "webhook-client.kubeconfig"
	AdmissionConfig = "admission-configuration.yaml"
)

// TLSOption makes a webhook server require a client certificate that the
// CAs in caFile (PEM) signed. It is a controller-runtime webhook.Options
// TLSOpts entry. The CAs are read once: rotating them means restarting
// the webhook.
func TLSOption(caFile string) (func(*tls.Config), error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--webhook-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("--webhook-client-ca %s: no PEM certificate in the file", caFile)
	}
	return func(c *tls.Config) {
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}, nil
}

// Write creates a fresh CA and a client certificate for kube-apiserver,
// valid for validity, and writes them to dir with a kubeconfig that
// presents the certificate to every webhook and an AdmissionConfiguration
// that points kube-apiserver's webhook admission plugins at it. It returns
// the AdmissionConfiguration's path, for kube-apiserver's
// --admission-control-config-file; the CA is dir/CAFile.
func Write(dir string, validity time.Duration) (string, error) {
	if dir == "" {
		return "", errors.New("no directory for the webhook client certificate")
	}
	ca, err := operatorca.NewCA("code-sandbox-webhook-client-ca", validity, time.Now())
	if err != nil {
		return "", fmt.Errorf("creating the webhook client CA: %w", err)
	}
	client, err := ca.IssueClient(ClientName, nil, validity)
	if err != nil {
		return "", fmt.Errorf("issuing kube-apiserver's webhook client certificate: %w", err)
	}
	certPEM, keyPEM, err := operatorca.EncodeKeyPair(client)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	// "*" matches every webhook, whatever its address: kube-apiserver
	// presents this certificate to all of them.
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: %s
    client-key: %s
`, filepath.Join(abs, CertFile), filepath.Join(abs, KeyFile))
	admissionConfig := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
`, filepath.Join(abs, KubeconfigFile))
	files := []struct {
		name string
		data []byte
	}{
		{CAFile, ca.CertPEM()}, {CertFile, certPEM}, {KeyFile, keyPEM},
		{KubeconfigFile, []byte(kubeconfig)}, {AdmissionConfig, []byte(admissionConfig)},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(abs, f.name), f.data, 0o600); err != nil {
			return "", fmt.Errorf("writing %s: %w", f.name, err)
		}
	}
	return filepath.Join(abs, AdmissionConfig), nil
}
