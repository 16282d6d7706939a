/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// --max-sandboxes, exact across replicas.
//
// Counting from the cache is not exact: two replicas creating for one
// identity at the same moment both see the same count. So each identity has a
// reservation record, a Lease named ReservationPrefix + its owner hash in the
// Sandboxes' namespace, whose annotation AnnotationReservations lists the
// Sandbox names reserved for it with the time of the reservation. A create
// first reserves a name: it reads the record, drops the entries whose Sandbox
// is gone, counts what is left together with the identity's live Sandboxes in
// the cache, and writes the record back with the new name only if the count
// is under the limit. The write carries the resourceVersion it read (the API
// server's optimistic concurrency): of two replicas racing, one write fails
// with a conflict, and that replica reads again and counts the other's
// reservation. Only then is the Sandbox created, under the reserved name.
//
// Why a Lease of the MCP server's own rather than the quota webhook: the
// webhook (internal/admission) counts SandboxQuota usage per namespace, not
// per MCP identity, and --max-sandboxes is the MCP server's flag; putting it
// there would make the webhook trust a limit written on the Sandbox. The
// record lives where the Sandboxes do, and costs one object per identity.
//
// The trust rule. The record is not the only witness: the count is the union
// of the record and the identity's Sandboxes in the cache (selected by the
// owner label, which only the MCP server may set, see cache.go). Someone who
// can edit Leases in the namespace therefore cannot lower an identity's count
// below its live Sandboxes by deleting entries, and an entry they add counts
// only while it is young (a create in flight, at most reservationGrace, and
// never one dated in the future) or while a live Sandbox with that name
// carries the identity's owner label. So nobody can raise another identity's
// count beyond a moment, or lower their own. RBAC should still keep Leases
// in that namespace to the MCP server (docs/deploy.md).

// ReservationPrefix starts the name of each identity's reservation Lease.
const ReservationPrefix = "mcp-sandboxes-"

// AnnotationReservations holds the reservation entries: a JSON object of
// Sandbox name to RFC 3339 reservation time.
const AnnotationReservations = "sandbox.code-sandbox.dev/mcp-reservations"

// AnnotationSnapshotReservations holds the same for SandboxSnapshot names:
// --max-snapshots is kept by the same record and the same code.
const AnnotationSnapshotReservations = "sandbox.code-sandbox.dev/mcp-snapshot-reservations"

// reserved is one kind of object an identity's record reserves names for.
type reserved struct {
	// noun names the objects in messages.
	noun       string
	annotation string
	// prefix starts every name reserved.
	prefix string
	limit  func(*driver) int
	// live lists caller's objects that count: name to creation time.
	live func(ctx context.Context, d *driver, namespace string, caller contract.Caller) (map[string]time.Time, error)
	// owned asks the API server whether object name is caller's and not
	// being deleted.
	owned      func(ctx context.Context, d *driver, namespace, name string, caller contract.Caller) (bool, error)
	limitError func(d *driver, have, limit int) error
}

var (
	sandboxReservations = &reserved{
		noun: "sandbox", annotation: AnnotationReservations, prefix: NamePrefix,
		limit: func(d *driver) int { return d.opts.MaxSandboxes },
		live: func(ctx context.Context, d *driver, namespace string, caller contract.Caller) (map[string]time.Time, error) {
			list, err := d.ownedSandboxes(ctx, namespace, caller)
			if err != nil {
				return nil, err
			}
			out := make(map[string]time.Time, len(list))
			for i := range list {
				out[list[i].Name] = list[i].CreationTimestamp.UTC()
			}
			return out, nil
		},
		owned: func(ctx context.Context, d *driver, namespace, name string, caller contract.Caller) (bool, error) {
			var sbx sandboxv1alpha1.Sandbox
			if err := d.kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sbx); err != nil {
				return false, err
			}
			return owns(caller, &sbx), nil
		},
		limitError: func(d *driver, have, limit int) error { return d.limitError(have, limit) },
	}
	// Snapshots are listed from the API server: the cache holds Sandboxes
	// only, and a snapshot create is rare enough.
	snapshotReservations = &reserved{
		noun: "snapshot", annotation: AnnotationSnapshotReservations, prefix: SnapshotPrefix,
		limit: func(d *driver) int { return d.opts.MaxSnapshots },
		live: func(ctx context.Context, d *driver, namespace string, caller contract.Caller) (map[string]time.Time, error) {
			var list sandboxv1alpha1.SandboxSnapshotList
			if err := d.kube.List(ctx, &list, client.InNamespace(namespace), ownerSelector(caller)); err != nil {
				return nil, err
			}
			out := make(map[string]time.Time, len(list.Items))
			for i := range list.Items {
				if ownsSnapshot(caller, &list.Items[i]) {
					out[list.Items[i].Name] = list.Items[i].CreationTimestamp.UTC()
				}
			}
			return out, nil
		},
		owned: func(ctx context.Context, d *driver, namespace, name string, caller contract.Caller) (bool, error) {
			var snap sandboxv1alpha1.SandboxSnapshot
			if err := d.kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &snap); err != nil {
				return false, err
			}
			return ownsSnapshot(caller, &snap), nil
		},
		limitError: func(_ *driver, have, limit int) error {
			return &messageError{kind: contract.ErrQuota, msg: fmt.Sprintf(
				"you already keep %d snapshots; the limit (--max-snapshots) is %d: delete_snapshot one first", have, limit)}
		},
	}
)

// ownsSnapshot is owns for a SandboxSnapshot.
func ownsSnapshot(caller contract.Caller, snap *sandboxv1alpha1.SandboxSnapshot) bool {
	return snap.DeletionTimestamp == nil && snap.Labels[LabelOwner] == contract.IdentityHash(caller.ID)
}

// reservationGrace is how long an entry without a Sandbox counts: a create
// in flight (createObject is bounded by apiTimeout), with room for clock
// differences between replicas.
const reservationGrace = apiTimeout + 30*time.Second

// maxReserveAttempts bounds the conflict retries of one reservation.
const maxReserveAttempts = 50

type reservationEntries map[string]time.Time

func reservationName(caller contract.Caller) string {
	return ReservationPrefix + contract.IdentityHash(caller.ID)
}

func readEntries(lease *coordinationv1.Lease, annotation string) reservationEntries {
	out := reservationEntries{}
	raw := lease.Annotations[annotation]
	if raw == "" {
		return out
	}
	var m map[string]time.Time
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		// Mangled: the live Sandboxes still count (see above).
		return out
	}
	for name, at := range m {
		if len(name) <= 63 {
			out[name] = at
		}
	}
	return out
}

// reserve reserves a fresh Sandbox name for caller in namespace, or refuses
// with the limit error when caller already has MaxSandboxes. unreserve drops
// the reservation again (for a create that failed).
func (b *driver) reserve(ctx context.Context, namespace string, caller contract.Caller) (string, error) {
	return b.reserveKind(ctx, sandboxReservations, namespace, caller)
}

// reserveKind reserves a fresh name of kind k for caller.
func (b *driver) reserveKind(ctx context.Context, k *reserved, namespace string, caller contract.Caller) (string, error) {
	limit := k.limit(b)
	key := client.ObjectKey{Namespace: namespace, Name: reservationName(caller)}
	for attempt := 0; attempt < maxReserveAttempts; attempt++ {
		var lease coordinationv1.Lease
		err := b.kube.Get(ctx, key, &lease)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return "", apiError("reading your "+k.noun+" reservations", err)
		}
		live, err := k.live(ctx, b, namespace, caller)
		if err != nil {
			return "", apiError("counting your "+k.noun+"s", err)
		}
		now := time.Now()
		kept := b.pruneEntries(ctx, k, namespace, caller, readEntries(&lease, k.annotation), live, now)
		if len(kept) >= limit {
			// At the edge, trust no cached object the API server no longer
			// has (a stop that just finished).
			kept = b.confirmEntries(ctx, k, namespace, caller, kept, now)
		}
		if n := len(kept); n >= limit {
			return "", k.limitError(b, n, limit)
		}
		var name string
		for name == "" || kept[name] != (time.Time{}) {
			name = k.prefix + randid.Hex(6)
		}
		kept[name] = now.UTC()
		raw, _ := json.Marshal(map[string]time.Time(kept))
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[LabelManagedBy] = ManagedBy
		lease.Labels[LabelOwner] = contract.IdentityHash(caller.ID)
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[k.annotation] = string(raw)
		if exists {
			// The resourceVersion read above: a conflict if anyone wrote
			// in between.
			err = b.kube.Update(ctx, &lease)
		} else {
			lease.Namespace, lease.Name = key.Namespace, key.Name
			lease.ResourceVersion = ""
			err = b.kube.Create(ctx, &lease)
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return "", apiError("recording your "+k.noun+" reservation", err)
		}
		return name, nil
	}
	return "", &messageError{kind: contract.ErrUnavailable, msg: fmt.Sprintf(
		"could not record a %s reservation after %d attempts: too many concurrent calls for this identity; retry", k.noun, maxReserveAttempts)}
}

// pruneEntries is the entries that still count, together with every live
// Sandbox of caller's (live, from the cache): an entry counts while its
// Sandbox is live, or while it is young enough to be a create in flight.
// An older entry without a cached Sandbox is checked with the API server
// (the cache may lag behind a Sandbox another replica made).
func (b *driver) pruneEntries(ctx context.Context, k *reserved, namespace string, caller contract.Caller, entries reservationEntries, live map[string]time.Time, now time.Time) reservationEntries {
	kept := reservationEntries{}
	maps.Copy(kept, live)
	for name, at := range entries {
		if _, ok := kept[name]; ok {
			continue
		}
		age := now.Sub(at)
		if age >= -time.Second && age < reservationGrace {
			kept[name] = at
			continue
		}
		if b.liveOwned(ctx, k, namespace, name, caller) {
			kept[name] = at
		}
	}
	return kept
}

// confirmEntries drops the entries that are neither young nor a Sandbox of
// caller's that the API server has.
func (b *driver) confirmEntries(ctx context.Context, k *reserved, namespace string, caller contract.Caller, kept reservationEntries, now time.Time) reservationEntries {
	out := maps.Clone(kept)
	for name, at := range kept {
		if age := now.Sub(at); age >= -time.Second && age < reservationGrace {
			continue
		}
		if !b.liveOwned(ctx, k, namespace, name, caller) {
			delete(out, name)
		}
	}
	return out
}

// liveOwned asks the API server whether object name of kind k is caller's
// and not being deleted. When it cannot tell, it says yes: counting one too
// many is the safe side.
func (b *driver) liveOwned(ctx context.Context, k *reserved, namespace, name string, caller contract.Caller) bool {
	ok, err := k.owned(ctx, b, namespace, name, caller)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		return true
	}
	return ok
}

// unreserve drops name from caller's reservations (a create that failed, a
// Sandbox stopped), best effort: an entry left behind (a Sandbox deleted by
// other means) stops counting after reservationGrace.
func (b *driver) unreserve(namespace string, caller contract.Caller, name string) {
	b.unreserveKind(sandboxReservations, namespace, caller, name)
}

// unreserveKind is unreserve for kind k.
func (b *driver) unreserveKind(k *reserved, namespace string, caller contract.Caller, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	key := client.ObjectKey{Namespace: namespace, Name: reservationName(caller)}
	for range 5 {
		var lease coordinationv1.Lease
		if err := b.kube.Get(ctx, key, &lease); err != nil {
			return
		}
		entries := readEntries(&lease, k.annotation)
		if _, ok := entries[name]; !ok {
			return
		}
		delete(entries, name)
		raw, _ := json.Marshal(map[string]time.Time(entries))
		lease.Annotations[k.annotation] = string(raw)
		err := b.kube.Update(ctx, &lease)
		if !apierrors.IsConflict(err) {
			if err != nil {
				b.log.Warn("dropping a reservation", "kind", k.noun, "name", name, "error", err)
			}
			return
		}
	}
}
