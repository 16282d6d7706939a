/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Timeouts of the proxy.
const (
	// helloTimeout bounds the wait for a ClientHello or a request line.
	helloTimeout = 10 * time.Second
	// dialTimeout bounds an upstream dial.
	dialTimeout = 10 * time.Second
	// leafValidity is the validity of a minted leaf certificate; it is
	// re-minted when less than a quarter is left.
	leafValidity = 24 * time.Hour
	// maxLeaves bounds the leaf certificate cache.
	maxLeaves = 1024
)

// Proxy is the node's egress proxy and resolver.
type Proxy struct {
	cfg       Config
	blocked   func(netip.Addr) bool
	origPort  func(net.Conn) (uint16, error)
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	now       func() time.Time
	resolver  *resolver
	leaves    *leafCache
	audit     *auditor
	transport *http.Transport

	mu      sync.RWMutex
	sources map[netip.Addr]*source

	listenMu  sync.Mutex
	ready     chan struct{}
	readyOnce sync.Once
	tcpAddr   net.Addr
	dnsAddr   net.Addr
}

// source is one sandbox address: its policy and its open connections.
type source struct {
	matcher *Matcher
	conns   map[*tracked]struct{}
}

// tracked is an open connection: what it was allowed for, and how to end it.
type tracked struct {
	host       string
	port       uint16
	terminated bool
	close      func()
}

// New validates cfg. It listens on nothing until Run.
func New(cfg Config) (*Proxy, error) {
	if cfg.Listen == "" || cfg.DNSListen == "" || cfg.Upstream == "" {
		return nil, errors.New("egress proxy: Listen, DNSListen and Upstream are required")
	}
	if _, _, err := net.SplitHostPort(cfg.Upstream); err != nil {
		return nil, fmt.Errorf("egress proxy: upstream resolver %q: %w", cfg.Upstream, err)
	}
	p := &Proxy{
		cfg:      cfg,
		blocked:  cfg.Blocked,
		origPort: cfg.OriginalPort,
		dial:     cfg.Dial,
		now:      cfg.Now,
		sources:  map[netip.Addr]*source{},
		ready:    make(chan struct{}),
	}
	if p.blocked == nil {
		b, err := DefaultBlocked()
		if err != nil {
			return nil, err
		}
		p.blocked = b
	}
	if p.origPort == nil {
		p.origPort = OriginalPort
	}
	if p.dial == nil {
		d := &net.Dialer{Timeout: dialTimeout}
		p.dial = d.DialContext
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.resolver = newResolver(cfg.Upstream, p.blocked, p.now)
	p.leaves = newLeafCache(cfg.CA, maxLeaves, p.now)
	p.audit = newAuditor(cfg, p.now)
	p.transport = &http.Transport{
		DialContext:         p.dialResolved,
		TLSClientConfig:     &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return p, nil
}

// Run listens and serves until ctx ends. It returns an error if a listener
// cannot be opened.
func (p *Proxy) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp4", p.cfg.Listen)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	udp, err := net.ListenPacket("udp4", p.cfg.DNSListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("egress proxy resolver: %w", err)
	}
	dnsTCP, err := net.Listen("tcp4", udp.LocalAddr().String())
	if err != nil {
		_ = ln.Close()
		_ = udp.Close()
		return fmt.Errorf("egress proxy resolver: %w", err)
	}
	handler := dns.HandlerFunc(p.serveDNS)
	// Shutdown before a server started is a no-op, and the server would
	// then run for ever: wait for both to start.
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	udpSrv := &dns.Server{PacketConn: udp, Handler: handler, NotifyStartedFunc: notify}
	tcpSrv := &dns.Server{Listener: dnsTCP, Handler: handler, ReadTimeout: helloTimeout, NotifyStartedFunc: notify}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = udpSrv.ActivateAndServe() }()
	go func() { defer wg.Done(); _ = tcpSrv.ActivateAndServe() }()
	go func() { defer wg.Done(); p.audit.run(ctx) }()
	<-started
	<-started
	p.listenMu.Lock()
	p.tcpAddr, p.dnsAddr = ln.Addr(), udp.LocalAddr()
	p.listenMu.Unlock()
	p.readyOnce.Do(func() { close(p.ready) })

	go func() {
		<-ctx.Done()
		_ = ln.Close()
		_ = udpSrv.Shutdown()
		_ = tcpSrv.Shutdown()
		p.closeAll()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				wg.Wait()
				p.transport.CloseIdleConnections()
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go p.handle(ctx, c)
	}
}

// Addrs returns the proxy's and the resolver's listening addresses once Run
// listens (tests listening on port 0).
func (p *Proxy) Addrs(ctx context.Context) (proxy, resolver net.Addr, err error) {
	select {
	case <-p.ready:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	p.listenMu.Lock()
	defer p.listenMu.Unlock()
	return p.tcpAddr, p.dnsAddr, nil
}

// SetPolicy sets the policy of the sandbox with source address src. New
// connections and queries see it at once; open connections it no longer
// allows (another name, another port, a host that is now injected or no
// longer injected) are closed and audited (ReasonPolicyChanged). An invalid
// policy is refused and the previous one kept.
func (p *Proxy) SetPolicy(src netip.Addr, pol Policy) error {
	src = src.Unmap()
	if !src.Is4() {
		return fmt.Errorf("egress policy for %s: only IPv4 sandbox addresses exist on the egress bridge", src)
	}
	m, err := NewMatcher(pol)
	if err != nil {
		return fmt.Errorf("egress policy for %s (%s): %w", src, pol.Sandbox, err)
	}
	var kill []*tracked
	p.mu.Lock()
	s := p.sources[src]
	if s == nil {
		s = &source{conns: map[*tracked]struct{}{}}
		p.sources[src] = s
	}
	s.matcher = m
	for t := range s.conns {
		r := m.Allows(t.host, t.port)
		if r == nil || (r.Inject != nil) != t.terminated {
			kill = append(kill, t)
			delete(s.conns, t)
		}
	}
	p.mu.Unlock()
	for _, t := range kill {
		t.close()
		p.refuse(m.Sandbox(), t.host, t.port, "", "", ReasonPolicyChanged)
	}
	return nil
}

// RemovePolicy forgets src's policy: everything from src is refused, and its
// open connections are closed.
func (p *Proxy) RemovePolicy(src netip.Addr) {
	src = src.Unmap()
	p.mu.Lock()
	s := p.sources[src]
	delete(p.sources, src)
	p.mu.Unlock()
	if s == nil {
		return
	}
	for t := range s.conns {
		t.close()
	}
}

// Policies returns the source addresses that have a policy (the firewall
// redirects exactly these).
func (p *Proxy) Policies() map[netip.Addr][]uint16 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make(map[netip.Addr][]uint16, len(p.sources))
	for a, s := range p.sources {
		out[a] = s.matcher.Ports()
	}
	return out
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	var all []*tracked
	for _, s := range p.sources {
		for t := range s.conns {
			all = append(all, t)
		}
	}
	p.mu.Unlock()
	for _, t := range all {
		t.close()
	}
}

// matcher returns src's Matcher, or nil.
func (p *Proxy) matcher(src netip.Addr) *Matcher {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if s := p.sources[src]; s != nil {
		return s.matcher
	}
	return nil
}

// track registers a connection of src allowed for host:port, unless the
// policy changed in between (then it returns false and the caller closes).
func (p *Proxy) track(src netip.Addr, m *Matcher, t *tracked) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sources[src]
	if s == nil || s.matcher != m {
		return false
	}
	s.conns[t] = struct{}{}
	return true
}

func (p *Proxy) untrack(src netip.Addr, t *tracked) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sources[src]; s != nil {
		delete(s.conns, t)
	}
}

// refuse audits a refusal.
func (p *Proxy) refuse(sandbox, host string, port uint16, method, path, reason string) {
	p.audit.add(Event{Time: p.now(), Sandbox: sandbox, Host: host, Port: port, Method: method, Path: path, Decision: DecisionRefused, Reason: reason})
}

// sourceOf is the IPv4 source address of a connection.
func sourceOf(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// handle serves one redirected TCP connection.
func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	defer func() { _ = c.Close() }()
	src := sourceOf(c.RemoteAddr())
	port, err := p.origPort(c)
	if err != nil {
		p.refuse("", src.String(), 0, "", "", ReasonProtocol)
		return
	}
	m := p.matcher(src)
	if m == nil {
		p.refuse("", src.String(), port, "", "", ReasonNoPolicy)
		return
	}
	_ = c.SetReadDeadline(p.now().Add(helloTimeout))
	br := bufio.NewReaderSize(c, 4096)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	if first[0] == 0x16 { // TLS handshake record
		p.handleTLS(ctx, c, br, src, port, m)
		return
	}
	p.handleHTTP(ctx, c, br, src, port, m)
}

// handleTLS reads the ClientHello and either passes the connection through
// to the name's resolved address or terminates it (injected host).
func (p *Proxy) handleTLS(ctx context.Context, c net.Conn, br *bufio.Reader, src netip.Addr, port uint16, m *Matcher) {
	hello, raw, err := peekClientHello(br)
	if err != nil {
		p.refuse(m.Sandbox(), "", port, "", "", ReasonProtocol)
		return
	}
	sni := hello.ServerName
	if sni == "" {
		p.refuse(m.Sandbox(), "", port, "", "", ReasonNoSNI)
		return
	}
	name := NormalizeName(sni)
	if name == "" {
		p.refuse(m.Sandbox(), sni, port, "", "", ReasonRawIP)
		return
	}
	rule := m.Allows(name, port)
	if rule == nil {
		p.refuse(m.Sandbox(), name, port, "", "", ReasonNotAllowed)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if rule.Inject != nil {
		p.terminate(ctx, &replayConn{Conn: c, r: io.MultiReader(bytesReader(raw), br)}, src, name, port, m)
		return
	}
	up, reason := p.dialName(ctx, name, port)
	if up == nil {
		p.refuse(m.Sandbox(), name, port, "", "", reason)
		return
	}
	defer func() { _ = up.Close() }()
	t := &tracked{host: name, port: port, close: func() { _ = c.Close(); _ = up.Close() }}
	if !p.track(src, m, t) {
		p.refuse(m.Sandbox(), name, port, "", "", ReasonPolicyChanged)
		return
	}
	defer p.untrack(src, t)
	if _, err := up.Write(raw); err != nil {
		return
	}
	splice(c, br, up)
}

// splice copies both ways until either side ends.
func splice(c net.Conn, br *bufio.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, br)
		if tc, ok := up.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		if tc, ok := c.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// dialName resolves name itself and dials the first address that is not
// blocked. It returns a refusal reason instead of a connection.
func (p *Proxy) dialName(ctx context.Context, name string, port uint16) (net.Conn, string) {
	addrs, err := p.resolver.lookup(ctx, name)
	if err != nil {
		return nil, ReasonResolveFailed
	}
	if len(addrs) == 0 {
		return nil, ReasonBlockedAddress
	}
	var lastErr error
	for _, a := range addrs {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		c, err := p.dial(dctx, "tcp4", netip.AddrPortFrom(a, port).String())
		cancel()
		if err == nil {
			return c, ""
		}
		lastErr = err
	}
	_ = lastErr
	return nil, ReasonUpstream
}

// dialResolved is the Transport's dialer for terminated connections: addr
// is "name:port" and is resolved by the proxy, never taken as an address.
func (p *Proxy) dialResolved(ctx context.Context, _, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, err
	}
	c, reason := p.dialName(ctx, host, uint16(port))
	if c == nil {
		return nil, &refusal{reason: reason}
	}
	return c, nil
}

// refusal is an error carrying a refusal reason.
type refusal struct{ reason string }

func (r *refusal) Error() string { return "egress proxy refused: " + r.reason }
