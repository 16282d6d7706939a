/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// TLSOptions are the node API's certificates. Both are functions so that a
// rotated serving certificate or CA bundle takes effect without a restart.
type TLSOptions struct {
	// GetCertificate returns the node's serving certificate, issued by the
	// operator CA and naming this node (operatorca.NodeCertificate).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ClientCAs is the operator CA bundle that client certificates must
	// chain to.
	ClientCAs func() *x509.CertPool
}

// ServerTLSConfig requires every peer to present a client certificate
// issued by the operator CA; others fail the handshake.
func ServerTLSConfig(o TLSOptions) (*tls.Config, error) {
	if o.GetCertificate == nil || o.ClientCAs == nil {
		return nil, errors.New("node API: a serving certificate and the operator CA bundle are required")
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: o.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
		// The chain is checked in VerifyPeerCertificate against the
		// current bundle (ClientCAs is fixed at handshake time otherwise).
		ClientAuth:            tls.RequireAnyClientCert,
		VerifyPeerCertificate: VerifyClientChain(o.ClientCAs),
	}, nil
}
