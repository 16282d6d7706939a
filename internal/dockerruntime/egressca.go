/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path"
	"time"

	"github.com/docker/docker/api/types/network"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// Where the egress proxy's CA goes in a sandbox with an egress policy
// (internal/egressproxy terminates TLS for hosts with injected
// credentials). The root filesystem is read-only and the image is never
// changed, so the files go to the /tmp tmpfs through the helper, and the
// usual variables point the common TLS stacks at them.
const (
	EgressCADir = "/tmp/.code-sandbox-egress"
	// EgressCABundle is the image's own roots followed by the proxy's CA,
	// for variables that replace the trust store.
	EgressCABundle = EgressCADir + "/ca-bundle.pem"
	// EgressCAFile is the proxy's CA alone, for variables that add to it.
	EgressCAFile = EgressCADir + "/egress-proxy-ca.pem"
)

// systemBundles are the images' trust stores, first found wins (Debian and
// Ubuntu, Alpine, RHEL and Fedora, openSUSE).
var systemBundles = []execio.Target{
	{Root: "/etc/ssl/certs", Rel: "ca-certificates.crt"},
	{Root: "/etc/pki/tls/certs", Rel: "ca-bundle.crt"},
	{Root: "/etc/ssl", Rel: "cert.pem"},
	{Root: "/etc/ssl", Rel: "ca-bundle.pem"},
}

// maxBundleBytes bounds the image's trust store read back.
const maxBundleBytes = 4 << 20

// EgressCAEnv is the environment of a sandbox with an egress policy: the
// variables OpenSSL, Go, Python requests, curl, git, pip, the AWS SDKs
// (bundle: replaces) and Node.js (extra: adds) read. Set it in Spec.Env at
// creation, then call InstallEgressCA before the sandbox runs anything.
// Programs with their own store (Java's cacerts, a pinned client) do not
// trust the proxy: only requests to hosts with injected credentials are
// affected (other hosts pass through untouched).
func EgressCAEnv() []string {
	return []string{
		"SSL_CERT_FILE=" + EgressCABundle,
		"REQUESTS_CA_BUNDLE=" + EgressCABundle,
		"CURL_CA_BUNDLE=" + EgressCABundle,
		"GIT_SSL_CAINFO=" + EgressCABundle,
		"PIP_CERT=" + EgressCABundle,
		"AWS_CA_BUNDLE=" + EgressCABundle,
		"NODE_EXTRA_CA_CERTS=" + EgressCAFile,
	}
}

// InstallEgressCA writes the egress proxy's CA (PEM) into the sandbox,
// alone and appended to the image's trust store, through the helper. The
// files are not a security boundary: a sandbox that replaces them only
// stops trusting the proxy; it gains nothing (credentials are added
// outside it whatever it trusts).
func (c *Client) InstallEgressCA(ctx context.Context, id string, caPEM []byte) error {
	if !bytes.Contains(caPEM, []byte("-----BEGIN CERTIFICATE-----")) {
		return errors.New("installing the egress proxy CA: not a PEM certificate")
	}
	roots, err := c.imageRoots(ctx, id)
	if err != nil {
		return err
	}
	bundle := append(append(roots, '\n'), caPEM...)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	dir := path.Base(EgressCADir)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: now}); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{path.Base(EgressCABundle), bundle}, {path.Base(EgressCAFile), caPEM}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + "/" + f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: now}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if _, err := c.CopyIn(ctx, id, execio.Target{Root: path.Dir(EgressCADir)}, &buf, execio.UploadLimits{MaxBytes: maxBundleBytes * 2}); err != nil {
		return fmt.Errorf("installing the egress proxy CA: %w", err)
	}
	return nil
}

// imageRoots reads the image's trust store (empty when it has none).
func (c *Client) imageRoots(ctx context.Context, id string) ([]byte, error) {
	for _, t := range systemBundles {
		var buf bytes.Buffer
		if _, err := c.CopyOut(ctx, id, t, &buf, maxBundleBytes); err != nil {
			continue
		}
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if h.Typeflag == tar.TypeReg {
				data, err := io.ReadAll(io.LimitReader(tr, maxBundleBytes))
				if err != nil {
					return nil, err
				}
				return data, nil
			}
		}
	}
	return nil, nil
}

// EgressNetworkAddrs returns the egress network's gateway (the egress
// proxy listens there) and subnet, as Docker assigned them.
func (c *Client) EgressNetworkAddrs(ctx context.Context) (gateway netip.Addr, subnet netip.Prefix, err error) {
	c.negotiate(ctx)
	nctx, cancel := c.bounded(ctx)
	defer cancel()
	n, err := c.docker.NetworkInspect(nctx, egress.NetworkName, network.InspectOptions{})
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, classify(err, "inspecting the egress network")
	}
	for _, cfg := range n.IPAM.Config {
		gw, gerr := netip.ParseAddr(cfg.Gateway)
		sn, serr := netip.ParsePrefix(cfg.Subnet)
		if gerr == nil && serr == nil && gw.Is4() && sn.Contains(gw) {
			return gw, sn.Masked(), nil
		}
	}
	return netip.Addr{}, netip.Prefix{}, fmt.Errorf("the egress network %s has no IPv4 subnet with a gateway: %+v", egress.NetworkName, n.IPAM.Config)
}
