/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egressproxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Bounds of the resolver's cache and answers.
const (
	minTTL          = 1 * time.Second
	maxTTL          = 60 * time.Second
	maxCacheEntries = 4096
	// answerTTL is the TTL of the answers given to sandboxes: short, so
	// that a sandbox asks again (and is checked again) often.
	answerTTL = 5
)

var errNXDomain = errors.New("no such name")

// resolver asks the upstream resolver for A records and keeps them for
// their TTL (bounded), without the blocked addresses.
type resolver struct {
	upstream string
	udp, tcp *dns.Client
	blocked  func(netip.Addr) bool
	now      func() time.Time

	mu    sync.Mutex
	cache map[string]cacheEntry
}

type cacheEntry struct {
	addrs   []netip.Addr
	nx      bool
	expires time.Time
}

func newResolver(upstream string, blocked func(netip.Addr) bool, now func() time.Time) *resolver {
	return &resolver{
		upstream: upstream,
		udp:      &dns.Client{Net: "udp", Timeout: 3 * time.Second},
		tcp:      &dns.Client{Net: "tcp", Timeout: 5 * time.Second},
		blocked:  blocked,
		now:      now,
		cache:    map[string]cacheEntry{},
	}
}

// lookup returns name's A addresses that are not blocked (possibly none),
// errNXDomain, or an error.
func (r *resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	now := r.now()
	r.mu.Lock()
	if e, ok := r.cache[name]; ok && now.Before(e.expires) {
		r.mu.Unlock()
		if e.nx {
			return nil, errNXDomain
		}
		return e.addrs, nil
	}
	r.mu.Unlock()

	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.RecursionDesired = true
	resp, _, err := r.udp.ExchangeContext(ctx, q, r.upstream)
	if err == nil && resp.Truncated {
		resp, _, err = r.tcp.ExchangeContext(ctx, q, r.upstream)
	}
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", name, err)
	}
	e := cacheEntry{expires: now.Add(maxTTL)}
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		e.nx = true
		e.expires = now.Add(minTTL * 5)
	default:
		return nil, fmt.Errorf("resolving %s: %s", name, dns.RcodeToString[resp.Rcode])
	}
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.A)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		ttl := time.Duration(a.Hdr.Ttl) * time.Second
		ttl = max(minTTL, min(ttl, maxTTL))
		if exp := now.Add(ttl); exp.Before(e.expires) {
			e.expires = exp
		}
		// A blocked address is never handed out nor dialed: DNS
		// rebinding to a private, link-local or node address ends here.
		if !r.blocked(ip) {
			e.addrs = append(e.addrs, ip)
		}
	}
	r.mu.Lock()
	if len(r.cache) >= maxCacheEntries {
		for k, v := range r.cache {
			if !now.Before(v.expires) || len(r.cache) >= maxCacheEntries {
				delete(r.cache, k)
			}
			if len(r.cache) < maxCacheEntries/2 {
				break
			}
		}
	}
	r.cache[name] = e
	r.mu.Unlock()
	if e.nx {
		return nil, errNXDomain
	}
	return e.addrs, nil
}

// serveDNS answers a sandbox's query: A records of allowed names (the ones
// the proxy would dial), an empty answer for their other types (AAAA
// included: IPv6 is not routed), NXDOMAIN for every other name, REFUSED to
// an address without a policy.
func (p *Proxy) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	resp.Compress = true
	defer func() { _ = w.WriteMsg(resp) }()
	src := sourceOf(w.RemoteAddr())
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return
	}
	q := req.Question[0]
	qtype := dns.TypeToString[q.Qtype]
	m := p.matcher(src)
	if m == nil {
		resp.Rcode = dns.RcodeRefused
		p.refuse("", q.Name, 53, qtype, "", ReasonNoPolicy)
		return
	}
	name := NormalizeName(q.Name)
	if q.Qclass != dns.ClassINET || name == "" || !m.AllowsName(name) {
		resp.Rcode = dns.RcodeNameError
		p.refuse(m.Sandbox(), q.Name, 53, qtype, "", ReasonNotAllowed)
		return
	}
	if q.Qtype != dns.TypeA {
		return // NOERROR, no records
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := p.resolver.lookup(ctx, name)
	switch {
	case errors.Is(err, errNXDomain):
		resp.Rcode = dns.RcodeNameError
		return
	case err != nil:
		resp.Rcode = dns.RcodeServerFailure
		p.refuse(m.Sandbox(), name, 53, qtype, "", ReasonResolveFailed)
		return
	case len(addrs) == 0:
		p.refuse(m.Sandbox(), name, 53, qtype, "", ReasonBlockedAddress)
		return
	}
	for _, a := range addrs {
		resp.Answer = append(resp.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: answerTTL},
			A:   a.AsSlice(),
		})
	}
}
