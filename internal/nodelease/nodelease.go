/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package nodelease keeps one Lease per node manager in the operator
// namespace, renewed like the kubelet's node Lease (component-helpers' lease
// controller), and lists the managers whose Lease is current. The managers
// use that list to spread warm pool members over the nodes that run a
// manager: a node that is not running any Sandbox is still a candidate.
//
// Only the managers write these Leases, each only its own node's
// (config/policy/node_lease_policy.yaml); namespace users cannot write in
// the operator namespace at all. So the list, like status.nodeName, is
// never something a namespace user decides.
package nodelease

// Each manager creates, renews and at exit deletes its own node's Lease.
// RBAC cannot confine that to one name per node; the admission policy in
// config/policy/node_lease_policy.yaml does, so that no manager can touch
// another node's Lease or the quota controller's leader election Lease.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=system,resources=leases,verbs=get;list;watch;create;update;delete

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

const (
	// NamePrefix + the node name is the name of a manager's Lease.
	NamePrefix = "code-sandbox-node-"
	// LabelNodeManager marks the managers' Leases, so that listing them
	// skips other Leases of the namespace (the quota controller's).
	LabelNodeManager = "sandbox.code-sandbox.dev/node-manager"
	// Duration and RenewInterval are the kubelet's node Lease defaults: a
	// manager that stopped renewing drops out of the list after 40 s; one
	// that stops cleanly deletes its Lease at once.
	Duration      = 40 * time.Second
	RenewInterval = 10 * time.Second
)

// Name is the name of node's Lease, or an error when the node name is too
// long to make one.
func Name(node string) (string, error) {
	name := NamePrefix + node
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("node name %q makes no valid Lease name %q: %v", node, name, errs)
	}
	return name, nil
}

// Heartbeat keeps node's Lease in namespace while it runs: it deletes a
// Lease a previous run left, renews every RenewInterval and deletes the
// Lease when ctx ends. It is a controller-runtime Runnable
// (manager.RunnableFunc) for every replica; nothing is elected.
func Heartbeat(cs kubernetes.Interface, node, namespace string) (func(context.Context) error, error) {
	name, err := Name(node)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		log := logf.FromContext(ctx).WithValues("lease", namespace+"/"+name)
		c := lease.NewController(clock.RealClock{}, cs, node, int32(Duration/time.Second),
			func() { log.Info("renewing the node manager's Lease keeps failing") },
			RenewInterval, name, namespace,
			func(l *coordinationv1.Lease) error {
				if l.Labels == nil {
					l.Labels = map[string]string{}
				}
				l.Labels[LabelNodeManager] = "true"
				return nil
			})
		if err := c.Start(ctx.Done()); err != nil {
			return err
		}
		<-ctx.Done()
		c.Stop()
		return nil
	}, nil
}

// Live lists the nodes whose manager holds a current Lease in namespace,
// read through reader. A manager's Lease names its node in
// spec.holderIdentity.
func Live(ctx context.Context, reader client.Reader, namespace string, now time.Time) ([]string, error) {
	var leases coordinationv1.LeaseList
	if err := reader.List(ctx, &leases, client.InNamespace(namespace), client.MatchingLabels{LabelNodeManager: "true"}); err != nil {
		return nil, fmt.Errorf("listing the node managers' Leases in namespace %s: %w", namespace, err)
	}
	var nodes []string
	for i := range leases.Items {
		if node, ok := current(&leases.Items[i], now); ok {
			nodes = append(nodes, node)
		}
	}
	sort.Strings(nodes)
	return nodes, nil
}

// current returns the node a Lease was renewed for, if it has not expired.
func current(l *coordinationv1.Lease, now time.Time) (string, bool) {
	node, expiry, ok := Expiry(l)
	if !ok {
		return "", false
	}
	return node, now.Before(expiry)
}

// Expiry returns the node a manager's Lease names and when it expires
// (renewTime + leaseDurationSeconds); ok is false for a Lease that names
// no node, was never renewed, or is held under another node's name.
func Expiry(l *coordinationv1.Lease) (node string, expiry time.Time, ok bool) {
	s := l.Spec
	if s.HolderIdentity == nil || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return "", time.Time{}, false
	}
	if l.Name != NamePrefix+*s.HolderIdentity {
		// Not written by that node's manager (the policy would refuse it).
		return "", time.Time{}, false
	}
	return *s.HolderIdentity, s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second), true
}

// Cached is Live behind a short cache: a burst of decisions costs one List.
type Cached struct {
	Reader    client.Reader
	Namespace string
	Clock     clock.PassiveClock
	// TTL is how long a listing is reused.
	TTL time.Duration

	mu    sync.Mutex
	at    time.Time
	nodes []string
}

// Nodes returns the nodes with a live manager, listing at most once a TTL.
func (c *Cached) Nodes(ctx context.Context) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Clock.Now()
	if c.nodes != nil && now.Sub(c.at) < c.TTL {
		return c.nodes, nil
	}
	nodes, err := Live(ctx, c.Reader, c.Namespace, now)
	if err != nil {
		return nil, err
	}
	if nodes == nil {
		nodes = []string{}
	}
	c.nodes, c.at = nodes, now
	return nodes, nil
}
