package sandboxclient

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
)

// ParsePin decodes a status.agentCertSHA256 value: 64 hex digits, the
// SHA-256 of the node API's leaf certificate (DER).
func ParsePin(s string) ([]byte, error) {
	if len(s) != 2*sha256.Size {
		return nil, fmt.Errorf("certificate pin %q: want %d hex digits, got %d", s, 2*sha256.Size, len(s))
	}
	pin, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("certificate pin %q is not hex: %w", s, err)
	}
	return pin, nil
}

// CertificatePin returns the pin of a DER certificate in the form the
// manager publishes in status.agentCertSHA256.
func CertificatePin(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// verifyPin returns a tls.Config.VerifyConnection callback that accepts
// exactly the leaf certificate whose SHA-256 is pin. The manager's serving
// certificate is typically self-signed and has no name the client could
// check, so the pin published through the API server (which the caller
// already trusts) replaces chain and hostname verification. VerifyConnection
// also runs on resumed sessions, so a resumed connection is checked too.
func verifyPin(pin []byte) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: the server sent no certificate", ErrCertificateMismatch)
		}
		sum := sha256.Sum256(cs.PeerCertificates[0].Raw)
		if subtle.ConstantTimeCompare(sum[:], pin) != 1 {
			return fmt.Errorf("%w: got %s, want %s", ErrCertificateMismatch, hex.EncodeToString(sum[:]), hex.EncodeToString(pin))
		}
		return nil
	}
}

// nodeTLSConfig derives the TLS configuration for one node API from the
// caller's (which carries the client certificate, if any): the API server's
// CA and server name are dropped, and the server is authenticated by pin,
// or by caPool when there is no pin.
func nodeTLSConfig(base *tls.Config, pin []byte, caPool *x509.CertPool) (*tls.Config, error) {
	var cfg *tls.Config
	if base != nil {
		cfg = base.Clone()
	} else {
		cfg = &tls.Config{}
	}
	// Everything in base that concerns the API server's identity is wrong
	// for a node, so none of it may leak into the verification below.
	cfg.ServerName = ""
	cfg.RootCAs = nil
	cfg.VerifyPeerCertificate = nil
	cfg.VerifyConnection = nil
	cfg.InsecureSkipVerify = false
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	switch {
	case len(pin) > 0:
		// Chain verification is skipped only because VerifyConnection
		// checks the exact certificate instead.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = verifyPin(pin)
	case caPool != nil:
		cfg.RootCAs = caPool
	default:
		return nil, ErrNoPin
	}
	return cfg, nil
}

// parseEndpoint checks status.agentEndpoint. Only https is accepted: the
// caller's credentials travel to it.
func parseEndpoint(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalidEndpoint, s, err)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("%w %q: the scheme must be https", ErrInvalidEndpoint, s)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("%w %q: want https://HOST:PORT", ErrInvalidEndpoint, s)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return nil, fmt.Errorf("%w %q: want https://HOST:PORT", ErrInvalidEndpoint, s)
	}
	return &url.URL{Scheme: "https", Host: u.Host}, nil
}

func parseCABundle(pem []byte) (*x509.CertPool, error) {
	if len(pem) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("the CA bundle holds no PEM certificate")
	}
	return pool, nil
}
