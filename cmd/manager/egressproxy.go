/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
)

// egressProxyFlags configure the node's egress proxy (internal/egressproxy).
type egressProxyFlags struct {
	enabled  bool
	port     uint
	dnsPort  uint
	upstream string
}

func (f *egressProxyFlags) bind(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "egress-proxy", true, "Run the egress proxy and resolver that enforce Egress sandboxes' name allow-lists (spec.network.egress) and inject their credentials. Needs --egress-firewall (its rules redirect a policy sandbox's traffic to the proxy).")
	fs.UintVar(&f.port, "egress-proxy-port", 15001, "TCP port of the egress proxy on the egress bridge's gateway address.")
	fs.UintVar(&f.dnsPort, "egress-proxy-dns-port", 15053, "UDP and TCP port of the egress resolver on the egress bridge's gateway address.")
	fs.StringVar(&f.upstream, "egress-proxy-upstream", "", "Resolver (host:port) the egress proxy asks. Default: the first nameserver of /etc/resolv.conf, port 53.")
}

// startEgressProxy builds the proxy on the egress bridge's gateway, tells
// the firewall where it is, and returns the Node the sandbox controller
// sets policies on, with the proxy's Run to add to the manager.
//
// sink, once set, gets every audit event too (the sandbox controller's
// EgressAudit, which turns refusals into Events); the proxy exists before
// the controller does.
func startEgressProxy(ctx context.Context, log logr.Logger, f egressProxyFlags, fw *egress.Firewall, docker *dockerruntime.Client, stateDir string, sink *atomic.Pointer[func(egressproxy.Event)]) (*egressproxy.Node, func(context.Context) error, error) {
	if fw == nil {
		return nil, nil, errors.New("--egress-proxy needs --egress-firewall")
	}
	if f.port == 0 || f.port > 65535 || f.dnsPort == 0 || f.dnsPort > 65535 || f.port == f.dnsPort {
		return nil, nil, fmt.Errorf("--egress-proxy-port %d and --egress-proxy-dns-port %d must be distinct ports", f.port, f.dnsPort)
	}
	gw, subnet, err := docker.EgressNetworkAddrs(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("egress proxy: %w", err)
	}
	upstream := f.upstream
	if upstream == "" {
		if upstream, err = firstNameserver("/etc/resolv.conf"); err != nil {
			return nil, nil, fmt.Errorf("egress proxy: %w; set --egress-proxy-upstream", err)
		}
	}
	ca, err := egressproxy.LoadOrCreateCA(filepath.Join(stateDir, "egress-proxy"), time.Now())
	if err != nil {
		return nil, nil, err
	}
	audit := log.WithName("audit")
	p, err := egressproxy.New(egressproxy.Config{
		Listen:    net.JoinHostPort(gw.String(), strconv.Itoa(int(f.port))),
		DNSListen: net.JoinHostPort(gw.String(), strconv.Itoa(int(f.dnsPort))),
		Upstream:  upstream,
		CA:        ca,
		// Rate-limited by the proxy; the secret is never in an Event.
		Audit: func(e egressproxy.Event) {
			audit.Info("egress", "sandbox", e.Sandbox, "decision", e.Decision, "reason", e.Reason, "host", e.Host, "port", e.Port, "method", e.Method, "path", e.Path)
			if fn := sink.Load(); fn != nil {
				(*fn)(e)
			}
		},
	})
	if err != nil {
		return nil, nil, err
	}
	// Bound before the firewall redirects anything here: a port another
	// manager on this Docker host holds leaves this one without a proxy
	// (and its firewall without proxy rules), not fighting over them.
	if err := p.Listen(); err != nil {
		return nil, nil, err
	}
	if err := fw.SetProxy(&egress.ProxyOptions{Gateway: gw, Subnet: subnet, Port: uint16(f.port), DNSPort: uint16(f.dnsPort)}); err != nil {
		return nil, nil, err
	}
	log.Info("egress proxy", "listen", gw.String(), "port", f.port, "dnsPort", f.dnsPort, "upstream", upstream, "subnet", subnet.String())
	run := func(ctx context.Context) error {
		// A listener that cannot open (the bridge went away with a Docker
		// restart) is retried; the manager keeps serving other sandboxes.
		for {
			err := p.Run(ctx)
			if ctx.Err() != nil {
				return nil
			}
			log.Error(err, "egress proxy stopped; retrying in 10s")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Second):
			}
		}
	}
	return egressproxy.NewNode(p, fw), run, nil
}

// firstNameserver is the first nameserver of a resolv.conf, as host:53.
func firstNameserver(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Unmap().Is4() {
				return net.JoinHostPort(a.Unmap().String(), "53"), nil
			}
		}
	}
	return "", fmt.Errorf("no IPv4 nameserver in %s", path)
}
