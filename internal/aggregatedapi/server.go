/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package aggregatedapi is the operator's aggregated API server: the one
// way into a sandbox. kube-apiserver authenticates the caller (tokens,
// client certificates, OIDC exec plugins, kubectl proxy: whatever the
// cluster accepts), checks RBAC on subresources.sandbox.code-sandbox.dev,
// audits the request, and proxies it here with the caller's identity in
// front-proxy headers (the APIService). This server authenticates that proxy
// with k8s.io/apiserver's delegating authenticator, authorises the caller
// with a SubjectAccessReview on the same subresource of
// sandbox.code-sandbox.dev (so the shipped roles keep their meaning), and
// forwards the request to the node API of the Sandbox's node over mutual TLS
// with the operator CA. No caller credential ever leaves the API server: a
// node sees only the operator's client certificate and the caller's name.
//
// It follows KubeVirt's virt-api and metrics-server, but serves plain HTTP
// handlers rather than a generic API server: its resources are streaming
// subresources with no storage.
package aggregatedapi

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// Config configures a Server.
type Config struct {
	// Sandboxes reads Sandboxes, normally from an informer cache;
	// APIReader is asked when the cache does not know one yet.
	Sandboxes client.Reader
	APIReader client.Reader
	// Nodes reads Node objects (normally the API reader: one GET per
	// node address and nodeAddressTTL, no cache of every Node). status.nodeAPIEndpoint
	// is dialled only if its host is one of the addresses of the Node
	// named by status.nodeName.
	Nodes client.Reader
	// Authenticator authenticates kube-apiserver's front-proxy requests
	// (and, for direct callers, tokens and client certificates); see
	// NewDelegatingAuth.
	Authenticator authenticator.Request
	// Authorizer answers SubjectAccessReviews.
	Authorizer authorizer.Authorizer
	// ClientCertificate is the operator CA's client certificate for
	// AggregatorCommonName, presented to node APIs.
	ClientCertificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// NodeCAs is the operator CA bundle that node serving certificates must
	// chain to.
	NodeCAs func() *x509.CertPool
	// Logger defaults to logf.Log.WithName("aggregatedapi").
	Logger logr.Logger
}

// Server is the aggregated API's HTTP handler.
type Server struct {
	cfg Config
	log logr.Logger

	mu         sync.Mutex
	transports map[nodeKey]*http.Transport
	// confirmed is when each (node, host) pair was last found among the
	// Node's addresses, so that a forwarded request reads the Node at most
	// once per nodeAddressTTL rather than once per call (an API round trip
	// on every exec). now is time.Now unless a test sets it.
	confirmed map[nodeKey]time.Time
	now       func() time.Time
}

// nodeAddressTTL bounds how long a confirmed node address is trusted
// without reading the Node again. A Node's addresses are the kubelet's and
// change rarely; a stale answer can only send a request to an address the
// Node had within the TTL, and the dial still accepts only a certificate
// of the operator CA naming that node.
const nodeAddressTTL = 5 * time.Second

// nodeKey names one node API: a transport only ever talks to the endpoint
// it was made for and accepts only the certificate of the node it names.
type nodeKey struct{ node, host string }

// maxTransports bounds the kept connections pools; nodes change rarely.
const maxTransports = 256

// New validates cfg.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Sandboxes == nil:
		return nil, errors.New("aggregated API: a Sandbox reader is required")
	case cfg.Nodes == nil:
		return nil, errors.New("aggregated API: a Node reader is required")
	case cfg.Authenticator == nil || cfg.Authorizer == nil:
		return nil, errors.New("aggregated API: an authenticator and an authorizer are required")
	case cfg.ClientCertificate == nil || cfg.NodeCAs == nil:
		return nil, errors.New("aggregated API: the operator CA's client certificate and bundle are required")
	}
	log := cfg.Logger
	if log.GetSink() == nil {
		log = logf.Log.WithName("aggregatedapi")
	}
	return &Server{cfg: cfg, log: log, transports: map[nodeKey]*http.Transport{}}, nil
}

// ServeHTTP answers discovery, health and the Sandbox subresources.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	switch strings.TrimSuffix(r.URL.Path, "/") {
	case "/healthz", "/livez", "/readyz":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok"))
		return
	case "/apis":
		writeJSON(w, apiGroupList())
		return
	case "/apis/" + subresource.AggregatedGroup:
		writeJSON(w, apiGroup())
		return
	case "/apis/" + subresource.AggregatedGroup + "/" + subresource.AggregatedVersion:
		writeJSON(w, apiResourceList())
		return
	}
	rt, routeErr := subresource.ParseRoute(subresource.AggregatedPathPrefix, r)
	if routeErr != nil {
		subresource.WriteError(w, routeErr)
		return
	}
	resp, ok, err := s.cfg.Authenticator.AuthenticateRequest(r)
	if err != nil || !ok {
		if err != nil {
			s.log.V(1).Info("authentication failed", "path", r.URL.Path, "remote", r.RemoteAddr, "error", err.Error())
		}
		subresource.WriteError(w, subresource.NewError(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized"))
		return
	}
	u := resp.User
	ctx := logf.IntoContext(r.Context(), s.log.WithValues("namespace", rt.Namespace, "sandbox", rt.Name,
		"subresource", rt.Subresource, "user", u.GetName()))
	// Every answer from here on is about the Sandbox rt.Name.
	w = subresource.NameSandbox(w, rt.Name)
	if err := s.authorize(ctx, u, rt); err != nil {
		subresource.WriteError(w, err)
		return
	}
	sbx, err := s.sandbox(ctx, rt)
	if err != nil {
		subresource.WriteError(w, err)
		return
	}
	s.forward(w, r.WithContext(ctx), u, rt, sbx)
}

// authorize asks whether u may do rt on the Sandbox in
// sandbox.code-sandbox.dev: kube-apiserver already checked the same verb on
// this aggregated group, and the shipped roles grant both together.
func (s *Server) authorize(ctx context.Context, u user.Info, rt subresource.Route) error {
	attrs := authorizer.AttributesRecord{
		User:            u,
		Verb:            rt.Verb,
		Namespace:       rt.Namespace,
		APIGroup:        sandboxv1alpha1.GroupVersion.Group,
		APIVersion:      sandboxv1alpha1.GroupVersion.Version,
		Resource:        "sandboxes",
		Subresource:     rt.RBACSubresource,
		Name:            rt.Name,
		ResourceRequest: true,
	}
	decision, reason, err := s.cfg.Authorizer.Authorize(ctx, attrs)
	if decision == authorizer.DecisionAllow {
		return nil
	}
	if err != nil {
		logf.FromContext(ctx).Error(err, "authorisation check failed")
	}
	msg := fmt.Sprintf("sandboxes %q is forbidden: User %q cannot %s resource \"sandboxes/%s\" in API group %q in the namespace %q",
		rt.Name, u.GetName(), rt.Verb, rt.RBACSubresource, sandboxv1alpha1.GroupVersion.Group, rt.Namespace)
	if reason != "" {
		msg += ": " + reason
	}
	return subresource.NewError(http.StatusForbidden, metav1.StatusReasonForbidden, "%s", msg)
}

// sandbox reads the Sandbox and checks that the aggregated API serves it
// (subresource.CheckServed): a node serves it and has published its node
// API and, for exec and files, it is Ready (the node checks again against
// the container); logs and history are served for Sandboxes that are not.
func (s *Server) sandbox(ctx context.Context, rt subresource.Route) (*sandboxv1alpha1.Sandbox, error) {
	key := types.NamespacedName{Namespace: rt.Namespace, Name: rt.Name}
	sbx, err := subresource.GetSandbox(ctx, getter(s.cfg.Sandboxes), getter(s.cfg.APIReader), key)
	if err != nil {
		return nil, err
	}
	// Refuse a Sandbox for not being Ready only on the API server's word.
	if sbx.Status.NodeName != "" && subresource.NeedsReady(rt.Subresource) {
		sbx = subresource.FreshIfNotReady(ctx, getter(s.cfg.APIReader), sbx)
	}
	if err := subresource.CheckServed(sbx, rt.Subresource); err != nil {
		return nil, err
	}
	return sbx, nil
}

// getter reads Sandboxes with r, or is nil when r is.
func getter(r client.Reader) subresource.GetFunc {
	if r == nil {
		return nil
	}
	return func(ctx context.Context, key types.NamespacedName, sbx *sandboxv1alpha1.Sandbox) error {
		return r.Get(ctx, key, sbx)
	}
}

// forward proxies the request to the node API of the Sandbox's node.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, u user.Info, rt subresource.Route, sbx *sandboxv1alpha1.Sandbox) {
	node := sbx.Status.NodeName
	// One error for every way the endpoint is unusable or unreachable:
	// the status is written by a node's manager, and what this server
	// found when it tried (which address, refused or timed out, which
	// certificate) would make it a probe of the cluster network for
	// whoever compromised one. The details go to this server's log.
	unavailable := func() {
		subresource.WriteError(w, subresource.NewError(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"sandbox %s/%s: the node API of node %s is unavailable", sbx.Namespace, sbx.Name, node).Because(subresource.CauseNodeAPIUnavailable, ""))
	}
	endpoint, err := parseEndpoint(sbx.Status.NodeAPIEndpoint)
	if err == nil {
		err = s.nodeAddress(r.Context(), node, endpoint.Hostname())
	}
	if err != nil {
		logf.FromContext(r.Context()).Info("refusing a node API endpoint", "sandbox", sbx.Namespace+"/"+sbx.Name, "node", node, "error", err.Error())
		unavailable()
		return
	}
	transport := s.transport(node, endpoint.Host)
	if isUpgrade(r) {
		transport = s.upgradeTransport(node, endpoint.Host)
	}
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		// Exec output and followed logs stream: pass every write on.
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL = &url.URL{
				Scheme:   "https",
				Host:     endpoint.Host,
				Path:     subresource.PathPrefix + rt.Namespace + "/sandboxes/" + rt.Name + "/" + rt.Subresource,
				RawQuery: pr.In.URL.RawQuery,
			}
			out.Host = ""
			// Nothing the caller sent about identity travels on: the
			// node learns only who this server authenticated.
			for k := range out.Header {
				lk := strings.ToLower(k)
				if lk == "authorization" || strings.HasPrefix(lk, "impersonate-") || strings.HasPrefix(lk, "x-remote-") {
					out.Header.Del(k)
				}
			}
			out.Header.Set(subresource.HeaderRemoteUser, u.GetName())
			if uid := u.GetUID(); uid != "" {
				out.Header.Set(subresource.HeaderRemoteUID, uid)
			}
			for _, g := range u.GetGroups() {
				out.Header.Add(subresource.HeaderRemoteGroup, g)
			}
			for k, vs := range u.GetExtra() {
				for _, v := range vs {
					out.Header.Add(subresource.HeaderRemoteExtraPrefix+url.PathEscape(k), v)
				}
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return // the caller went away
			}
			logf.FromContext(r.Context()).Info("node API unreachable", "node", node, "endpoint", endpoint.Host, "error", err.Error())
			unavailable()
		},
	}
	proxy.ServeHTTP(w, r)
}

// transport returns the connection pool for one node API. It presents the
// operator client certificate and accepts only a server certificate that
// chains to the operator CA and names node; the address alone proves
// nothing, so a forged endpoint gets no request and no credential.
func (s *Server) transport(node, host string) *http.Transport {
	key := nodeKey{node: node, host: host}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.transports[key]; ok {
		return t
	}
	if len(s.transports) >= maxTransports {
		for k, t := range s.transports {
			t.CloseIdleConnections()
			delete(s.transports, k)
		}
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext: dialer.DialContext,
		TLSClientConfig: &tls.Config{
			MinVersion:           tls.VersionTLS12,
			GetClientCertificate: s.cfg.ClientCertificate,
			// The chain and the node name are checked by VerifyNode
			// against the current bundle; the host name of the address
			// is not what identifies a node.
			InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
			VerifyConnection:   operatorca.VerifyNode(s.cfg.NodeCAs, node),
		},
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	s.transports[key] = t
	return t
}

// Close drops idle node connections.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range s.transports {
		t.CloseIdleConnections()
		delete(s.transports, k)
	}
}

// nodeAddress checks that host (status.nodeAPIEndpoint's) is one of the
// addresses of Node node: its InternalIP, ExternalIP or Hostname, which
// the kubelet (or the cloud controller) writes, not the node's manager. A
// compromised manager can then only point the aggregated API server at its
// own node, never make it dial an address of its choosing.
func (s *Server) nodeAddress(ctx context.Context, node, host string) error {
	key := nodeKey{node: node, host: host}
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	s.mu.Lock()
	at, ok := s.confirmed[key]
	s.mu.Unlock()
	if ok && now().Sub(at) < nodeAddressTTL {
		return nil
	}
	if err := s.readNodeAddress(ctx, node, host); err != nil {
		s.mu.Lock()
		delete(s.confirmed, key)
		s.mu.Unlock()
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.confirmed == nil || len(s.confirmed) >= maxTransports {
		s.confirmed = map[nodeKey]time.Time{}
	}
	s.confirmed[key] = now()
	return nil
}

// readNodeAddress is nodeAddress's check on the Node as read now.
func (s *Server) readNodeAddress(ctx context.Context, node, host string) error {
	var n corev1.Node
	if err := s.cfg.Nodes.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return fmt.Errorf("reading Node %s: %w", node, err)
	}
	ip := net.ParseIP(host)
	for _, a := range n.Status.Addresses {
		switch a.Type {
		case corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName:
		default:
			continue
		}
		if ip != nil && ip.Equal(net.ParseIP(a.Address)) || ip == nil && strings.EqualFold(host, a.Address) {
			return nil
		}
	}
	return fmt.Errorf("%s is not an address of Node %s", host, node)
}

// parseEndpoint checks status.nodeAPIEndpoint: https://HOST:PORT.
func parseEndpoint(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("%q is not https://HOST:PORT", s)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return nil, fmt.Errorf("%q is not https://HOST:PORT", s)
	}
	return &url.URL{Scheme: "https", Host: u.Host}, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func apiGroupList() *metav1.APIGroupList {
	return &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{*apiGroup()}}
}

func apiGroup() *metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: subresource.AggregatedGroup + "/" + subresource.AggregatedVersion, Version: subresource.AggregatedVersion}
	return &metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
		Name: subresource.AggregatedGroup, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

// apiResourceList lists the subresources, as the core group lists
// pods/exec: for discovery and `kubectl api-resources`, not for storage.
func apiResourceList() *metav1.APIResourceList {
	sub := func(name string, verbs ...string) metav1.APIResource {
		return metav1.APIResource{Name: "sandboxes/" + name, Namespaced: true, Kind: "Sandbox", Verbs: verbs}
	}
	return &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: subresource.AggregatedGroup + "/" + subresource.AggregatedVersion,
		APIResources: []metav1.APIResource{
			sub(subresource.SubresourceExec, "create"),
			sub(subresource.SubresourceProcesses, "create"),
			sub(subresource.SubresourceFiles, "create", "get"),
			sub(subresource.SubresourceLog, "get"),
			sub(subresource.SubresourceHistory, "get"),
			sub(subresource.SubresourceMetrics, "get"),
		},
	}
}
