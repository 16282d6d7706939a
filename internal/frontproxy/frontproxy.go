/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package frontproxy configures envtest's kube-apiserver as kubeadm
// configures a cluster's, with the aggregation layer's front proxy: a
// front-proxy CA, the client certificate kube-apiserver presents to
// aggregated API servers, and the request-header flags it publishes in
// kube-system/extension-apiserver-authentication. The local control plane
// (hack/devcluster) and the integration suites (internal/testenv) use it.
package frontproxy

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// ClientName is the CommonName of kube-apiserver's front-proxy client
// certificate, the one name aggregated API servers accept.
const ClientName = "front-proxy-client"

// Configure writes a fresh front-proxy CA and client certificate, valid
// for validity, to dir and sets env's kube-apiserver flags to use them. Call
// it before env.Start.
func Configure(env *envtest.Environment, dir string, validity time.Duration) error {
	ca, err := operatorca.NewCA("code-sandbox-front-proxy-ca", validity, time.Now())
	if err != nil {
		return fmt.Errorf("creating the front-proxy CA: %w", err)
	}
	client, err := ca.IssueClient(ClientName, nil, validity)
	if err != nil {
		return fmt.Errorf("issuing the front-proxy client certificate: %w", err)
	}
	certPEM, keyPEM, err := operatorca.EncodeKeyPair(client)
	if err != nil {
		return err
	}
	files := map[string][]byte{"front-proxy-ca.crt": ca.CertPEM(), "front-proxy-client.crt": certPEM, "front-proxy-client.key": keyPEM}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", filepath.Join(dir, "front-proxy-ca.crt"))
	args.Set("requestheader-allowed-names", ClientName)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-uid-headers", "X-Remote-Uid")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", filepath.Join(dir, "front-proxy-client.crt"))
	args.Set("proxy-client-key-file", filepath.Join(dir, "front-proxy-client.key"))
	return nil
}
