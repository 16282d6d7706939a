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
	"net/netip"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
)

// egressFlags configure the egress network's firewall (internal/egress).
type egressFlags struct {
	allowCIDRs []string
	dnsServers []string
	firewall   bool
	interval   time.Duration
	cleanup    bool
	mode       string
	detect     bool
}

func (f *egressFlags) bind(fs *flag.FlagSet) {
	fs.Func("egress-allow-cidr", "IPv4 CIDR that Egress sandboxes may reach although it is private, link-local or the node's (repeatable or comma-separated), for example a proxy at 10.0.5.0/28. The node itself stays closed.", func(v string) error {
		f.allowCIDRs = append(f.allowCIDRs, v)
		return nil
	})
	fs.Func("egress-dns-server", "Upstream DNS server that Docker's embedded resolver forwards Egress sandboxes' queries to (repeatable or comma-separated); they may reach it on port 53 only. Default: the nameservers of /etc/resolv.conf (those Docker uses).", func(v string) error {
		f.dnsServers = append(f.dnsServers, v)
		return nil
	})
	fs.BoolVar(&f.firewall, "egress-firewall", true, "Install and keep the iptables rules that confine Egress sandboxes to public addresses (needs NET_ADMIN and the host network namespace). While they are not in place, Egress sandboxes are not created. false only where equivalent rules are installed otherwise.")
	fs.DurationVar(&f.interval, "egress-firewall-interval", egress.DefaultCheckInterval, "How often the egress rules are checked and repaired.")
	fs.StringVar(&f.mode, "egress-iptables-mode", egress.ModeAuto, "iptables backend of the egress rules, which must be the one holding Docker's DOCKER-USER chain: auto (the one holding Docker's chains, else kubelet's hint chain, else the most rules, as Kubernetes' iptables-wrapper does; plain iptables when neither iptables-nft nor iptables-legacy is installed), nft (iptables-nft) or legacy (iptables-legacy).")
	fs.BoolVar(&f.detect, "egress-iptables-detect", false, "Print the iptables backend --egress-iptables-mode chooses on this node, and why, then exit. Changes nothing.")
	fs.BoolVar(&f.cleanup, "egress-cleanup", false, "Remove the egress iptables rules and the "+egress.NetworkName+" and "+egress.PolicyNetworkName+" Docker networks, then exit (uninstall).")
}

func (f *egressFlags) newFirewall() (*egress.Firewall, error) {
	allow, err := egress.ParseCIDRs(f.allowCIDRs)
	if err != nil {
		return nil, fmt.Errorf("--egress-allow-cidr: %w", err)
	}
	var dns []netip.Addr
	for _, v := range f.dnsServers {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("--egress-dns-server %q: %w", s, err)
			}
			dns = append(dns, a)
		}
	}
	if _, err := egress.ParseMode(f.mode); err != nil {
		return nil, fmt.Errorf("--egress-iptables-mode: %w", err)
	}
	return egress.NewFirewall(egress.Options{AllowCIDRs: allow, DNSServers: dns, Manager: true, Mode: f.mode})
}

// runEgressDetect is --egress-iptables-detect.
func runEgressDetect(f egressFlags) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fw, err := f.newFirewall()
	if err != nil {
		return err
	}
	b, err := fw.Backend(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("iptables backend: %s\n", b)
	return nil
}

// runEgressCleanup is --egress-cleanup: it undoes what the node role set
// up for Egress sandboxes.
func runEgressCleanup(f egressFlags, dockerHost string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fw, err := f.newFirewall()
	if err != nil {
		return err
	}
	var errs []error
	if err := fw.Remove(ctx); err != nil {
		errs = append(errs, err)
	}
	docker, err := dockerruntime.New(dockerruntime.Options{Host: dockerHost})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer docker.Close()
	if err := egress.RemoveNetwork(ctx, docker.Docker()); err != nil {
		errs = append(errs, fmt.Errorf("%w (remove the Egress sandboxes first)", err))
	}
	if len(errs) == 0 {
		fmt.Println("removed the egress firewall rules and the " + egress.NetworkName + " and " + egress.PolicyNetworkName + " networks")
	}
	return errors.Join(errs...)
}

// startEgress installs the firewall once (logging a failure: Egress
// sandboxes then wait for it) and prepares the egress network.
func startEgress(ctx context.Context, log logr.Logger, fw *egress.Firewall, docker *dockerruntime.Client) {
	if fw != nil {
		if b, err := fw.Backend(ctx); err == nil {
			log.Info("iptables backend", "mode", b.Mode, "iptables", b.IPTables, "ip6tables", b.IP6Tables, "reason", b.Reason)
		}
		if _, err := fw.Ensure(ctx); err != nil {
			log.Error(err, "installing the egress firewall; Egress sandboxes are not created until it is in place")
		}
	}
	if err := docker.EnsureEgressNetwork(ctx); err != nil {
		log.Error(err, "preparing the egress network")
	}
}

// keepEgressFirewall re-checks the rules until ctx ends.
func keepEgressFirewall(ctx context.Context, log logr.Logger, fw *egress.Firewall, interval time.Duration) error {
	fw.Run(ctx, interval, func(repaired []string, err error) {
		if err != nil {
			log.Error(err, "egress firewall check")
			return
		}
		log.Info("repaired the egress firewall", "repaired", repaired)
	})
	return nil
}
