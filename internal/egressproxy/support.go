/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

var discardLog = log.New(io.Discard, "", 0)

// OriginalPort reads the destination port a redirected connection had
// before the firewall's REDIRECT (SO_ORIGINAL_DST). The address is not
// returned: the proxy never dials what the sandbox chose.
func OriginalPort(c net.Conn) (uint16, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0, fmt.Errorf("not a TCP connection: %T", c)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var port uint16
	var serr error
	if err := rc.Control(func(fd uintptr) {
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		// struct sockaddr_in: family (2 bytes), port (2, big endian), address.
		port = uint16(mreq.Multiaddr[2])<<8 | uint16(mreq.Multiaddr[3])
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("SO_ORIGINAL_DST: %w", serr)
	}
	return port, nil
}

// DefaultBlocked is the check of Config.Blocked's default: every IPv6
// address, egress.BlockedIPv4 (private, shared, loopback, link-local with
// the metadata address 169.254.169.254, multicast, reserved) and the node's
// own addresses (re-read every 30 s).
func DefaultBlocked() (func(netip.Addr) bool, error) {
	var mu sync.Mutex
	var host []netip.Addr
	var read time.Time
	refresh := func() {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return
		}
		var out []netip.Addr
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
		host, read = out, time.Now()
	}
	refresh()
	if read.IsZero() {
		return nil, errors.New("egress proxy: cannot list the node's addresses")
	}
	return func(a netip.Addr) bool {
		a = a.Unmap()
		if !a.Is4() || a.IsUnspecified() {
			return true
		}
		for _, p := range egress.BlockedIPv4 {
			if p.Contains(a) {
				return true
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(read) > 30*time.Second {
			refresh()
		}
		return slices.Contains(host, a)
	}, nil
}

// LoadOrCreateCA loads the proxy's CA from dir (ca.crt, ca.key), creating
// it (key 0600, dir 0700) when absent. The CA signs only the leaf
// certificates of injected hosts; sandboxes with a policy trust it.
func LoadOrCreateCA(dir string, now time.Time) (*operatorca.CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		ca, err := operatorca.LoadCA(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("egress proxy CA in %s: %w", dir, err)
		}
		if now.After(ca.Certificate().NotAfter.Add(-30 * 24 * time.Hour)) {
			return nil, fmt.Errorf("egress proxy CA in %s expires %s: remove %s and %s to create a new one (sandboxes started with the old one must be restarted)", dir, ca.Certificate().NotAfter.Format(time.RFC3339), certPath, keyPath)
		}
		return ca, nil
	}
	if !errors.Is(cerr, os.ErrNotExist) && cerr != nil {
		return nil, fmt.Errorf("egress proxy CA: %w", cerr)
	}
	if !errors.Is(kerr, os.ErrNotExist) && kerr != nil {
		return nil, fmt.Errorf("egress proxy CA: %w", kerr)
	}
	host, _ := os.Hostname()
	ca, err := operatorca.NewCA("code-sandbox egress proxy "+host, 10*365*24*time.Hour, now)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress proxy CA: %w", err)
	}
	// The key first: a certificate without its key is never left behind.
	if err := writeFileAtomic(keyPath, ca.KeyPEM(), 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, ca.CertPEM(), 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// leafCache mints and keeps leaf certificates per host name, least
// recently used first out.
type leafCache struct {
	ca  *operatorca.CA
	max int
	now func() time.Time

	mu    sync.Mutex
	order *list.List // of string, most recent first
	certs map[string]*leafEntry
}

type leafEntry struct {
	cert *tls.Certificate
	elem *list.Element
}

func newLeafCache(ca *operatorca.CA, maxEntries int, now func() time.Time) *leafCache {
	return &leafCache{ca: ca, max: maxEntries, now: now, order: list.New(), certs: map[string]*leafEntry{}}
}

func (c *leafCache) get(name string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.certs[name]; e != nil {
		if c.now().Before(e.cert.Leaf.NotAfter.Add(-leafValidity / 4)) {
			c.order.MoveToFront(e.elem)
			return e.cert, nil
		}
		c.order.Remove(e.elem)
		delete(c.certs, name)
	}
	cert, err := c.ca.IssueServing([]string{name}, leafValidity)
	if err != nil {
		return nil, err
	}
	if cert.Leaf == nil {
		return nil, errors.New("minted certificate without a parsed leaf")
	}
	for len(c.certs) >= c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.certs, last.Value.(string))
	}
	c.certs[name] = &leafEntry{cert: cert, elem: c.order.PushFront(name)}
	return cert, nil
}

// auditor keeps recent events per sandbox and feeds the sink, rate-limited,
// from one goroutine.
type auditor struct {
	sink    func(Event)
	limiter *rate.Limiter
	ch      chan Event
	perBox  int
	dropped atomic.Uint64

	mu     sync.Mutex
	recent map[string][]Event
	order  []string // sandboxes in first-seen order, to bound recent
}

// maxAuditSandboxes bounds how many sandboxes' recent events are kept.
const maxAuditSandboxes = 4096

func newAuditor(cfg Config, _ func() time.Time) *auditor {
	r, b := cfg.AuditRate, cfg.AuditBurst
	if r <= 0 {
		r = 20
	}
	if b <= 0 {
		b = 50
	}
	per := cfg.RecentPerSandbox
	if per <= 0 {
		per = 256
	}
	return &auditor{sink: cfg.Audit, limiter: rate.NewLimiter(rate.Limit(r), b), ch: make(chan Event, 1024), perBox: per, recent: map[string][]Event{}}
}

func (a *auditor) add(e Event) {
	a.mu.Lock()
	evs, ok := a.recent[e.Sandbox]
	if !ok {
		if len(a.order) >= maxAuditSandboxes {
			delete(a.recent, a.order[0])
			a.order = a.order[1:]
		}
		a.order = append(a.order, e.Sandbox)
	}
	evs = append(evs, e)
	if len(evs) > a.perBox {
		evs = slices.Delete(evs, 0, len(evs)-a.perBox)
	}
	a.recent[e.Sandbox] = evs
	a.mu.Unlock()
	if a.sink == nil {
		return
	}
	if !a.limiter.Allow() {
		a.dropped.Add(1)
		return
	}
	select {
	case a.ch <- e:
	default:
		a.dropped.Add(1)
	}
}

func (a *auditor) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-a.ch:
			a.sink(e)
		}
	}
}

// Recent returns up to the last Config.RecentPerSandbox events of a sandbox
// (by Policy.Sandbox; "" holds those of addresses without a policy), oldest
// first: what `kubectl sandbox logs --egress` shows.
func (p *Proxy) Recent(sandbox string) []Event {
	p.audit.mu.Lock()
	defer p.audit.mu.Unlock()
	return slices.Clone(p.audit.recent[sandbox])
}

// Dropped is how many events the sink did not get (rate limit or a full
// buffer); Recent still has them.
func (p *Proxy) Dropped() uint64 { return p.audit.dropped.Load() }
