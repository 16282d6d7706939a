/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ReasonHostChanged: a later request on a plain HTTP connection named
// another host than the first (one connection, one host).
const ReasonHostChanged = "HostChanged"

// idleTimeout closes a served (HTTP or terminated) connection idle this long.
const idleTimeout = 2 * time.Minute

// errHelloRead stops the handshake once the ClientHello is read.
var errHelloRead = errors.New("client hello read")

// peekClientHello reads one ClientHello from br with crypto/tls and returns
// it with the exact bytes read, to be replayed.
func peekClientHello(br *bufio.Reader) (*tls.ClientHelloInfo, []byte, error) {
	rec := &recordingConn{r: br}
	var hello *tls.ClientHelloInfo
	err := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		cp := *h
		cp.Conn = nil
		hello = &cp
		return nil, errHelloRead
	}}).Handshake()
	if hello == nil {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return nil, nil, err
	}
	return hello, rec.buf.Bytes(), nil
}

// recordingConn is the net.Conn crypto/tls reads the ClientHello from: it
// records what is read and discards what is written (the alert sent when
// the handshake is stopped).
type recordingConn struct {
	r   io.Reader
	buf bytes.Buffer
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.buf.Write(b[:n])
	return n, err
}
func (c *recordingConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *recordingConn) Close() error                     { return nil }
func (c *recordingConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *recordingConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *recordingConn) SetDeadline(time.Time) error      { return nil }
func (c *recordingConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordingConn) SetWriteDeadline(time.Time) error { return nil }

// replayConn reads from r (what was already read, then the rest) and writes
// to the connection.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// oneConnListener hands out one connection, then blocks until it is done.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	end  sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{c: c, done: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, io.EOF
}
func (l *oneConnListener) finish()        { l.end.Do(func() { close(l.done) }) }
func (l *oneConnListener) Close() error   { l.finish(); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// served is one HTTP or terminated TLS connection of a sandbox.
type served struct {
	p      *Proxy
	src    netip.Addr
	port   uint16
	raw    net.Conn // closing it ends the connection
	scheme string   // "http" or "https"
	// sni is the name of a terminated TLS connection; requests must name
	// it. Empty for plain HTTP, where the first request binds host.
	sni string

	mu    sync.Mutex
	host  string
	track *tracked
}

// handleHTTP serves a plain HTTP connection, checking every request's Host.
func (p *Proxy) handleHTTP(ctx context.Context, c net.Conn, br *bufio.Reader, src netip.Addr, port uint16, _ *Matcher) {
	_ = c.SetReadDeadline(time.Time{})
	s := &served{p: p, src: src, port: port, raw: c, scheme: "http"}
	s.serve(ctx, &replayConn{Conn: c, r: br})
}

// terminate serves a TLS connection to an injected host with a leaf
// certificate minted for name.
func (p *Proxy) terminate(ctx context.Context, c net.Conn, src netip.Addr, name string, port uint16, m *Matcher) {
	if p.leaves.ca == nil {
		p.refuse(m.Sandbox(), name, port, "", "", ReasonUpstream)
		return
	}
	cert, err := p.leaves.get(name)
	if err != nil {
		p.refuse(m.Sandbox(), name, port, "", "", ReasonUpstream)
		return
	}
	s := &served{p: p, src: src, port: port, raw: c, scheme: "https", sni: name}
	s.track = &tracked{host: name, port: port, terminated: true, close: func() { _ = c.Close() }}
	if !p.track(src, m, s.track) {
		p.refuse(m.Sandbox(), name, port, "", "", ReasonPolicyChanged)
		return
	}
	defer p.untrack(src, s.track)
	tc := tls.Server(c, &tls.Config{
		Certificates: []tls.Certificate{*cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	s.serve(ctx, tc)
}

func (s *served) serve(ctx context.Context, c net.Conn) {
	l := newOneConnListener(c)
	rp := &httputil.ReverseProxy{
		Rewrite:       s.rewrite,
		Transport:     s.p.transport,
		FlushInterval: -1,
		ErrorHandler:  s.upstreamError,
	}
	var hijacked atomic.Bool
	srv := &http.Server{
		Handler:           s.handler(rp, l, &hijacked),
		ReadHeaderTimeout: helloTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          discardLog,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateClosed:
				l.finish()
			case http.StateHijacked:
				// An upgrade (WebSocket): ReverseProxy owns the
				// connection until its handler returns.
				hijacked.Store(true)
			}
		},
	}
	_ = srv.Serve(l)
	s.mu.Lock()
	t := s.track
	s.mu.Unlock()
	if t != nil && s.sni == "" {
		s.p.untrack(s.src, t)
	}
}

// handler checks each request against the sandbox's current policy.
func (s *served) handler(rp http.Handler, l *oneConnListener, hijacked *atomic.Bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := s.p.matcher(s.src)
		if m == nil {
			s.p.refuse("", hostOnly(r.Host), s.port, r.Method, r.URL.Path, ReasonNoPolicy)
			deny(w, http.StatusForbidden, ReasonNoPolicy)
			return
		}
		name := NormalizeName(hostOnly(r.Host))
		if name == "" {
			s.p.refuse(m.Sandbox(), hostOnly(r.Host), s.port, r.Method, r.URL.Path, ReasonRawIP)
			deny(w, http.StatusForbidden, ReasonRawIP)
			return
		}
		if s.sni != "" && name != s.sni {
			s.p.refuse(m.Sandbox(), name, s.port, r.Method, r.URL.Path, ReasonSNIHostMismatch)
			deny(w, http.StatusMisdirectedRequest, ReasonSNIHostMismatch)
			return
		}
		rule := m.Allows(name, s.port)
		if rule == nil {
			s.p.refuse(m.Sandbox(), name, s.port, r.Method, r.URL.Path, ReasonNotAllowed)
			deny(w, http.StatusForbidden, ReasonNotAllowed)
			return
		}
		if s.sni == "" {
			// Plain HTTP: the first request binds the connection.
			s.mu.Lock()
			if s.host == "" {
				s.host = name
				s.track = &tracked{host: name, port: s.port, terminated: false, close: func() { _ = s.raw.Close() }}
				if !s.p.track(s.src, m, s.track) {
					s.mu.Unlock()
					s.p.refuse(m.Sandbox(), name, s.port, r.Method, r.URL.Path, ReasonPolicyChanged)
					deny(w, http.StatusForbidden, ReasonPolicyChanged)
					return
				}
			}
			bound := s.host
			s.mu.Unlock()
			if bound != name {
				s.p.refuse(m.Sandbox(), name, s.port, r.Method, r.URL.Path, ReasonHostChanged)
				deny(w, http.StatusMisdirectedRequest, ReasonHostChanged)
				return
			}
		}
		ctx := context.WithValue(r.Context(), ruleKey{}, ruleCtx{rule: rule, name: name, sandbox: m.Sandbox()})
		rp.ServeHTTP(w, r.WithContext(ctx))
		if hijacked.Load() {
			l.finish()
		}
	})
}

type ruleKey struct{}

type ruleCtx struct {
	rule    *Rule
	name    string
	sandbox string
}

// rewrite sends the request to the name the policy allowed (resolved by
// dialResolved), removes the sandbox's copy of an injected header and adds
// the secret when method and path match.
func (s *served) rewrite(pr *httputil.ProxyRequest) {
	rc, _ := pr.In.Context().Value(ruleKey{}).(ruleCtx)
	pr.Out.URL.Scheme = s.scheme
	pr.Out.URL.Host = net.JoinHostPort(rc.name, strconv.Itoa(int(s.port)))
	pr.Out.Host = pr.In.Host
	if rc.rule == nil || rc.rule.Inject == nil {
		return
	}
	in := rc.rule.Inject
	pr.Out.Header.Del(in.Header)
	if in.InjectsInto(pr.In.Method, pr.In.URL.Path) {
		pr.Out.Header.Set(in.Header, string(in.Value))
		s.p.audit.add(Event{Time: s.p.now(), Sandbox: rc.sandbox, Host: rc.name, Port: s.port, Method: pr.In.Method, Path: pr.In.URL.Path, Decision: DecisionInjected, Reason: ReasonInjected})
	}
}

func (s *served) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rc, _ := r.Context().Value(ruleKey{}).(ruleCtx)
	reason := ReasonUpstream
	var rf *refusal
	if errors.As(err, &rf) {
		reason = rf.reason
	}
	s.p.refuse(rc.sandbox, rc.name, s.port, r.Method, r.URL.Path, reason)
	status := http.StatusBadGateway
	if reason == ReasonBlockedAddress {
		status = http.StatusForbidden
	}
	if reason == ReasonUpstream {
		// The transport's error (a dial or TLS failure) never holds a
		// header value.
		reason += ": " + err.Error()
	}
	deny(w, status, reason)
}

// deny answers a refused request; the body names the reason only.
func deny(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Egress-Proxy-Refused", strings.SplitN(reason, ":", 2)[0])
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "egress proxy refused the request: "+reason+"\n")
}

// hostOnly strips a port from a Host header value.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}
