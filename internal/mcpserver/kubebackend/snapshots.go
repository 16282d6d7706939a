package kubebackend

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

// Snapshots on this backend are SandboxSnapshot objects in the caller's
// namespace, labelled with the caller's identity hash as its Sandboxes are;
// the node managers take and store them (docs/snapshots.md). A fork creates
// Sandboxes with spec.snapshotRef through the ordinary create path, so the
// reservation record holds them to --max-sandboxes; and a snapshot's name is
// reserved in the same record before it is created, which holds an
// identity's snapshots to --max-snapshots across replicas, as the Docker
// backend's are.

// SnapshotPrefix starts every SandboxSnapshot name this backend creates.
const SnapshotPrefix = "mcp-snap-"

var (
	permSnapshotCreate = permission{Verb: "create", Resource: "sandboxsnapshots"}
	permSnapshotList   = permission{Verb: "list", Resource: "sandboxsnapshots"}
	permSnapshotDelete = permission{Verb: "delete", Resource: "sandboxsnapshots"}
)

var _ contract.SnapshotBackend = (*Backend)(nil)

// SnapshotsSupported implements contract.SnapshotBackend.
func (b *Backend) SnapshotsSupported() bool { return true }

// Snapshot implements contract.SnapshotBackend: it creates a SandboxSnapshot
// of the caller's Sandbox id and waits until a manager has stored it.
func (b *Backend) Snapshot(ctx context.Context, caller contract.Caller, id string) (contract.Snapshot, error) {
	d := b.driver
	ns := d.namespaceFor(caller)
	if err := d.authz.check(ctx, caller, ns, permSnapshotCreate, ""); err != nil {
		return contract.Snapshot{}, err
	}
	if err := d.authz.check(ctx, caller, ns, permGet, id); err != nil {
		return contract.Snapshot{}, err
	}
	snap, err := d.snapshot(ctx, caller, id)
	if err != nil {
		return contract.Snapshot{}, err
	}
	return snapshotView(snap), nil
}

func (d *driver) snapshot(ctx context.Context, caller contract.Caller, id string) (*sandboxv1alpha1.SandboxSnapshot, error) {
	src, err := d.lookup(ctx, session.Handle{ID: id, Caller: caller})
	if err != nil {
		return nil, err
	}
	name, err := d.reserveKind(ctx, snapshotReservations, src.Namespace, caller)
	if err != nil {
		return nil, err
	}
	snap := &sandboxv1alpha1.SandboxSnapshot{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: src.Namespace,
			Labels: map[string]string{
				LabelManagedBy: ManagedBy,
				LabelOwner:     contract.IdentityHash(caller.ID),
				LabelInstance:  d.instance,
			},
			Annotations: map[string]string{AnnotationIdentity: caller.ID},
		},
		Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: src.Name}},
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	err = d.kube.Create(actx, snap)
	cancel()
	if err != nil {
		d.unreserveKind(snapshotReservations, snap.Namespace, caller, snap.Name)
		return nil, apiError("creating the snapshot", err)
	}
	stored, err := d.waitStored(ctx, snap)
	if err != nil {
		d.deleteSnapshotQuietly(snap.Namespace, snap.Name)
		d.unreserveKind(snapshotReservations, snap.Namespace, caller, snap.Name)
		return nil, err
	}
	return stored, nil
}

// waitStored polls the snapshot until it is Stored or failed for good, or
// the ready timeout passes.
func (d *driver) waitStored(ctx context.Context, snap *sandboxv1alpha1.SandboxSnapshot) (*sandboxv1alpha1.SandboxSnapshot, error) {
	wctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	last := "no manager has taken it yet"
	for {
		var cur sandboxv1alpha1.SandboxSnapshot
		err := d.kube.Get(wctx, client.ObjectKeyFromObject(snap), &cur)
		switch {
		case apierrors.IsNotFound(err):
			return nil, &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("snapshot %s was deleted while it was being taken", snap.Name)}
		case err == nil:
			if cur.IsReady() {
				return &cur, nil
			}
			if c := meta.FindStatusCondition(cur.Status.Conditions, string(sandboxv1alpha1.SnapshotConditionReady)); c != nil {
				last = c.Reason + ": " + c.Message
				if cur.IsFailed() {
					kind := contract.ErrInvalid
					if c.Reason == sandboxv1alpha1.SnapshotReasonQuotaExceeded {
						kind = contract.ErrQuota
					}
					return nil, &messageError{kind: kind, msg: fmt.Sprintf("snapshot %s failed: %s (the snapshot was deleted)", snap.Name, last)}
				}
			}
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &messageError{kind: contract.ErrUnavailable, msg: fmt.Sprintf(
				"snapshot %s was not stored within %s; last status: %s (the snapshot was deleted)", snap.Name, d.opts.ReadyTimeout, last)}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ownedSnapshot returns the caller's snapshot id; anything else is reported
// exactly like a snapshot that never existed.
func (d *driver) ownedSnapshot(ctx context.Context, caller contract.Caller, id string) (*sandboxv1alpha1.SandboxSnapshot, error) {
	missing := fmt.Errorf("%w: %q", contract.ErrSnapshotNotFound, id)
	if !strings.HasPrefix(id, SnapshotPrefix) || len(validation.IsDNS1123Label(id)) > 0 {
		return nil, missing
	}
	var snap sandboxv1alpha1.SandboxSnapshot
	if err := d.kube.Get(ctx, client.ObjectKey{Namespace: d.namespaceFor(caller), Name: id}, &snap); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, missing
		}
		return nil, apiError("reading snapshot "+id, err)
	}
	if snap.DeletionTimestamp != nil || snap.Labels[LabelOwner] != contract.IdentityHash(caller.ID) {
		return nil, missing
	}
	return &snap, nil
}

// Fork implements contract.SnapshotBackend: req.Count Sandboxes restored
// from the snapshot (taken first from req.ContainerID, and deleted once the
// children are Ready), each through the ordinary create path and its
// reservation. On failure none is left.
func (b *Backend) Fork(ctx context.Context, caller contract.Caller, req contract.ForkRequest) ([]contract.Sandbox, error) {
	if err := req.Check(); err != nil {
		return nil, err
	}
	d := b.driver
	ns := d.namespaceFor(caller)
	if err := d.authz.check(ctx, caller, ns, permCreate, ""); err != nil {
		return nil, err
	}
	var snap *sandboxv1alpha1.SandboxSnapshot
	var err error
	if req.ContainerID != "" {
		if err := d.authz.check(ctx, caller, ns, permSnapshotCreate, ""); err != nil {
			return nil, err
		}
		if snap, err = d.snapshot(ctx, caller, req.ContainerID); err != nil {
			return nil, err
		}
		// Only the restores read it; they are done once the children are
		// Ready (or gone).
		defer func() {
			d.deleteSnapshotQuietly(snap.Namespace, snap.Name)
			d.unreserveKind(snapshotReservations, snap.Namespace, caller, snap.Name)
		}()
	} else {
		if snap, err = d.ownedSnapshot(ctx, caller, req.SnapshotID); err != nil {
			return nil, err
		}
		if !snap.IsReady() || snap.Status.Source == nil {
			return nil, &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("snapshot %s is not stored", snap.Name)}
		}
	}
	src := snap.Status.Source
	restore := func(sbx *sandboxv1alpha1.Sandbox) {
		sbx.Spec = sandboxv1alpha1.SandboxSpec{
			Image:           src.Image,
			ImagePullPolicy: src.ImagePullPolicy,
			Command:         src.Command,
			WorkingDir:      src.WorkingDir,
			User:            src.User,
			Resources:       src.Resources,
			Network:         src.Network,
			Runtime:         src.Runtime,
			NodeName:        d.opts.NodeName,
			Lifecycle:       sbx.Spec.Lifecycle,
			SnapshotRef:     &sandboxv1alpha1.SandboxSnapshotReference{Name: snap.Name},
		}
	}
	kids := make([]*sandboxv1alpha1.Sandbox, 0, req.Count)
	cleanup := func() {
		for _, k := range kids {
			d.deleteQuietly(k.Namespace, k.Name, "fork failed")
			d.unreserve(k.Namespace, caller, k.Name)
		}
	}
	for range req.Count {
		sbx, err := d.createObject(ctx, caller, contract.CreateRequest{Image: src.Image}, restore)
		if err != nil {
			cleanup()
			return nil, err
		}
		kids = append(kids, sbx)
	}
	out := make([]contract.Sandbox, len(kids))
	errs := make([]error, len(kids))
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Go(func() {
			ready, err := d.waitReady(ctx, k)
			if err != nil {
				errs[i] = err
				return
			}
			out[i] = view(ready)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		cleanup()
		return nil, err
	}
	return out, nil
}

// ListSnapshots implements contract.SnapshotBackend.
func (b *Backend) ListSnapshots(ctx context.Context, caller contract.Caller) ([]contract.Snapshot, error) {
	d := b.driver
	ns := d.namespaceFor(caller)
	if err := d.authz.check(ctx, caller, ns, permSnapshotList, ""); err != nil {
		return nil, err
	}
	var list sandboxv1alpha1.SandboxSnapshotList
	if err := d.kube.List(ctx, &list, client.InNamespace(ns), ownerSelector(caller)); err != nil {
		return nil, apiError("listing your snapshots", err)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].CreationTimestamp.Before(&list.Items[j].CreationTimestamp)
	})
	out := make([]contract.Snapshot, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			out = append(out, snapshotView(&list.Items[i]))
		}
	}
	return out, nil
}

// DeleteSnapshot implements contract.SnapshotBackend: the manager that holds
// the data removes it before the object goes.
func (b *Backend) DeleteSnapshot(ctx context.Context, caller contract.Caller, id string) error {
	d := b.driver
	if err := d.authz.check(ctx, caller, d.namespaceFor(caller), permSnapshotDelete, id); err != nil {
		return err
	}
	snap, err := d.ownedSnapshot(ctx, caller, id)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	err = d.kube.Delete(actx, snap, client.Preconditions{UID: &snap.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return apiError("deleting snapshot "+id, err)
	}
	d.unreserveKind(snapshotReservations, snap.Namespace, caller, snap.Name)
	return nil
}

func (d *driver) deleteSnapshotQuietly(namespace, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := d.kube.Delete(ctx, &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}})
	if err != nil && !apierrors.IsNotFound(err) {
		d.log.Warn("deleting snapshot", "namespace", namespace, "snapshot", name, "error", err)
	}
}

// snapshotView is what the caller may know about its snapshot.
func snapshotView(snap *sandboxv1alpha1.SandboxSnapshot) contract.Snapshot {
	s := contract.Snapshot{
		ID:          snap.Name,
		SourceID:    snap.Spec.SandboxRef.Name,
		Network:     contract.NetworkNone,
		NanoCPUs:    sandboxv1alpha1.DefaultNanoCPUs,
		MemoryBytes: sandboxv1alpha1.DefaultMemoryBytes,
		Bytes:       snap.Status.SizeBytes,
		CreatedAt:   snap.CreationTimestamp.Time,
	}
	if t := snap.Status.TakenTime; t != nil {
		s.CreatedAt = t.Time
	}
	if src := snap.Status.Source; src != nil {
		s.Image = src.Image
		if src.Network.Mode == sandboxv1alpha1.NetworkEgress {
			s.Network = contract.NetworkEgress
		}
		if q := src.Resources.CPU; q != nil {
			s.NanoCPUs = q.MilliValue() * 1e6
		}
		if q := src.Resources.Memory; q != nil {
			s.MemoryBytes = q.Value()
		}
	}
	return s
}
