/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package egress

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// iptables backends. A node's netfilter rules live either in nf_tables
// (written by iptables-nft) or in the legacy x_tables (iptables-legacy);
// the two are separate rulesets, and our jump must be in the one holding
// Docker's DOCKER-USER chain. The manager's image ships both variants.
const (
	// ModeAuto picks the backend the node already uses, as Kubernetes'
	// iptables-wrapper does: the one holding Docker's chains, else
	// kubelet's hint chains, else the most rules (nft on a tie). Without
	// the -nft and -legacy variants it runs plain iptables.
	ModeAuto = "auto"
	// ModeNFT runs iptables-nft, ip6tables-nft and their -restore.
	ModeNFT = "nft"
	// ModeLegacy runs iptables-legacy, ip6tables-legacy and their -restore.
	ModeLegacy = "legacy"
)

// ParseMode checks an iptables mode: auto (also ""), nft or legacy.
func ParseMode(s string) (string, error) {
	switch s {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeNFT, ModeLegacy:
		return s, nil
	}
	return "", fmt.Errorf("iptables mode %q: want auto, nft or legacy", s)
}

// Backend is the iptables a Firewall runs.
type Backend struct {
	// Mode is nft or legacy; "" for plain (or explicitly named) binaries.
	Mode string
	// IPTables and IP6Tables are the binaries; the -restore variants are
	// found next to them by name.
	IPTables, IP6Tables string
	// Reason says why this backend was chosen.
	Reason string
}

func (b Backend) String() string {
	mode := b.Mode
	if mode == "" {
		mode = "plain"
	}
	return fmt.Sprintf("%s (%s, %s): %s", mode, b.IPTables, b.IP6Tables, b.Reason)
}

func variant(mode string) Backend {
	return Backend{Mode: mode, IPTables: "iptables-" + mode, IP6Tables: "ip6tables-" + mode}
}

// detectTimeout bounds one *-save run: iptables-nft 1.8.3 could loop
// forever (iptables-wrapper guards against it the same way).
const detectTimeout = 10 * time.Second

// Backend returns the iptables backend the Firewall runs, choosing it on
// the first call (see Options.Mode). A failed choice is retried next time.
func (f *Firewall) Backend(ctx context.Context) (Backend, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resolve(ctx)
}

// resolve chooses the backend once; f.mu is held.
func (f *Firewall) resolve(ctx context.Context) (Backend, error) {
	if f.backend != nil {
		return *f.backend, nil
	}
	b, err := f.chooseBackend(ctx)
	if err != nil {
		return Backend{}, err
	}
	f.backend = &b
	return b, nil
}

func (f *Firewall) chooseBackend(ctx context.Context) (Backend, error) {
	if f.opts.IPTables != "" {
		ip6 := f.opts.IP6Tables
		if ip6 == "" {
			ip6 = "ip6tables"
		}
		return Backend{IPTables: f.opts.IPTables, IP6Tables: ip6, Reason: "binaries named explicitly"}, nil
	}
	switch f.opts.Mode {
	case ModeNFT, ModeLegacy:
		if missing := f.missing(f.opts.Mode); missing != "" {
			return Backend{}, fmt.Errorf("iptables mode %s: %s not found in $PATH", f.opts.Mode, missing)
		}
		b := variant(f.opts.Mode)
		b.Reason = "iptables mode " + f.opts.Mode
		return b, nil
	}

	nftMissing, legacyMissing := f.missing(ModeNFT), f.missing(ModeLegacy)
	switch {
	case nftMissing != "" && legacyMissing != "":
		return Backend{IPTables: "iptables", IP6Tables: "ip6tables", Reason: "neither iptables-nft nor iptables-legacy found; using iptables"}, nil
	case legacyMissing != "":
		b := variant(ModeNFT)
		b.Reason = legacyMissing + " not found"
		return b, nil
	case nftMissing != "":
		b := variant(ModeLegacy)
		b.Reason = nftMissing + " not found"
		return b, nil
	}
	nft := f.survey(ctx, ModeNFT)
	legacy := f.survey(ctx, ModeLegacy)
	if nft.err != nil && legacy.err != nil {
		return Backend{}, fmt.Errorf("choosing the iptables backend: %w", errors.Join(nft.err, legacy.err))
	}
	mode, why := pickMode(nft, legacy)
	b := variant(mode)
	b.Reason = why
	return b, nil
}

// missing returns the first binary of mode's variant not in $PATH, or "".
func (f *Firewall) missing(mode string) string {
	for _, bin := range []string{"iptables-" + mode, "iptables-" + mode + "-restore", "iptables-" + mode + "-save"} {
		if _, err := f.lookPath(bin); err != nil {
			return bin
		}
	}
	return ""
}

// ruleset is what one backend's *-save listed.
type ruleset struct {
	mode string
	// dockerUser: IPv4 has DOCKER-USER. dockerOwn: IPv4 has a chain only
	// Docker itself creates (DOCKER, DOCKER-ISOLATION-STAGE-*): DOCKER-USER
	// alone may be ours, made by an earlier Ensure.
	dockerUser, dockerOwn bool
	// kubelet: kubelet's KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain.
	kubelet bool
	// rules counts the rule lines of IPv4 and IPv6.
	rules int
	err   error
}

// survey runs iptables-<mode>-save and ip6tables-<mode>-save (no -t: for
// legacy that would create the table) and summarizes their output. A
// failing ip6tables-save (no IPv6) counts as empty.
func (f *Firewall) survey(ctx context.Context, mode string) ruleset {
	rs := ruleset{mode: mode}
	for _, bin := range []string{"iptables-" + mode + "-save", "ip6tables-" + mode + "-save"} {
		cctx, cancel := context.WithTimeout(ctx, detectTimeout)
		out, err := f.exec(cctx, "", bin)
		cancel()
		if err != nil {
			if strings.HasPrefix(bin, "iptables-") {
				rs.err = err
			}
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(line, "-"):
				rs.rules++
			case strings.HasPrefix(line, ":"):
				name, _, _ := strings.Cut(line[1:], " ")
				v4 := strings.HasPrefix(bin, "iptables-")
				switch {
				case name == dockerUserChain && v4:
					rs.dockerUser = true
				case (name == "DOCKER" || strings.HasPrefix(name, "DOCKER-ISOLATION-")) && v4:
					rs.dockerOwn = true
				case name == "KUBE-IPTABLES-HINT" || name == "KUBE-KUBELET-CANARY":
					rs.kubelet = true
				}
			}
		}
	}
	return rs
}

// pickMode chooses between the nft and the legacy ruleset: the first of
// these that tells them apart wins: Docker's DOCKER-USER, Docker's own
// chains, kubelet's hint chains, more rules. A tie is nft (the default
// of current distributions and of kubelet).
func pickMode(nft, legacy ruleset) (mode, why string) {
	if nft.err != nil {
		return ModeLegacy, "iptables-nft-save failed: " + nft.err.Error()
	}
	if legacy.err != nil {
		return ModeNFT, "iptables-legacy-save failed: " + legacy.err.Error()
	}
	for _, c := range []struct {
		what       string
		nft, other bool
	}{
		{"Docker's DOCKER-USER chain", nft.dockerUser, legacy.dockerUser},
		{"Docker's own chains (DOCKER, DOCKER-ISOLATION-*)", nft.dockerOwn, legacy.dockerOwn},
		{"kubelet's iptables hint chain", nft.kubelet, legacy.kubelet},
	} {
		if c.nft != c.other {
			if c.nft {
				return ModeNFT, c.what + ": only in the nf_tables ruleset (iptables-nft)"
			}
			return ModeLegacy, c.what + ": only in the legacy ruleset (iptables-legacy)"
		}
	}
	counts := fmt.Sprintf("(iptables-nft-save lists %d rules, iptables-legacy-save %d)", nft.rules, legacy.rules)
	if legacy.rules > nft.rules {
		return ModeLegacy, "the legacy ruleset holds more rules " + counts
	}
	if nft.rules > legacy.rules {
		return ModeNFT, "the nf_tables ruleset holds more rules " + counts
	}
	return ModeNFT, "no ruleset is in use more than the other; nft is the default " + counts
}
