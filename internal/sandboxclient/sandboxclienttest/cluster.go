// Package sandboxclienttest fakes what a sandboxclient talks to: the API
// server. One TLS server answers GET on Sandboxes (for Resolve and
// WaitReady) and the Sandbox subresources of the operator's aggregated API
// (/apis/subresources.sandbox.code-sandbox.dev/v1alpha1/namespaces/{ns}/
// sandboxes/{name}/{exec,files,log,history}), authenticating callers as
// kube-apiserver does (bearer tokens, client certificates) and recording
// every request. A second listener stands for the node API that the
// Sandboxes' status.nodeAPIEndpoint names: clients must never reach it. It
// lets tests of the client and of its users (the kubectl plugin, the MCP
// server) run without a control plane or Docker.
package sandboxclienttest

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// Handler answers a subresource request that passed authentication and
// the Sandbox checks; body is the request body, already read.
type Handler func(w http.ResponseWriter, r *http.Request, body []byte)

// Request is one request the fake API server received, as it arrived.
type Request struct {
	Method string
	// Path is the URL path as received, including any path prefix.
	Path     string
	RawQuery string
	Query    url.Values
	Header   http.Header
	Body     []byte
	// RemoteAddr tells connections apart.
	RemoteAddr string
	// User is who the request authenticated as ("" if it did not).
	User string
	// ClientCertCN is the CN of the verified client certificate, if any.
	ClientCertCN string
	// Subresource is exec, files, log or history for a subresource call,
	// "" for anything else (a GET of a Sandbox).
	Namespace, Name, Subresource string
}

// Cluster is a fake API server serving Sandboxes and their subresources.
type Cluster struct {
	// API is the API server (TLS and HTTP/2; clientcmd sends no
	// credentials to a plain-HTTP server). It accepts client certificates
	// signed by its client CA (see ClientCertificate) and bearer tokens
	// admitted with AllowToken.
	API *httptest.Server
	// Decoy is a TLS server that every Sandbox's status.nodeAPIEndpoint
	// names, as a node API would be. A client of the API server must never
	// reach it: DecoyConnections counts the connections it accepted.
	Decoy *httptest.Server
	// DecoyPin is the SHA-256 of Decoy's certificate, as the removed
	// status.agentCertSHA256 carried it.
	DecoyPin string

	clientCA *operatorca.CA

	mu            sync.Mutex
	sandboxes     map[string]map[string]any
	tokens        map[string]string
	handler       Handler
	prefix        string
	requests      []Request
	decoyConns    int
	decoyRequests []Request
}

// New starts the API server and the decoy; Close stops them.
func New() *Cluster {
	c := &Cluster{sandboxes: map[string]map[string]any{}, tokens: map[string]string{}}
	clientCA, err := operatorca.NewCA("fake-apiserver-client-ca", 24*time.Hour, time.Now())
	if err != nil {
		panic(err)
	}
	c.clientCA = clientCA
	pool := clientCA.Pool()

	c.API = httptest.NewUnstartedServer(http.HandlerFunc(c.serveAPI))
	c.API.EnableHTTP2 = true
	// StartTLS keeps these settings and adds its own certificate.
	c.API.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}
	c.API.StartTLS()

	c.Decoy = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.decoyRequests = append(c.decoyRequests, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
			Query: r.URL.Query(), Header: r.Header.Clone(), Body: body, RemoteAddr: r.RemoteAddr})
		c.mu.Unlock()
		writeStatus(w, http.StatusTeapot, metav1.StatusReasonUnknown, "this is a decoy node API: no client may reach it")
	}))
	c.Decoy.EnableHTTP2 = true
	c.Decoy.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	// Counted on accept, before any TLS handshake: even a connection that
	// sends nothing is a failure.
	c.Decoy.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			c.mu.Lock()
			c.decoyConns++
			c.mu.Unlock()
		}
	}
	c.Decoy.StartTLS()
	sum := sha256.Sum256(c.Decoy.Certificate().Raw)
	c.DecoyPin = hex.EncodeToString(sum[:])
	return c
}

// Close stops both servers.
func (c *Cluster) Close() {
	c.API.Close()
	c.Decoy.Close()
}

// Handle decides how subresource calls are answered once they passed
// authentication and the Sandbox checks; without a handler they get 501.
func (c *Cluster) Handle(h Handler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handler = h
}

// ServeUnder makes the API server answer only below prefix (e.g. "/k8s"),
// as kubectl proxy --api-prefix does; clients then need a Host of
// API.URL+prefix.
func (c *Cluster) ServeUnder(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prefix = strings.TrimSuffix(prefix, "/")
}

// AllowToken makes the API server accept a bearer token as user.
func (c *Cluster) AllowToken(token, user string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens[token] = user
}

// Requests returns every request the API server received, oldest first.
func (c *Cluster) Requests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Request(nil), c.requests...)
}

// SubresourceRequests returns the subresource calls the API server
// received, oldest first.
func (c *Cluster) SubresourceRequests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Request
	for _, r := range c.requests {
		if r.Subresource != "" {
			out = append(out, r)
		}
	}
	return out
}

// LastSubresourceRequest returns the latest subresource call; ok is false
// when there was none.
func (c *Cluster) LastSubresourceRequest() (r Request, ok bool) {
	reqs := c.SubresourceRequests()
	if len(reqs) == 0 {
		return Request{}, false
	}
	return reqs[len(reqs)-1], true
}

// APICalls counts the requests the API server received.
func (c *Cluster) APICalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.requests)
}

// DecoyConnections counts the connections the decoy node API accepted.
func (c *Cluster) DecoyConnections() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.decoyConns
}

// DecoyRequests returns what reached the decoy, to explain a failure.
func (c *Cluster) DecoyRequests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Request(nil), c.decoyRequests...)
}

// AddSandbox stores a Ready Sandbox whose status.nodeAPIEndpoint names the
// decoy. mutate may change its status (a map as in JSON) before it is
// stored.
func (c *Cluster) AddSandbox(ns, name string, mutate ...func(status map[string]any)) {
	status := map[string]any{
		"nodeName":        "fake-node",
		"nodeAPIEndpoint": c.Decoy.URL,
		"conditions": []any{map[string]any{
			"type": "Ready", "status": "True", "reason": "Running", "message": "the container runs",
			"lastTransitionTime": "2026-01-01T00:00:00Z",
		}},
	}
	for _, m := range mutate {
		m(status)
	}
	obj := map[string]any{
		"apiVersion": "sandbox.code-sandbox.dev/v1alpha1",
		"kind":       "Sandbox",
		"metadata":   map[string]any{"namespace": ns, "name": name, "uid": "uid-" + ns + "-" + name},
		"spec":       map[string]any{"image": "busybox"},
		"status":     status,
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sandboxes[ns+"/"+name] = obj
}

// Sandbox returns the Sandbox ns/name as the fake API server serves it,
// typed: what a caller that read it would hold (for sandboxclient.For).
func (c *Cluster) Sandbox(ns, name string) *sandboxv1alpha1.Sandbox {
	c.mu.Lock()
	obj, ok := c.sandboxes[ns+"/"+name]
	c.mu.Unlock()
	if !ok {
		panic("sandboxclienttest: no Sandbox " + ns + "/" + name)
	}
	sbx := &sandboxv1alpha1.Sandbox{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(runtime.DeepCopyJSON(obj), sbx); err != nil {
		panic("sandboxclienttest: decoding the Sandbox: " + err.Error())
	}
	return sbx
}

// NotReady sets the Ready condition to False with reason and message.
func NotReady(reason, message string) func(map[string]any) {
	return func(status map[string]any) {
		status["conditions"] = []any{map[string]any{
			"type": "Ready", "status": "False", "reason": reason, "message": message,
			"lastTransitionTime": "2026-01-01T00:00:00Z",
		}}
	}
}

func (c *Cluster) serveAPI(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec := Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Query: r.URL.Query(),
		Header: r.Header.Clone(), Body: body, RemoteAddr: r.RemoteAddr}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		rec.ClientCertCN = r.TLS.VerifiedChains[0][0].Subject.CommonName
	}
	c.mu.Lock()
	prefix, handler := c.prefix, c.handler
	// Like kube-apiserver's union authenticator: a verified client
	// certificate first, then a bearer token; nothing else is accepted.
	switch {
	case rec.ClientCertCN != "":
		rec.User = rec.ClientCertCN
	default:
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			rec.User = c.tokens[tok]
		}
	}
	path, underPrefix := strings.CutPrefix(r.URL.Path, prefix)
	var rt subresource.Route
	var rerr *subresource.Error
	if underPrefix && strings.HasPrefix(path, subresource.AggregatedPathPrefix) {
		// The route is parsed without the prefix, as the API server sees it
		// behind kubectl proxy.
		pr := r.Clone(r.Context())
		pr.URL.Path = path
		rt, rerr = subresource.ParseRoute(subresource.AggregatedPathPrefix, pr)
		rec.Namespace, rec.Name, rec.Subresource = rt.Namespace, rt.Name, rt.Subresource
	}
	c.requests = append(c.requests, rec)
	c.mu.Unlock()

	switch {
	case !underPrefix:
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the fake API server serves only below "+prefix)
	case rec.User == "":
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
	case rerr != nil:
		subresource.WriteError(w, rerr)
	case rec.Subresource != "":
		c.serveSubresource(w, r, rt, handler, body)
	default:
		c.serveSandbox(w, r, path)
	}
}

// serveSubresource checks the Sandbox as the operator's aggregated API
// server does (internal/aggregatedapi, with subresource.CheckServed) before
// handing over to h.
func (c *Cluster) serveSubresource(w http.ResponseWriter, r *http.Request, rt subresource.Route, h Handler, body []byte) {
	key := rt.Namespace + "/" + rt.Name
	// Refusals name the Sandbox; h gets w itself.
	named := subresource.NameSandbox(w, rt.Name)
	c.mu.Lock()
	obj, ok := c.sandboxes[key]
	var sbx sandboxv1alpha1.Sandbox
	var convErr error
	if ok {
		convErr = runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &sbx)
	}
	c.mu.Unlock()
	switch {
	case !ok:
		subresource.WriteError(named, subresource.NewError(http.StatusNotFound, metav1.StatusReasonNotFound, "sandbox %s not found", key))
		return
	case convErr != nil:
		subresource.WriteError(named, fmt.Errorf("the fake API server cannot decode sandbox %s: %w", key, convErr))
		return
	}
	if err := subresource.CheckServed(&sbx, rt.Subresource); err != nil {
		subresource.WriteError(named, err)
		return
	}
	if h == nil {
		writeStatus(w, http.StatusNotImplemented, metav1.StatusReasonUnknown, "the fake API server has no subresource handler")
		return
	}
	h(w, r, body)
}

// serveSandbox answers GET /apis/sandbox.code-sandbox.dev/v1alpha1/namespaces/NS/sandboxes/NAME.
func (c *Cluster) serveSandbox(w http.ResponseWriter, r *http.Request, path string) {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 7 || parts[0] != "apis" || parts[1] != "sandbox.code-sandbox.dev" ||
		parts[3] != "namespaces" || parts[5] != "sandboxes" {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the fake API server serves only GET on sandboxes and their subresources: "+r.URL.Path)
		return
	}
	ns, name := parts[4], parts[6]
	c.mu.Lock()
	obj, ok := c.sandboxes[ns+"/"+name]
	var data []byte
	if ok {
		data, _ = json.Marshal(obj)
	}
	c.mu.Unlock()
	if !ok {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("sandboxes.sandbox.code-sandbox.dev %q not found", name))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// WriteStatus answers like the API server and the node API do.
func WriteStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, message string) {
	writeStatus(w, code, reason, message)
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Message: message,
	})
}

func (c *Cluster) apiCAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.API.Certificate().Raw})
}

// RESTConfig reaches the fake API server with a bearer token, which it
// admits as user token+"-user". An empty token sets no credentials.
func (c *Cluster) RESTConfig(token string) *rest.Config {
	if token != "" {
		c.AllowToken(token, token+"-user")
	}
	return &rest.Config{Host: c.API.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.apiCAPEM()}}
}

// CertConfig reaches the fake API server with a client certificate for
// user cn and no token.
func (c *Cluster) CertConfig(cn string) *rest.Config {
	cfg := c.RESTConfig("")
	cfg.CertData, cfg.KeyData = c.ClientCertificate(cn)
	return cfg
}

// ClientCertificate issues a client certificate (PEM) for user cn that the
// API server accepts.
func (c *Cluster) ClientCertificate(cn string) (certPEM, keyPEM []byte) {
	cert, err := c.clientCA.IssueClient(cn, nil, time.Hour)
	if err != nil {
		panic(err)
	}
	certPEM, keyPEM, err = operatorca.EncodeKeyPair(cert)
	if err != nil {
		panic(err)
	}
	return certPEM, keyPEM
}

// WriteKubeconfig writes a kubeconfig for the fake API server with a bearer
// token (which it admits, as RESTConfig does) and a current namespace.
func (c *Cluster) WriteKubeconfig(path, namespace, token string) error {
	return WriteKubeconfigFor(path, c.RESTConfig(token), namespace)
}

// WriteKubeconfigFor writes a kubeconfig with cfg's server (including any
// path prefix), CA, token or token file, and client certificate.
func WriteKubeconfigFor(path string, cfg *rest.Config, namespace string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["fake"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["fake"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, TokenFile: cfg.BearerTokenFile,
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["fake"] = &clientcmdapi.Context{Cluster: "fake", AuthInfo: "fake", Namespace: namespace}
	kc.CurrentContext = "fake"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("encoding the kubeconfig: %w", err)
	}
	return os.WriteFile(path, data, 0o600)
}
