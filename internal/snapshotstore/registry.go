package snapshotstore

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// SnapshotLayerType is the media type of a snapshot's one layer: the tar
// as the snapshot wrote it, uncompressed (a registry stores it as a blob; a
// tar of source code compresses, but gzip on two shared cores costs more
// than it saves on a node-local registry).
const SnapshotLayerType = types.OCIUncompressedLayer

// Registry stores each snapshot as a single-layer OCI image in a registry:
// the repository is the configured base and the key (BASE/KEY), and the
// manifest is pushed by digest (no tag), so a ref (BASE/KEY@sha256:…)
// names exactly the bytes stored. Open refuses a ref outside BASE, a
// manifest that is not one uncompressed layer, and a layer larger than
// MaxBytes; the layer is verified against its digest as it is read.
//
// Plain HTTP is used only for a loopback registry (localhost, 127.0.0.0/8,
// ::1); every other host is spoken to over TLS, also where
// go-containerregistry would fall back to HTTP (RFC 1918 addresses, .local
// names): a registry on another address that answers in plain HTTP, or
// whose certificate is not trusted, fails with ErrRegistryTLS naming the
// problem. RegistryOptions.RootCAs trusts a registry's own CA (an
// in-cluster registry). Credentials come from the Docker keychain
// (~/.docker/config.json of the process's user) when present.
//
// Delete removes the manifest (the registry must allow deletes: Docker
// Distribution's storage.delete.enabled); its garbage collection then
// frees the layer.
type Registry struct {
	base     name.Repository // the configured BASE, as a repository name
	prefix   string          // BASE's repository path
	spoolDir string
	maxBytes int64
	options  []remote.Option
}

// RegistryOptions configure NewRegistry.
type RegistryOptions struct {
	// MaxBytes bounds every Put and Open (zero: DefaultMaxBytes).
	MaxBytes int64
	// SpoolDir holds a Put's tar while its digest is computed (a push needs
	// it first); default os.TempDir(). Files there are 0600 and removed
	// after the push.
	SpoolDir string
	// Transport is the base HTTP transport (default remote.DefaultTransport).
	Transport http.RoundTripper
	// Keychain finds credentials (default authn.DefaultKeychain).
	Keychain authn.Keychain
	// RootCAs, when set, are the only CAs trusted for the registry's TLS
	// certificate instead of the system's (a registry with a CA of its own,
	// such as the kind cluster's; the manager's --snapshot-registry-ca).
	// Only with the default Transport.
	RootCAs *x509.CertPool
}

// ErrRegistryTLS: the registry is not on loopback and could not be spoken
// to over verified TLS (it answers in plain HTTP, or its certificate is not
// trusted or not for its host). Plain HTTP is never used instead.
var ErrRegistryTLS = errors.New("snapshot registry: no verified TLS")

// NewRegistry returns a store in the registry repository base
// ("HOST[:PORT]/PATH", e.g. "registry.example:5000/sandbox-snapshots").
func NewRegistry(base string, o RegistryOptions) (*Registry, error) {
	host, path, ok := strings.Cut(base, "/")
	if !ok || host == "" || path == "" || strings.Contains(base, "://") || strings.ContainsAny(path, ":@") {
		return nil, fmt.Errorf("snapshot registry %q: give HOST[:PORT]/PATH, without a scheme, tag or digest", base)
	}
	// Strict: the registry is the one named, never a default.
	repo, err := name.NewRepository(base, name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("snapshot registry %q: %w", base, err)
	}
	if repo.RegistryStr() != host {
		return nil, fmt.Errorf("snapshot registry %q: %q is not a registry host", base, host)
	}
	if o.MaxBytes < 0 {
		return nil, fmt.Errorf("snapshot registry: MaxBytes %d is negative", o.MaxBytes)
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.SpoolDir == "" {
		o.SpoolDir = os.TempDir()
	}
	if o.RootCAs != nil {
		if o.Transport != nil {
			return nil, errors.New("snapshot registry: RootCAs needs the default Transport")
		}
		dt, ok := remote.DefaultTransport.(*http.Transport)
		if !ok {
			return nil, fmt.Errorf("snapshot registry: the default transport is a %T, not an *http.Transport", remote.DefaultTransport)
		}
		t := dt.Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: o.RootCAs, MinVersion: tls.VersionTLS12}
		o.Transport = t
	}
	if o.Transport == nil {
		o.Transport = remote.DefaultTransport
	}
	if o.Keychain == nil {
		o.Keychain = authn.DefaultKeychain
	}
	return &Registry{
		base:     repo,
		prefix:   repo.RepositoryStr(),
		spoolDir: o.SpoolDir,
		maxBytes: o.MaxBytes,
		options: []remote.Option{
			remote.WithTransport(tlsUnlessLoopback{o.Transport}),
			remote.WithAuthFromKeychain(o.Keychain),
		},
	}, nil
}

func (r *Registry) opts(ctx context.Context) []remote.Option {
	return append([]remote.Option{remote.WithContext(ctx)}, r.options...)
}

// Put implements Store.
func (r *Registry) Put(ctx context.Context, key string, src io.Reader) (string, int64, error) {
	return r.PutWith(ctx, key, src, nil)
}

// PutWith is Put, calling beforePush (when not nil) with the ref once it is
// known and before anything is pushed; an error from it stops the Put. A
// Node records the ref there, so that a manifest pushed by a process that
// dies before it records the ref anywhere else can still be found and
// removed: the registry API lists no manifest that has no tag.
func (r *Registry) PutWith(ctx context.Context, key string, src io.Reader, beforePush func(ref string) error) (string, int64, error) {
	if err := checkKey(key); err != nil {
		return "", 0, err
	}
	repo, err := name.NewRepository(r.base.Name()+"/"+key, name.StrictValidation)
	if err != nil {
		return "", 0, fmt.Errorf("%w: key %q: %v", ErrInvalidRef, key, err)
	}
	f, err := os.CreateTemp(r.spoolDir, ".snapshot-*.tar")
	if err != nil {
		return "", 0, fmt.Errorf("snapshot registry: spooling: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), &capReader{r: ctxReader{ctx, src}, max: r.maxBytes})
	if err != nil {
		return "", n, fmt.Errorf("snapshot registry: reading %s: %w", key, err)
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	layer := &fileLayer{path: f.Name(), digest: digest, size: n}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", n, fmt.Errorf("snapshot registry: %w", err)
	}
	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
	mdigest, err := img.Digest()
	if err != nil {
		return "", n, fmt.Errorf("snapshot registry: %w", err)
	}
	ref := repo.Digest(mdigest.String())
	if beforePush != nil {
		if err := beforePush(ref.String()); err != nil {
			return "", n, fmt.Errorf("snapshot registry: before pushing %s: %w", ref, err)
		}
	}
	if err := remote.Write(ref, img, r.opts(ctx)...); err != nil {
		return "", n, fmt.Errorf("snapshot registry: pushing %s: %w", ref, err)
	}
	return ref.String(), n, nil
}

// Open implements Store.
func (r *Registry) Open(ctx context.Context, ref string) (io.ReadCloser, error) {
	d, err := r.digest(ref)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(d, r.opts(ctx)...)
	if err != nil {
		return nil, notFound(ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, notFound(ref, err)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != SnapshotLayerType {
		return nil, fmt.Errorf("%w: %s is not a snapshot (one %s layer)", ErrInvalidRef, ref, SnapshotLayerType)
	}
	if m.Layers[0].Size > r.maxBytes || m.Layers[0].Size < 0 {
		return nil, fmt.Errorf("%w: %s holds %d bytes, more than %d", ErrTooLarge, ref, m.Layers[0].Size, r.maxBytes)
	}
	layer, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("snapshot registry: %s: %w", ref, err)
	}
	// Compressed is the blob as stored; go-containerregistry checks it
	// against its digest (and size) as it is read.
	rc, err := layer.Compressed()
	if err != nil {
		return nil, notFound(ref, err)
	}
	return readCloser{&capReader{r: rc, max: m.Layers[0].Size}, rc}, nil
}

// Delete implements Store.
func (r *Registry) Delete(ctx context.Context, ref string) error {
	d, err := r.digest(ref)
	if err != nil {
		return err
	}
	err = remote.Delete(d, r.opts(ctx)...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshot registry: deleting %s: %w", ref, err)
	}
	return nil
}

// digest parses ref and refuses one outside this store's BASE.
func (r *Registry) digest(ref string) (name.Digest, error) {
	d, err := name.NewDigest(ref, name.StrictValidation)
	if err != nil {
		return name.Digest{}, fmt.Errorf("%w: %q: %v", ErrInvalidRef, ref, err)
	}
	if d.RegistryStr() != r.base.RegistryStr() || !strings.HasPrefix(d.RepositoryStr(), r.prefix+"/") {
		return name.Digest{}, fmt.Errorf("%w: %q is not in the snapshot registry %s", ErrInvalidRef, ref, r.base.Name())
	}
	if err := checkKey(strings.TrimPrefix(d.RepositoryStr(), r.prefix+"/")); err != nil {
		return name.Digest{}, err
	}
	return d, nil
}

func notFound(ref string, err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	return fmt.Errorf("snapshot registry: %s: %w", ref, err)
}

// tlsUnlessLoopback sends every request to a host that is not loopback
// over HTTPS, whatever scheme go-containerregistry chose.
type tlsUnlessLoopback struct{ base http.RoundTripper }

func (t tlsUnlessLoopback) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !isLoopback(req.URL.Hostname()) {
		req = req.Clone(req.Context())
		req.URL.Scheme = "https"
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil && req.URL.Scheme == "https" {
		return nil, tlsProblem(req.URL.Host, isLoopback(req.URL.Hostname()), err)
	}
	return resp, err
}

// tlsProblem names what failed when TLS to host did (go-containerregistry
// reports only the last of its attempts, as "Get …: x509: …").
func tlsProblem(host string, loopback bool, err error) error {
	var (
		record   tls.RecordHeaderError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &record) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		if loopback {
			return err // go-containerregistry falls back to plain HTTP on loopback
		}
		return fmt.Errorf("%w: %s answers in plain HTTP, which is used only for a loopback registry (the snapshots are tenant files): serve the registry over TLS: %w", ErrRegistryTLS, host, err)
	case errors.As(err, &hostname):
		return fmt.Errorf("%w: the certificate of %s is not for that host: %w", ErrRegistryTLS, host, err)
	case errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &verify):
		return fmt.Errorf("%w: the certificate of %s is not trusted (give the registry's CA: the manager's --snapshot-registry-ca): %w", ErrRegistryTLS, host, err)
	}
	return err
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// fileLayer is a spooled snapshot tar as an uncompressed layer: its digest
// and diff ID are the same.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return SnapshotLayerType, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	return os.Open(l.path)
}
