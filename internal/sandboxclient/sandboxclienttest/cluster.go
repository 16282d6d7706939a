// Package sandboxclienttest fakes what a sandboxclient talks to: an API
// server that serves Sandboxes, and one node API over TLS whose certificate
// the Sandboxes pin. It lets tests of the client and of its users (the
// kubectl plugin, the MCP server) run without a control plane or Docker.
package sandboxclienttest

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Cluster is a fake API server plus one fake node API.
type Cluster struct {
	// API serves GET on Sandboxes (TLS: clientcmd sends no credentials to
	// a plain-HTTP server).
	API *httptest.Server
	// Node is the node API (TLS, asks for but does not require a client
	// certificate); its handler is set with SetNodeHandler.
	Node *httptest.Server
	// Pin is the SHA-256 of Node's certificate, as status.agentCertSHA256.
	Pin string

	mu        sync.Mutex
	sandboxes map[string]map[string]any
	node      http.Handler
	apiCalls  int
}

// New starts both servers; Close stops them.
func New() *Cluster {
	c := &Cluster{sandboxes: map[string]map[string]any{}}
	c.API = httptest.NewTLSServer(http.HandlerFunc(c.serveAPI))
	c.Node = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		h := c.node
		c.mu.Unlock()
		if h == nil {
			http.Error(w, "no node handler set", http.StatusNotImplemented)
			return
		}
		h.ServeHTTP(w, r)
	}))
	c.Node.EnableHTTP2 = true
	// StartTLS keeps this setting and adds its own certificate.
	c.Node.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	c.Node.StartTLS()
	sum := sha256.Sum256(c.Node.Certificate().Raw)
	c.Pin = hex.EncodeToString(sum[:])
	return c
}

// Close stops both servers.
func (c *Cluster) Close() {
	c.API.Close()
	c.Node.Close()
}

// SetNodeHandler decides how the node API answers.
func (c *Cluster) SetNodeHandler(h http.Handler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.node = h
}

// NodeCAPEM is the node certificate in PEM, usable as a CA bundle.
func (c *Cluster) NodeCAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Node.Certificate().Raw})
}

func (c *Cluster) apiCAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.API.Certificate().Raw})
}

// APICalls counts the requests the API server answered.
func (c *Cluster) APICalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiCalls
}

// AddSandbox stores a Ready Sandbox that points at Node with the right pin.
// mutate may change its status (a map as in JSON) before it is stored.
func (c *Cluster) AddSandbox(ns, name string, mutate ...func(status map[string]any)) {
	status := map[string]any{
		"nodeName":        "fake-node",
		"agentEndpoint":   c.Node.URL,
		"agentCertSHA256": c.Pin,
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
	c.mu.Lock()
	c.apiCalls++
	c.mu.Unlock()
	// /apis/sandbox.code-sandbox.dev/v1alpha1/namespaces/NS/sandboxes/NAME
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 7 || parts[0] != "apis" || parts[1] != "sandbox.code-sandbox.dev" ||
		parts[3] != "namespaces" || parts[5] != "sandboxes" {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the fake API server only serves GET on sandboxes: "+r.URL.Path)
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

// RESTConfig reaches the fake API server with a bearer token.
func (c *Cluster) RESTConfig(token string) *rest.Config {
	return &rest.Config{Host: c.API.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.apiCAPEM()}}
}

// WriteKubeconfig writes a kubeconfig for the fake API server with a bearer
// token and a current namespace.
func (c *Cluster) WriteKubeconfig(path, namespace, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["fake"] = &clientcmdapi.Cluster{Server: c.API.URL, CertificateAuthorityData: c.apiCAPEM()}
	cfg.AuthInfos["fake"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["fake"] = &clientcmdapi.Context{Cluster: "fake", AuthInfo: "fake", Namespace: namespace}
	cfg.CurrentContext = "fake"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encoding the kubeconfig: %w", err)
	}
	return os.WriteFile(path, data, 0o600)
}
