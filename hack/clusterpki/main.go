/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command clusterpki writes the certificates, keys and kubeconfigs of the
// local single-node cluster (hack/cluster-up.sh), the way kubeadm lays them
// out, with the operator's own certificate code (internal/operatorca; the
// envtest control plane's front proxy is made with it too):
//
//	ca.crt, ca.key                 the cluster CA: kube-apiserver's client CA,
//	                               the issuer of the serving certificates and
//	                               kube-controller-manager's cluster-signing CA
//	apiserver.crt, .key            kube-apiserver's serving certificate
//	apiserver-kubelet-client.*     kube-apiserver's client certificate towards
//	                               the kubelet (exec, logs, port-forward)
//	kubelet.crt, .key              the kubelet's serving certificate (verified
//	                               by kube-apiserver against ca.crt)
//	front-proxy-ca.*, front-proxy-client.*
//	                               the aggregation layer (internal/frontproxy)
//	sa.key, sa.pub                 the ServiceAccount token signing key pair
//	webhook-client/                kube-apiserver's client certificate towards
//	                               admission webhooks and its admission
//	                               configuration (internal/webhookclient)
//	*.kubeconfig                   one per component, and the admin one
//
// Everything is ECDSA P-256. It is idempotent: when the directory already
// holds a complete set (the file "complete" is written last), it does
// nothing, so rerunning cluster-up never invalidates the tokens and
// certificates of a running cluster.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/code-sandbox/code-sandbox-operator/internal/frontproxy"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

const validity = 365 * 24 * time.Hour

func main() {
	fs := flag.NewFlagSet("clusterpki", flag.ExitOnError)
	dir := fs.String("dir", "bin/cluster/pki", "directory for the certificates, keys and component kubeconfigs")
	adminKubeconfig := fs.String("admin-kubeconfig", "bin/cluster/kubeconfig", "where to write the admin kubeconfig")
	nodeName := fs.String("node-name", "", "the node's name")
	nodeIP := fs.String("node-ip", "", "the node's IP address (kube-apiserver's advertise address)")
	serviceIP := fs.String("service-ip", "10.96.0.1", "the ClusterIP of the kubernetes Service")
	port := fs.Int("port", 6443, "kube-apiserver's secure port")
	_ = fs.Parse(os.Args[1:])
	if *nodeName == "" || net.ParseIP(*nodeIP) == nil || net.ParseIP(*serviceIP) == nil {
		fmt.Fprintln(os.Stderr, "clusterpki: --node-name, --node-ip and --service-ip are required")
		os.Exit(2)
	}
	if err := run(*dir, *adminKubeconfig, *nodeName, *nodeIP, *serviceIP, *port); err != nil {
		fmt.Fprintf(os.Stderr, "clusterpki: %v\n", err)
		os.Exit(1)
	}
}

type tlsCert = tls.Certificate

func run(dir, adminKubeconfig, nodeName, nodeIP, serviceIP string, port int) error {
	if err := webhookClient(dir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		if _, err := os.Stat(adminKubeconfig); err == nil {
			return nil
		}
	}
	now := time.Now()
	ca, err := operatorca.NewCA("code-sandbox-cluster-ca", validity, now)
	if err != nil {
		return err
	}
	frontCA, err := operatorca.NewCA("code-sandbox-cluster-front-proxy-ca", validity, now)
	if err != nil {
		return err
	}
	out := map[string][]byte{
		"ca.crt": ca.CertPEM(), "ca.key": ca.KeyPEM(),
		"front-proxy-ca.crt": frontCA.CertPEM(), "front-proxy-ca.key": frontCA.KeyPEM(),
	}
	put := func(name string, certPEM, keyPEM []byte, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		out[name+".crt"], out[name+".key"] = certPEM, keyPEM
		return nil
	}
	enc := func(name string, issue func() (*tlsCert, error)) error {
		c, err := issue()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		certPEM, keyPEM, err := operatorca.EncodeKeyPair(c)
		return put(name, certPEM, keyPEM, err)
	}

	apiserverHosts := []string{
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
		"localhost", nodeName, nodeIP, serviceIP, "127.0.0.1",
	}
	steps := []struct {
		name  string
		issue func() (*tlsCert, error)
	}{
		{"apiserver", func() (*tlsCert, error) { return ca.IssueServing(apiserverHosts, validity) }},
		{"kubelet", func() (*tlsCert, error) { return ca.IssueServing([]string{nodeName, nodeIP, "127.0.0.1"}, validity) }},
		// kubeadm's identity for kube-apiserver towards the kubelet.
		{"apiserver-kubelet-client", func() (*tlsCert, error) {
			return ca.IssueClient("kube-apiserver-kubelet-client", []string{"system:masters"}, validity)
		}},
		{"front-proxy-client", func() (*tlsCert, error) {
			return frontCA.IssueClient(frontproxy.ClientName, nil, validity)
		}},
		{"admin", func() (*tlsCert, error) { return ca.IssueClient("cluster-admin", []string{"system:masters"}, validity) }},
		{"controller-manager", func() (*tlsCert, error) {
			return ca.IssueClient("system:kube-controller-manager", nil, validity)
		}},
		{"scheduler", func() (*tlsCert, error) { return ca.IssueClient("system:kube-scheduler", nil, validity) }},
		// The Node authorizer and NodeRestriction know the kubelet by this
		// name and group.
		{"kubelet-client", func() (*tlsCert, error) {
			return ca.IssueClient("system:node:"+nodeName, []string{"system:nodes"}, validity)
		}},
		{"kube-proxy", func() (*tlsCert, error) { return ca.IssueClient("system:kube-proxy", nil, validity) }},
		// CoreDNS runs as a Deployment with a ServiceAccount; no certificate.
	}
	for _, s := range steps {
		if err := enc(s.name, s.issue); err != nil {
			return err
		}
	}

	if out["sa.key"], out["sa.pub"], err = operatorca.NewSigningKey(); err != nil {
		return err
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range out {
		if err := writeFile(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}

	server := fmt.Sprintf("https://%s", net.JoinHostPort(nodeIP, fmt.Sprint(port)))
	kubeconfigs := map[string]string{
		"controller-manager": filepath.Join(dir, "controller-manager.kubeconfig"),
		"scheduler":          filepath.Join(dir, "scheduler.kubeconfig"),
		"kubelet-client":     filepath.Join(dir, "kubelet.kubeconfig"),
		"kube-proxy":         filepath.Join(dir, "kube-proxy.kubeconfig"),
		"admin":              adminKubeconfig,
	}
	for cert, path := range kubeconfigs {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["code-sandbox-cluster"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca.CertPEM()}
		cfg.AuthInfos[cert] = &clientcmdapi.AuthInfo{ClientCertificateData: out[cert+".crt"], ClientKeyData: out[cert+".key"]}
		cfg.Contexts["code-sandbox-cluster"] = &clientcmdapi.Context{Cluster: "code-sandbox-cluster", AuthInfo: cert}
		cfg.CurrentContext = "code-sandbox-cluster"
		data, err := clientcmd.Write(*cfg)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := writeFile(path, data); err != nil {
			return err
		}
	}
	return writeFile(filepath.Join(dir, "complete"), []byte(now.UTC().Format(time.RFC3339)+"\n"))
}

// webhookClient writes, once, kube-apiserver's client certificate towards
// admission webhooks and its admission configuration (package
// webhookclient) to dir/webhook-client; the webhook's --webhook-client-ca
// is webhook-client/webhook-client-ca.crt. It runs before the "complete"
// check so that a PKI made before it existed gains it.
func webhookClient(dir string) error {
	wdir := filepath.Join(dir, "webhook-client")
	if _, err := os.Stat(filepath.Join(wdir, webhookclient.AdmissionConfig)); err == nil {
		return nil
	}
	if err := os.MkdirAll(wdir, 0o700); err != nil {
		return err
	}
	_, err := webhookclient.Write(wdir, validity)
	return err
}

// writeFile writes through a temporary file, so that a reader never sees a
// half-written key; every file is private to root.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
