// Package sandboxclient is the Go client of the Sandbox subresources: it
// runs commands in, moves files into and out of, and reads the logs and
// exec history of Sandboxes through the API server
// (/apis/subresources.sandbox.code-sandbox.dev/v1alpha1/...), which
// authenticates the caller with whatever the rest.Config carries (bearer
// token, token file, exec plugin, client certificate, impersonation,
// kubectl proxy), audits the request and proxies it to the operator's
// aggregated API server. The caller's credentials go only to the API
// server, never to a node.
package sandboxclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// Options tune a Client. The zero value is ready to use.
type Options struct {
	// UserAgent replaces the rest.Config's user agent.
	UserAgent string
}

// Client talks to the Sandbox subresources through the API server. It is
// safe for concurrent use; connections are reused.
type Client struct {
	http *http.Client
	// upgrade speaks HTTP/1.1 only, for portforward's upgrade
	// (portforward.go); nil until the first one.
	upgrade *http.Client
	cfg     *rest.Config
	// base is the API server's URL, including any path prefix of the
	// rest.Config (as with kubectl proxy --api-prefix).
	base *url.URL
}

// New returns a Client that calls the Sandbox subresources with cfg.
func New(cfg *rest.Config, opts Options) (*Client, error) {
	if cfg == nil {
		return nil, errors.New("sandboxclient: rest.Config is nil")
	}
	cfg = rest.CopyConfig(cfg)
	if opts.UserAgent != "" {
		cfg.UserAgent = opts.UserAgent
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	// Streams run as long as their commands: no client-wide timeout, each
	// call is bounded by its context.
	cfg.Timeout = 0
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: credentials from the rest.Config: %w", err)
	}
	// client-go's auth round trippers add the credentials to every request,
	// a redirected one too, so following a redirect (which the API server
	// passes on from the aggregated server and the node) would send them to
	// whatever host it names.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: API server address: %w", err)
	}
	return &Client{http: hc, base: base, cfg: cfg}, nil
}

// Ref names the Sandbox a call acts on. Sandbox, when set, is the object
// the caller already read (its namespace and name are used): the client
// then checks from it, with no read and no round trip of its own, that the
// Sandbox is Ready before an exec or a file transfer (CheckReady). Without
// it, whether the Sandbox is Ready is the server's to say (a Conflict with
// the cause subresource.CauseSandboxNotReady).
type Ref struct {
	Namespace, Name string
	Sandbox         *sandboxv1alpha1.Sandbox
}

// Named refers to the Sandbox ns/name.
func Named(ns, name string) Ref { return Ref{Namespace: ns, Name: name} }

// For refers to sbx, which the caller has just read.
func For(sbx *sandboxv1alpha1.Sandbox) Ref { return Ref{Sandbox: sbx} }

func (r Ref) key() (ns, name string) {
	if r.Sandbox != nil {
		return r.Sandbox.Namespace, r.Sandbox.Name
	}
	return r.Namespace, r.Name
}

// validateNames checks names here so that a bad one is reported as such,
// rather than as whatever the API server makes of an odd URL.
func validateNames(ns, name string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return &APIError{Namespace: ns, Name: name, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Source: SourceClient, Message: fmt.Sprintf("invalid namespace %q: %s", ns, strings.Join(errs, "; "))}
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return &APIError{Namespace: ns, Name: name, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Source: SourceClient, Message: fmt.Sprintf("invalid sandbox name %q: %s", name, strings.Join(errs, "; "))}
	}
	return nil
}

// CheckReady says, from a Sandbox already read, whether it can take
// commands and files, deciding as the servers do (subresource.CheckServed
// for an exec): nil, a *NotReadyError (not Ready, paused, or being
// deleted), an unavailable *APIError (Ready, but its node has not published
// its node API yet), or the servers' Conflict as an *APIError (a warm pool
// member, which is never used directly).
func CheckReady(sbx *sandboxv1alpha1.Sandbox) error {
	refusal := subresource.CheckServed(sbx, subresource.SubresourceExec)
	if refusal == nil {
		return nil
	}
	ns, name := sbx.Namespace, sbx.Name
	st := refusal.Status(name)
	ready := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	switch {
	case subresource.HasCause(st, subresource.CauseSandboxTerminating):
		return &NotReadyError{Namespace: ns, Name: name, Reason: sandboxv1alpha1.SandboxReasonTerminating, Message: "the Sandbox is being deleted"}
	case ready == nil && subresource.HasCause(st, subresource.CauseSandboxNotReady):
		return &NotReadyError{Namespace: ns, Name: name}
	case ready != nil && ready.Status != metav1.ConditionTrue &&
		(subresource.HasCause(st, subresource.CauseSandboxNotReady) || subresource.HasCause(st, subresource.CauseSandboxPaused)):
		return &NotReadyError{Namespace: ns, Name: name, Reason: ready.Reason, Message: ready.Message}
	case subresource.HasCause(st, subresource.CauseNodeAPIUnavailable):
		return &APIError{Namespace: ns, Name: name, Code: st.Code, Reason: st.Reason, Source: SourceClient, Details: st.Details,
			Message: fmt.Sprintf("the manager on node %q has not published its node API yet", sbx.Status.NodeName)}
	}
	return &APIError{Namespace: ns, Name: name, Code: st.Code, Reason: st.Reason, Message: st.Message, Details: st.Details, Source: SourceClient}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

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

// needsReady: exec, processes and file transfers act on the container; logs and
// history are served for Sandboxes that are not Ready too.
func (r request) needsReady() bool {
	return subresource.NeedsReady(r.subresource)
}

// do performs req on the Sandbox's subresource through the API server. On
// success the caller owns the response body; any non-2xx answer is returned
// as an *APIError. Whether the Sandbox is Ready is the server's to say (409
// when it is not), or, when ref carries the Sandbox the caller read, the
// client's from it; either way a call costs one round trip.
func (c *Client) do(ctx context.Context, ref Ref, req request) (*http.Response, error) {
	ns, name := ref.key()
	if err := validateNames(ns, name); err != nil {
		return nil, err
	}
	if ref.Sandbox != nil && req.needsReady() {
		if err := CheckReady(ref.Sandbox); err != nil {
			return nil, err
		}
	}
	u := *c.base
	prefix := strings.TrimSuffix(u.Path, "/")
	u.Path = prefix + subresource.AggregatedPathPrefix + ns + "/sandboxes/" + name + "/" + req.subresource
	u.RawPath = ""
	u.RawQuery = ""
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
		hreq.Header.Set("Accept", req.accept+", application/json")
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, transportError(ns, name, c.base.Host, req.subresource, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeErrorResponse(ns, name, resp)
	}
	return resp, nil
}

// transportError explains a request that got no answer. An API server that
// cannot be reached at all is reported as unavailable, so callers can retry
// it like a 503.
func transportError(ns, name, host, sub string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return &APIError{Namespace: ns, Name: name, Code: http.StatusServiceUnavailable,
			Reason: metav1.StatusReasonServiceUnavailable, Source: SourceClient,
			Message: fmt.Sprintf("the API server %s is unreachable: %v", host, op.Err), err: err}
	}
	return fmt.Errorf("sandbox %s/%s: %s: %w", ns, name, sub, unwrapURLError(err))
}

// unwrapURLError drops net/http's "Post \"https://…\":" prefix, which
// repeats the address the message already names.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && !strings.Contains(ue.Err.Error(), ue.URL) {
		return ue.Err
	}
	return err
}
