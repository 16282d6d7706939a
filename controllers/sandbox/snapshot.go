/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// snapshotSourceField indexes SandboxSnapshots by the Sandbox they are taken
// from, so that a change of that Sandbox (it became Ready) wakes them.
const snapshotSourceField = "spec.sandboxRef.name"

// snapshotRootsPerSandbox is how many writable paths a snapshot holds (the
// working directory, /tmp, /var/tmp): each is bounded by resources.disk, so
// a snapshot is bounded by this many times it.
const snapshotRootsPerSandbox = 3

// SnapshotReconciler takes the SandboxSnapshots of the Sandboxes bound to
// this node and removes their data when they are deleted.
//
// Which manager acts: before a snapshot is taken, the one whose node the
// source Sandbox's status.nodeName names (only that node's manager can have
// written it: config/policy/sandbox_status_policy.yaml); afterwards, the one
// its own status.node names (only that node's manager may have written it:
// config/policy/snapshot_status_policy.yaml). Nothing in the spec, which the
// user writes, decides it, nor where the data goes: the store's key is the
// snapshot's UID, which the API server assigns.
type SnapshotReconciler struct {
	client   client.Client
	docker   Runtime
	store    SnapshotStore
	recorder events.EventRecorder
	clock    clock.PassiveClock
	node     string
}

// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxsnapshots,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxsnapshots/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxsnapshots/finalizers,verbs=update
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxquotas,verbs=get;list;watch

// NewSnapshotReconciler builds the snapshot reconciler of one node.
func NewSnapshotReconciler(c client.Client, docker Runtime, store SnapshotStore, recorder events.EventRecorder, clk clock.PassiveClock, node string) (*SnapshotReconciler, error) {
	if node == "" || store == nil {
		return nil, errors.New("a node name and a snapshot store are required")
	}
	return &SnapshotReconciler{client: c, docker: docker, store: store, recorder: recorder, clock: clk, node: node}, nil
}

// Reconcile has the Sandbox reconciler's shape: get; deletion; a private
// reconcile that fills in the status in memory; one status write; Events
// after it.
func (r *SnapshotReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	snap := &sandboxv1alpha1.SandboxSnapshot{}
	if err := r.client.Get(ctx, req.NamespacedName, snap); err != nil {
		// Gone: its finalizer saw its data removed first.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !snap.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, snap)
	}
	if snap.Status.Node != "" && snap.Status.Node != r.node {
		return ctrl.Result{}, nil
	}
	old := snap.Status.DeepCopy()
	result, event, err := r.reconcile(ctx, snap)
	if !equality.Semantic.DeepEqual(old, &snap.Status) {
		if werr := r.client.Status().Update(ctx, snap); werr != nil {
			if old.Storage == "" && snap.Status.Storage != "" {
				// The data was stored but its ref not recorded: remove it
				// now, or nothing would; the next reconcile takes it again.
				if derr := r.store.Delete(ctx, snap.Status.Storage); derr != nil {
					werr = errors.Join(werr, fmt.Errorf("removing unrecorded data %s: %w", snap.Status.Storage, derr))
				}
			}
			if apierrors.IsConflict(werr) || apierrors.IsNotFound(werr) {
				return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
			}
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("writing status: %w", werr))
		}
		if event != nil {
			r.recorder.Eventf(snap, nil, event.kind, event.reason, "Snapshot", "%s", event.message)
		}
	}
	return result, err
}

type snapshotEvent struct{ kind, reason, message string }

// reconcile decides and acts; it writes nothing but the finalizer, which
// must be stored before any data is.
func (r *SnapshotReconciler) reconcile(ctx context.Context, snap *sandboxv1alpha1.SandboxSnapshot) (ctrl.Result, *snapshotEvent, error) {
	if snap.IsReady() || snap.IsFailed() {
		return ctrl.Result{}, nil, nil // settled
	}
	sbx := &sandboxv1alpha1.Sandbox{}
	err := r.client.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: snap.Spec.SandboxRef.Name}, sbx)
	switch {
	case apierrors.IsNotFound(err):
		if snap.Status.Node == r.node {
			// It was being taken here and its source went away.
			r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonSourceGone,
				"Sandbox "+snap.Spec.SandboxRef.Name+" was deleted before the snapshot was taken")
			return ctrl.Result{}, &snapshotEvent{"Warning", sandboxv1alpha1.SnapshotReasonSourceGone, "source Sandbox deleted"}, nil
		}
		// Not bound anywhere yet; whichever node runs it acts once it exists.
		return ctrl.Result{}, nil, nil
	case err != nil:
		return ctrl.Result{}, nil, err
	}
	if sbx.Status.NodeName != r.node {
		return ctrl.Result{}, nil, nil // another node's, or not bound yet
	}
	if snap.Status.Node == "" {
		// Claim it for this node first: from now on only this node's
		// manager may write its status, and a deletion finds the node that
		// may hold data.
		snap.Status.Node = r.node
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonPending, "waiting for Sandbox "+sbx.Name+" to be Ready")
		return ctrl.Result{RequeueAfter: 50 * time.Millisecond}, nil, nil
	}
	if snap.Status.SourceUID != "" && snap.Status.SourceUID != string(sbx.UID) {
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonSourceGone,
			"Sandbox "+sbx.Name+" was replaced by another of the same name before the snapshot was taken")
		return ctrl.Result{}, nil, nil
	}
	snap.Status.SourceUID = string(sbx.UID)
	if sbx.IsNodeLost() || meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)) || !sbx.DeletionTimestamp.IsZero() {
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonSourceGone, "Sandbox "+sbx.Name+" no longer runs")
		return ctrl.Result{}, nil, nil
	}
	if !meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonPending, "waiting for Sandbox "+sbx.Name+" to be Ready")
		return ctrl.Result{}, nil, nil // the Sandbox watch wakes us
	}
	if base := snap.DeepCopy(); controllerutil.AddFinalizer(snap, sandboxv1alpha1.FinalizerSnapshotData) {
		if err := r.client.Patch(ctx, snap, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, nil, ignoreConflict(fmt.Errorf("adding finalizer: %w", err))
		}
	}
	return r.take(ctx, snap, sbx)
}

// take reads the source's files into the store.
func (r *SnapshotReconciler) take(ctx context.Context, snap *sandboxv1alpha1.SandboxSnapshot, sbx *sandboxv1alpha1.Sandbox) (ctrl.Result, *snapshotEvent, error) {
	spec, ok := warmpool.Effective(sbx)
	if !ok {
		return ctrl.Result{}, nil, fmt.Errorf("sandbox %s has no recorded warm pool template", sbx.Name)
	}
	ct, err := r.docker.Find(ctx, string(sbx.ContainerUID()))
	if err != nil {
		return r.failed(snap, fmt.Errorf("finding the container of Sandbox %s: %w", sbx.Name, err))
	}
	if !ct.State.Running || ct.State.Paused {
		// A frozen sandbox cannot run the helper; wait until it thaws.
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonPending, "waiting for Sandbox "+sbx.Name+" to run (it is paused or stopped)")
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil, nil
	}
	disk := sandboxv1alpha1.DefaultDiskBytes
	if spec.Resources.Disk != nil {
		disk = spec.Resources.Disk.Value()
	}
	workdir := spec.WorkingDir
	if workdir == "" {
		workdir = sandboxv1alpha1.DefaultWorkingDir
	}
	maxBytes := disk * snapshotRootsPerSandbox
	start := r.clock.Now()
	ref, size, err := putSnapshot(ctx, r.store, snapshotKey(snap.Namespace, string(snap.UID)), func(w io.Writer) error {
		_, err := r.docker.Snapshot(ctx, ct.ID, dockerruntime.SnapshotRoots(workdir), w, maxBytes)
		return err
	})
	if errors.Is(err, execio.ErrTooLarge) || errors.Is(err, snapshotstore.ErrTooLarge) {
		msg := fmt.Sprintf("the files of Sandbox %s are larger than %d bytes (%d writable paths of resources.disk); nothing was kept", sbx.Name, maxBytes, snapshotRootsPerSandbox)
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonTooLarge, msg)
		return ctrl.Result{}, &snapshotEvent{"Warning", sandboxv1alpha1.SnapshotReasonTooLarge, msg}, nil
	}
	if err != nil {
		return r.failed(snap, err)
	}
	if why, err := r.overQuota(ctx, snap, size); err != nil || why != "" {
		if err == nil {
			err = r.store.Delete(ctx, ref)
		}
		if err != nil {
			// Not settled: the data may still be there; try again.
			return r.failed(snap, fmt.Errorf("checking the snapshot quota: %w", err))
		}
		msg := why + "; the snapshot's data was removed"
		r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonQuotaExceeded, msg)
		return ctrl.Result{}, &snapshotEvent{"Warning", sandboxv1alpha1.SnapshotReasonQuotaExceeded, msg}, nil
	}
	now := metav1.NewTime(r.clock.Now())
	tpl := sandboxv1alpha1.SandboxTemplate{
		Image: spec.Image, ImagePullPolicy: spec.ImagePullPolicy, Command: spec.Command, WorkingDir: workdir,
		User: spec.User, Resources: spec.Resources, Network: spec.Network, Runtime: spec.Runtime,
	}
	snap.Status.Source = &tpl
	snap.Status.ImageID = ct.ImageID
	snap.Status.SizeBytes = size
	snap.Status.TakenTime = &now
	snap.Status.Storage = ref
	took := r.clock.Since(start)
	ObserveSnapshot(storageKind(r.store, ref), took)
	where := "on node " + r.node
	if r.store.Shared(ref) {
		where = "in the snapshot registry by node " + r.node
	}
	msg := fmt.Sprintf("%d bytes of Sandbox %s stored %s in %s", size, sbx.Name, where, took.Round(time.Millisecond))
	r.setReady(snap, metav1.ConditionTrue, sandboxv1alpha1.SnapshotReasonStored, msg)
	return ctrl.Result{}, &snapshotEvent{"Normal", sandboxv1alpha1.SnapshotReasonStored, msg}, nil
}

// overQuota says why a stored snapshot of size bytes exceeds a SandboxQuota
// of its namespace (spec.hard.snapshotBytes), or "". Two snapshots whose
// sizes become known at the same moment on two nodes may both fit where
// only one should: the bytes cap is checked, not reserved.
func (r *SnapshotReconciler) overQuota(ctx context.Context, snap *sandboxv1alpha1.SandboxSnapshot, size int64) (string, error) {
	var quotas sandboxv1alpha1.SandboxQuotaList
	if err := r.client.List(ctx, &quotas, client.InNamespace(snap.Namespace)); err != nil {
		return "", err
	}
	var used *quota.SnapshotUsage
	for i := range quotas.Items {
		q := &quotas.Items[i]
		if q.Spec.Hard.SnapshotBytes == nil {
			continue
		}
		if used == nil {
			var snaps sandboxv1alpha1.SandboxSnapshotList
			if err := r.client.List(ctx, &snaps, client.InNamespace(snap.Namespace)); err != nil {
				return "", err
			}
			u := quota.CountSnapshots(snaps.Items, snap.UID)
			used = &u
		}
		if why := quota.SnapshotBytesExceeded(q, *used, size); why != "" {
			return why, nil
		}
	}
	return "", nil
}

func (r *SnapshotReconciler) failed(snap *sandboxv1alpha1.SandboxSnapshot, err error) (ctrl.Result, *snapshotEvent, error) {
	r.setReady(snap, metav1.ConditionFalse, sandboxv1alpha1.SnapshotReasonFailed, err.Error())
	// The returned error gives the controller's exponential backoff.
	return ctrl.Result{}, &snapshotEvent{"Warning", sandboxv1alpha1.SnapshotReasonFailed, truncateMessage(err.Error())}, err
}

// finalize removes the data of a deleted snapshot, then its finalizer.
func (r *SnapshotReconciler) finalize(ctx context.Context, snap *sandboxv1alpha1.SandboxSnapshot) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(snap, sandboxv1alpha1.FinalizerSnapshotData) {
		return ctrl.Result{}, nil
	}
	ref := snap.Status.Storage
	shared := ref != "" && r.store.Shared(ref)
	if snap.Status.Node != r.node && !shared {
		// Never claimed here, and not in a registry this node reaches: the
		// node that claimed it holds its data.
		return ctrl.Result{}, nil
	}
	if ref != "" {
		if err := r.store.Delete(ctx, ref); err != nil && !errors.Is(err, snapshotstore.ErrInvalidRef) {
			return ctrl.Result{}, fmt.Errorf("removing the data of snapshot %s/%s: %w", snap.Namespace, snap.Name, err)
		} else if err != nil {
			// Not a ref of this node's stores (written by an older
			// manager): nothing here can be removed for it.
			r.recorder.Eventf(snap, nil, "Warning", "DataNotRemoved", "Delete", "%s", truncateMessage(err.Error()))
		}
	}
	base := snap.DeepCopy()
	controllerutil.RemoveFinalizer(snap, sandboxv1alpha1.FinalizerSnapshotData)
	if err := r.client.Patch(ctx, snap, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, ignoreConflict(fmt.Errorf("removing finalizer: %w", err))
	}
	r.recorder.Eventf(snap, nil, "Normal", "DataRemoved", "Delete", "snapshot data removed by node %s", r.node)
	return ctrl.Result{}, nil
}

func (r *SnapshotReconciler) setReady(snap *sandboxv1alpha1.SandboxSnapshot, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&snap.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1alpha1.SnapshotConditionReady), Status: status, Reason: reason,
		Message: truncateMessage(message), ObservedGeneration: snap.Generation,
	})
}

// SetupWithManager registers the controller: SandboxSnapshots, and the
// Sandboxes they are taken from.
func (r *SnapshotReconciler) SetupWithManager(mgr ctrl.Manager, skipNameValidation bool) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &sandboxv1alpha1.SandboxSnapshot{}, snapshotSourceField,
		func(obj client.Object) []string {
			return []string{obj.(*sandboxv1alpha1.SandboxSnapshot).Spec.SandboxRef.Name}
		}); err != nil {
		return fmt.Errorf("indexing snapshots by source: %w", err)
	}
	bySource := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		if obj.(*sandboxv1alpha1.Sandbox).Status.NodeName != r.node {
			return nil
		}
		var list sandboxv1alpha1.SandboxSnapshotList
		if err := r.client.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{snapshotSourceField: obj.GetName()}); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.SandboxSnapshot{}).
		Watches(&sandboxv1alpha1.Sandbox{}, bySource).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: &skipNameValidation}).
		Named("sandboxsnapshot").
		Complete(r)
}
