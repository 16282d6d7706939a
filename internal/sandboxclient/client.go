// Package sandboxclient is the Go client of the manager's node API: it finds
// a Sandbox's node through the API server, authenticates that node by the
// certificate pin the manager published in the Sandbox's status, and runs
// commands, moves files and reads logs there with the caller's own
// Kubernetes credentials (bearer token, token file, exec plugin, client
// certificate and impersonation all carry over from the rest.Config), so the
// node API authorises the caller exactly as the API server would.
package sandboxclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi/wire"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// SandboxResource is the resource the client reads Sandboxes from.
var SandboxResource = sandboxv1alpha1.GroupVersion.WithResource("sandboxes")

// Options tune a Client. The zero value is ready to use.
type Options struct {
	// CABundle (PEM) authenticates node APIs of Sandboxes whose status has
	// no agentCertSHA256, by ordinary chain and hostname verification. When
	// it is empty such Sandboxes are refused (ErrNoPin). A pin, when
	// present, always wins.
	CABundle []byte
	// UserAgent replaces the rest.Config's user agent on node API requests.
	UserAgent string
}

// Client talks to the node APIs of Sandboxes. It is safe for concurrent use;
// connections to each node are reused.
type Client struct {
	dyn    dynamic.Interface
	tc     *transport.Config
	tlsCfg *tls.Config
	caPool *x509.CertPool

	mu         sync.Mutex
	transports map[transportKey]*nodeTransport
}

type transportKey struct {
	host string
	pin  string
}

type nodeTransport struct {
	client *http.Client
	base   *http.Transport
}

// maxCachedTransports bounds the per-node transports kept for reuse; a
// manager's certificate changes only on restart, so stale entries are few.
const maxCachedTransports = 64

// New returns a Client that reads Sandboxes with cfg and calls node APIs
// with cfg's credentials. cfg's server CA, server name and Insecure flag
// apply only to the API server: node APIs are verified by pin (or
// Options.CABundle). cfg.Transport, if set, is used for the API server only.
func New(cfg *rest.Config, opts Options) (*Client, error) {
	if cfg == nil {
		return nil, errors.New("sandboxclient: rest.Config is nil")
	}
	caPool, err := parseCABundle(opts.CABundle)
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: Options.CABundle: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: API server client: %w", err)
	}
	// TransportConfig is where exec credential plugins and auth providers
	// hook in (token wrappers, client-certificate callbacks); building it
	// once means one plugin instance and its token cache per Client.
	tc, err := cfg.TransportConfig()
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: credentials from the rest.Config: %w", err)
	}
	if opts.UserAgent != "" {
		tc.UserAgent = opts.UserAgent
	}
	if tc.UserAgent == "" {
		tc.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	// The API server's transport is not ours to reuse: it verifies the API
	// server's certificate.
	tc.Transport = nil
	tlsCfg, err := transport.TLSConfigFor(tc)
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: client TLS settings from the rest.Config: %w", err)
	}
	return &Client{
		dyn:        dyn,
		tc:         tc,
		tlsCfg:     tlsCfg,
		caPool:     caPool,
		transports: map[transportKey]*nodeTransport{},
	}, nil
}

// target is a resolved, Ready Sandbox.
type target struct {
	ns, name string
	endpoint *url.URL
	pin      []byte
}

// Resolve reads the Sandbox through the API server and returns its node API
// endpoint once it is Ready. The error is an *APIError for the API server's
// refusals, a *NotReadyError when the Sandbox is not Ready, and an
// IsUnavailable *APIError when it has no endpoint.
func (c *Client) Resolve(ctx context.Context, ns, name string) (endpoint string, err error) {
	t, err := c.resolve(ctx, ns, name)
	if err != nil {
		return "", err
	}
	return t.endpoint.String(), nil
}

func (c *Client) resolve(ctx context.Context, ns, name string) (*target, error) {
	// Checked here so that a bad name is reported as such, rather than as
	// whatever the API server makes of an odd URL.
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, &APIError{Namespace: ns, Name: name, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Source: sourceClient, Message: fmt.Sprintf("invalid namespace %q: %s", ns, strings.Join(errs, "; "))}
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, &APIError{Namespace: ns, Name: name, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Source: sourceClient, Message: fmt.Sprintf("invalid sandbox name %q: %s", name, strings.Join(errs, "; "))}
	}
	obj, err := c.dyn.Resource(SandboxResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, apiServerError(ns, name, err)
	}
	return targetFrom(obj)
}

// targetFrom reads the Sandbox unstructured, so that it does not depend on
// the Go type having the node API fields.
func targetFrom(obj *unstructured.Unstructured) (*target, error) {
	ns, name := obj.GetNamespace(), obj.GetName()
	if obj.GetDeletionTimestamp() != nil {
		return nil, &NotReadyError{Namespace: ns, Name: name, Reason: sandboxv1alpha1.SandboxReasonTerminating, Message: "the Sandbox is being deleted"}
	}
	rawConds, _, err := unstructured.NestedSlice(obj.Object, "status", "conditions")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s/%s: reading status.conditions: %w", ns, name, err)
	}
	var conds []metav1.Condition
	for _, rc := range rawConds {
		m, ok := rc.(map[string]any)
		if !ok {
			continue
		}
		t, _, _ := unstructured.NestedString(m, "type")
		st, _, _ := unstructured.NestedString(m, "status")
		reason, _, _ := unstructured.NestedString(m, "reason")
		msg, _, _ := unstructured.NestedString(m, "message")
		conds = append(conds, metav1.Condition{Type: t, Status: metav1.ConditionStatus(st), Reason: reason, Message: msg})
	}
	ready := meta.FindStatusCondition(conds, string(sandboxv1alpha1.SandboxConditionReady))
	if ready == nil {
		return nil, &NotReadyError{Namespace: ns, Name: name}
	}
	if ready.Status != metav1.ConditionTrue {
		return nil, &NotReadyError{Namespace: ns, Name: name, Reason: ready.Reason, Message: ready.Message}
	}
	rawEndpoint, _, _ := unstructured.NestedString(obj.Object, "status", "agentEndpoint")
	if rawEndpoint == "" {
		node, _, _ := unstructured.NestedString(obj.Object, "status", "nodeName")
		return nil, &APIError{Namespace: ns, Name: name, Code: http.StatusServiceUnavailable,
			Reason: metav1.StatusReasonServiceUnavailable, Source: sourceClient,
			Message: fmt.Sprintf("status.agentEndpoint is empty: the manager on node %q has not published its node API", node)}
	}
	endpoint, err := parseEndpoint(rawEndpoint)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s/%s: status.agentEndpoint: %w", ns, name, err)
	}
	t := &target{ns: ns, name: name, endpoint: endpoint}
	if rawPin, _, _ := unstructured.NestedString(obj.Object, "status", "agentCertSHA256"); rawPin != "" {
		if t.pin, err = ParsePin(rawPin); err != nil {
			return nil, fmt.Errorf("sandbox %s/%s: status.agentCertSHA256: %w", ns, name, err)
		}
	}
	return t, nil
}

// WaitReady polls the Sandbox until it is Ready with a node API endpoint,
// ctx ends, or it reaches a state it cannot leave (its container exited, was
// OOM-killed or expired; it is being deleted). The error is the last reason
// it was not ready.
func (c *Client) WaitReady(ctx context.Context, ns, name string) error {
	delay := 250 * time.Millisecond
	for {
		_, err := c.resolve(ctx, ns, name)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for sandbox %s/%s: %w", ns, name, ctx.Err())
		}
		var nr *NotReadyError
		switch {
		case errors.As(err, &nr):
			switch nr.Reason {
			case sandboxv1alpha1.SandboxReasonContainerExited, sandboxv1alpha1.SandboxReasonOOMKilled,
				sandboxv1alpha1.SandboxReasonExpired, sandboxv1alpha1.SandboxReasonTerminating:
				return err
			}
		case IsUnavailable(err), IsTooManyRequests(err):
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for sandbox %s/%s: %w (last: %w)", ns, name, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// transportFor returns the HTTP client for one node API, authenticating the
// server by pin (or CA bundle) and the caller by cfg's credentials.
func (c *Client) transportFor(t *target) (*http.Client, error) {
	key := transportKey{host: t.endpoint.Host, pin: string(t.pin)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if nt, ok := c.transports[key]; ok {
		return nt.client, nil
	}
	tlsCfg, err := nodeTLSConfig(c.tlsCfg, t.pin, c.caPool)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s/%s: node API %s: %w", t.ns, t.name, t.endpoint, err)
	}
	proxy := c.tc.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	dial := dialer.DialContext
	if c.tc.DialHolder != nil && c.tc.DialHolder.Dial != nil {
		dial = c.tc.DialHolder.Dial
	}
	base := &http.Transport{
		Proxy:               proxy,
		DialContext:         dial,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  c.tc.DisableCompression,
	}
	rt, err := transport.HTTPWrappersForConfig(c.tc, base)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s/%s: credentials for the node API: %w", t.ns, t.name, err)
	}
	if len(c.transports) >= maxCachedTransports {
		for k, nt := range c.transports {
			nt.base.CloseIdleConnections()
			delete(c.transports, k)
		}
	}
	hc := &http.Client{
		Transport: rt,
		// A redirect would carry the caller's credentials to a server the
		// pin does not cover.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	c.transports[key] = &nodeTransport{client: hc, base: base}
	return hc, nil
}

// Close releases idle connections to node APIs.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, nt := range c.transports {
		nt.base.CloseIdleConnections()
		delete(c.transports, k)
	}
}

// request describes one node API call.
type request struct {
	method      string
	subresource string
	query       url.Values
	body        io.Reader
	length      int64 // of body: -1 unknown, 0 let net/http decide
	contentType string
	accept      string
}

// do resolves the Sandbox and performs req. On success the caller owns the
// response body; any non-2xx answer is returned as an *APIError.
func (c *Client) do(ctx context.Context, ns, name string, req request) (*http.Response, error) {
	t, err := c.resolve(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	hc, err := c.transportFor(t)
	if err != nil {
		return nil, err
	}
	u := *t.endpoint
	u.Path = wire.PathPrefix + ns + "/sandboxes/" + name + "/" + req.subresource
	u.RawPath = wire.PathPrefix + url.PathEscape(ns) + "/sandboxes/" + url.PathEscape(name) + "/" + req.subresource
	if len(req.query) > 0 {
		u.RawQuery = req.query.Encode()
	}
	hreq, err := http.NewRequestWithContext(ctx, req.method, u.String(), req.body)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s/%s: building the %s request: %w", ns, name, req.subresource, err)
	}
	if req.length != 0 {
		// net/http only detects the length of a few in-memory types.
		hreq.ContentLength = req.length
	}
	if req.contentType != "" {
		hreq.Header.Set("Content-Type", req.contentType)
	}
	if req.accept != "" {
		hreq.Header.Set("Accept", req.accept)
	}
	resp, err := hc.Do(hreq)
	if err != nil {
		return nil, transportError(t, req.subresource, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeErrorResponse(ns, name, resp)
	}
	return resp, nil
}

// transportError explains a request that got no answer. A node that cannot
// be reached at all is reported as unavailable, so callers can retry it like
// a 503.
func transportError(t *target, sub string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return &APIError{Namespace: t.ns, Name: t.name, Code: http.StatusServiceUnavailable,
			Reason: metav1.StatusReasonServiceUnavailable, Source: sourceClient,
			Message: fmt.Sprintf("node API %s is unreachable: %v", t.endpoint, op.Err), err: err}
	}
	return fmt.Errorf("sandbox %s/%s: %s via node API %s: %w", t.ns, t.name, sub, t.endpoint, unwrapURLError(err))
}

// unwrapURLError drops net/http's "Post \"https://…\":" prefix, which
// repeats the endpoint the message already names.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && !strings.Contains(ue.Err.Error(), ue.URL) {
		return ue.Err
	}
	return err
}
