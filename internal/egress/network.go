/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package egress isolates the sandboxes that may reach the internet
// (network mode Egress) from everything else. They do not share Docker's
// default bridge: they get a dedicated bridge network without
// inter-container communication (EnsureNetwork), and iptables rules that let
// them reach public addresses only (Firewall): not the node itself, not
// link-local (cloud metadata), not private or shared address space, and not
// the node's other addresses. The node's manager and the MCP server's Docker
// backend share this one implementation.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"
)

// Names of the egress network and of the Linux bridge behind it. The bridge
// name is fixed so that the firewall rules can match the interface.
const (
	NetworkName = "code-sandbox-egress"
	BridgeName  = "csbx-egress0"

	// PolicyNetworkName is the network of the sandboxes with an egress
	// policy, and PolicyBridgeName its bridge. Everything a sandbox sends
	// on it is the proxy's or dropped, by interface, from the first packet
	// (Firewall: PolicyForwardChain, PolicyInputChain, PolicyProxyChain):
	// there is no window between the container's start and the manager's
	// SetPolicy in which it is unrestricted, and the proxy refuses a
	// source it has no policy for.
	PolicyNetworkName = "code-sandbox-egress-policy"
	PolicyBridgeName  = "csbx-egpol0"

	// Docker's bridge driver options the network is created with.
	optBridgeName = "com.docker.network.bridge.name"
	optICC        = "com.docker.network.bridge.enable_icc"
	optMasquerade = "com.docker.network.bridge.enable_ip_masquerade"

	labelManagedBy = "sandbox.code-sandbox.dev/managed-by"
	managedByValue = "code-sandbox-operator"
)

// ErrNetworkMisconfigured: a network named NetworkName exists but was not
// created with the options this package needs. It is never changed or
// removed automatically: sandboxes may be attached to it.
var ErrNetworkMisconfigured = errors.New("egress network misconfigured")

// NetworkAPI is the part of the Docker client EnsureNetwork needs.
type NetworkAPI interface {
	NetworkInspect(ctx context.Context, networkID string, options network.InspectOptions) (network.Inspect, error)
	NetworkCreate(ctx context.Context, name string, options network.CreateOptions) (network.CreateResponse, error)
}

// NetworkRemover is the part of the Docker client RemoveNetwork needs.
type NetworkRemover interface {
	NetworkRemove(ctx context.Context, networkID string) error
}

// NetworkOptions are the driver options of the egress network.
func NetworkOptions() map[string]string { return networkOptions(BridgeName) }

func networkOptions(bridge string) map[string]string {
	return map[string]string{
		optBridgeName: bridge,
		optICC:        "false",
		optMasquerade: "true",
	}
}

// SandboxSysctls are the sysctls of an Egress sandbox's network namespace:
// IPv6 off on every interface. The network has no IPv6 subnet, but an
// interface with IPv6 on still gets a link-local address, and link-local
// traffic between sandboxes on the one bridge is switched, not routed: the
// ip6tables rules see it only if the node sets
// net.bridge.bridge-nf-call-ip6tables. Some Docker versions turn IPv6 off
// on interfaces of an IPv4-only network; this does not depend on that. Nil
// when the node has no IPv6 at all (the sysctls would not exist).
func SandboxSysctls() map[string]string {
	if !ipv6Enabled() {
		return nil
	}
	return map[string]string{
		"net.ipv6.conf.all.disable_ipv6":     "1",
		"net.ipv6.conf.default.disable_ipv6": "1",
	}
}

// EnsureNetwork creates the egress network unless it exists, and checks that
// an existing one has the options the firewall relies on. It is idempotent
// and safe to call concurrently from several processes.
func EnsureNetwork(ctx context.Context, api NetworkAPI) (network.Inspect, error) {
	return ensureNetwork(ctx, api, NetworkName, BridgeName)
}

// EnsurePolicyNetwork is EnsureNetwork for PolicyNetworkName.
func EnsurePolicyNetwork(ctx context.Context, api NetworkAPI) (network.Inspect, error) {
	return ensureNetwork(ctx, api, PolicyNetworkName, PolicyBridgeName)
}

func ensureNetwork(ctx context.Context, api NetworkAPI, name, bridge string) (network.Inspect, error) {
	n, err := api.NetworkInspect(ctx, name, network.InspectOptions{})
	if err == nil {
		return n, checkNetwork(n, name, bridge)
	}
	if !cerrdefs.IsNotFound(err) {
		return network.Inspect{}, fmt.Errorf("inspecting Docker network %s: %w", name, err)
	}
	ipv6 := false
	_, err = api.NetworkCreate(ctx, name, network.CreateOptions{
		Driver:     "bridge",
		Options:    networkOptions(bridge),
		EnableIPv6: &ipv6,
		Labels:     map[string]string{labelManagedBy: managedByValue},
	})
	// Another process may have created it in between.
	if err != nil && !cerrdefs.IsConflict(err) && !strings.Contains(err.Error(), "already exists") {
		return network.Inspect{}, fmt.Errorf("creating Docker network %s: %w", name, err)
	}
	n, err = api.NetworkInspect(ctx, name, network.InspectOptions{})
	if err != nil {
		return network.Inspect{}, fmt.Errorf("inspecting Docker network %s: %w", name, err)
	}
	return n, checkNetwork(n, name, bridge)
}

// checkNetwork refuses a network the firewall would not cover: another
// driver, another bridge name (the rules match BridgeName), inter-container
// communication on, or internal (no egress at all).
func checkNetwork(n network.Inspect, name, bridge string) error {
	var problems []string
	if n.Name != name {
		problems = append(problems, fmt.Sprintf("name %q", n.Name))
	}
	if n.Driver != "bridge" {
		problems = append(problems, fmt.Sprintf("driver %q (want bridge)", n.Driver))
	}
	if got := n.Options[optBridgeName]; got != bridge {
		problems = append(problems, fmt.Sprintf("%s=%q (want %q)", optBridgeName, got, bridge))
	}
	if got := n.Options[optICC]; got != "false" {
		problems = append(problems, fmt.Sprintf("%s=%q (want \"false\")", optICC, got))
	}
	if got, ok := n.Options[optMasquerade]; ok && got != "true" {
		problems = append(problems, fmt.Sprintf("%s=%q (want \"true\")", optMasquerade, got))
	}
	if n.Internal {
		problems = append(problems, "internal (no route out)")
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: Docker network %s (%s) exists with %s; remove it (docker network rm %s, after removing the containers attached to it) so that it is re-created",
		ErrNetworkMisconfigured, name, shortID(n.ID), strings.Join(problems, ", "), name)
}

// RemoveNetwork removes the egress network and the policy network. A
// network that does not exist is not an error; one with containers
// attached is (Docker refuses).
func RemoveNetwork(ctx context.Context, api NetworkRemover) error {
	var errs []error
	for _, name := range []string{NetworkName, PolicyNetworkName} {
		if err := api.NetworkRemove(ctx, name); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("removing Docker network %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// BridgeVisible reports an error unless the network interface name exists
// in this process's network namespace. The firewall's rules match the egress
// bridge by name in the namespace they are installed in; a manager that does
// not share the Docker host's network namespace (a Pod without hostNetwork,
// or a kind node whose manager uses the host's Docker through a mounted
// socket) would install rules that never see the sandboxes' traffic. With
// the Engine DaemonSet (config/engine: hostNetwork, like the manager) the
// bridge is in the node's namespace, on kind too.
func BridgeVisible(name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return fmt.Errorf("the egress bridge %s is not in this process's network namespace (%v): firewall rules installed here would not filter Egress sandboxes, so run the manager in the network namespace of the Docker Engine it uses (hostNetwork on the node whose dockerd runs in the node's namespace: the node's own Engine, or config/engine's Engine Pod; not a Docker socket mounted from another host, such as a kind node given the host's socket)", name, err)
	}
	return nil
}
