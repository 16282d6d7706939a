/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// snapshotRefField indexes Sandboxes by the SandboxSnapshot they restore,
// so that a snapshot turning Ready wakes them.
const snapshotRefField = "spec.snapshotRef.name"

// A Sandbox with spec.snapshotRef (its restore policy):
//   - is claimed, once the snapshot is Ready, by the manager of the node
//     that holds the snapshot (its status.node, which only that node's
//     manager may write) or, when the data is in the snapshot registry
//     (status.storage is a ref of this node's --snapshot-registry), by any
//     node's manager; until then every manager reports why it waits
//     (Ready=False, SnapshotNotFound or SnapshotNotReady), unbound;
//   - on the holding node, runs the snapshot's image by ID (status.imageID,
//     present there since the source ran there), never pulled; on another
//     node, runs spec.image by its pull policy and is refused
//     (RestoreFailed) unless that resolves to the same image ID;
//   - takes over an idle member of a warm pool of its namespace whose
//     template is its shape and whose container runs the snapshot's image,
//     if this node has one (claimRestoreWarm), instead of a new container;
//   - gets the snapshot's files written into its container before it is
//     Ready (SnapshotRestored=True), or reports RestoreFailed and retries.
//
// The snapshot is looked up in the Sandbox's own namespace only: the API has
// no field that could name another.

// snapshotFor returns the Sandbox's snapshot, or nil and the reason it
// cannot be used yet.
func (r *SandboxReconciler) snapshotFor(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (*sandboxv1alpha1.SandboxSnapshot, string, string, error) {
	snap := &sandboxv1alpha1.SandboxSnapshot{}
	err := r.client.Get(ctx, client.ObjectKey{Namespace: sbx.Namespace, Name: sbx.Spec.SnapshotRef.Name}, snap)
	switch {
	case apierrors.IsNotFound(err):
		return nil, sandboxv1alpha1.SandboxReasonSnapshotNotFound,
			fmt.Sprintf("SandboxSnapshot %s does not exist in namespace %s", sbx.Spec.SnapshotRef.Name, sbx.Namespace), nil
	case err != nil:
		return nil, "", "", err
	case !snap.DeletionTimestamp.IsZero():
		return nil, sandboxv1alpha1.SandboxReasonSnapshotNotFound,
			fmt.Sprintf("SandboxSnapshot %s is being deleted", snap.Name), nil
	case !snap.IsReady() || snap.Status.Node == "" || snap.Status.Source == nil || snap.Status.ImageID == "" || snap.Status.Storage == "":
		msg := "SandboxSnapshot " + snap.Name + " is not Ready"
		if c := meta.FindStatusCondition(snap.Status.Conditions, string(sandboxv1alpha1.SnapshotConditionReady)); c != nil {
			msg += " (" + c.Reason + ": " + c.Message + ")"
		}
		return nil, sandboxv1alpha1.SandboxReasonSnapshotNotReady, msg, nil
	}
	return snap, "", "", nil
}

// claimRestore claims a Sandbox with spec.snapshotRef when this node holds
// its snapshot; otherwise it reports why the Sandbox waits, or leaves it to
// the node that holds it.
func (r *SandboxReconciler) claimRestore(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (bool, ctrl.Result, error) {
	snap, reason, msg, err := r.snapshotFor(ctx, sbx)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	if snap == nil {
		cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if cond == nil || cond.Reason != reason || cond.Message != truncateMessage(msg) {
			r.setReady(sbx, metav1.ConditionFalse, reason, msg)
			if err := r.client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return false, ctrl.Result{}, fmt.Errorf("reporting %s: %w", reason, err)
			}
		}
		return false, ctrl.Result{}, nil // the snapshot watch wakes us
	}
	if !r.canRestore(snap) {
		if sbx.Spec.NodeName == r.opts.NodeName {
			// Pinned here, held there: it can never run. Say so (an
			// unbound Sandbox's manager may write a Ready that is not True).
			msg := fmt.Sprintf("spec.nodeName pins the Sandbox to node %s, but SandboxSnapshot %s is held by node %s: a restore runs only where the snapshot is", r.opts.NodeName, snap.Name, snap.Status.Node)
			if cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)); cond == nil || cond.Message != msg {
				r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonRestoreFailed, msg)
				if err := r.client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
					return false, ctrl.Result{}, fmt.Errorf("reporting RestoreFailed: %w", err)
				}
			}
		}
		return false, ctrl.Result{}, nil // the holder's manager claims it
	}
	if tried, claimed, result, err := r.claimRestoreWarm(ctx, sbx, snap); tried {
		return claimed, result, err
	}
	return r.claimNode(ctx, sbx, nil)
}

// claimRestoreWarm serves a fork from a warm pool: when a pool of the
// Sandbox's namespace has the Sandbox's shape as its template (the claim
// path's warmpool.Matches, env aside: a member is made without env, which
// then applies to every exec, as for any claimant) and an idle member on
// this node whose container runs the snapshot's image by ID, the Sandbox
// takes that member's container, as a claim of the pool would, and the
// snapshot's files are written into it before Ready (restoreFiles), as
// into a new container. The member is fresh: its own hostname (the
// member's name) and machine-id, no process of the snapshot's source. tried
// is false when no member fits; the caller then claims cold.
func (r *SandboxReconciler) claimRestoreWarm(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, snap *sandboxv1alpha1.SandboxSnapshot) (tried, claimed bool, result ctrl.Result, err error) {
	if mismatch(sbx, snap) != "" {
		return false, false, ctrl.Result{}, nil // refused on the cold path, with the reason
	}
	var pools sandboxv1alpha1.SandboxWarmPoolList
	if err := r.client.List(ctx, &pools, client.InNamespace(sbx.Namespace)); err != nil {
		return true, false, ctrl.Result{}, fmt.Errorf("listing the warm pools of namespace %s: %w", sbx.Namespace, err)
	}
	shape := sbx.Spec.DeepCopy()
	shape.Env = nil
	sort.Slice(pools.Items, func(i, j int) bool { return pools.Items[i].Name < pools.Items[j].Name })
	r.claims.mu.Lock()
	for i := range pools.Items {
		pool := &pools.Items[i]
		if !pool.DeletionTimestamp.IsZero() || !warmpool.Matches(shape, pool.Spec.Template) {
			continue
		}
		hash := warmpool.Hash(pool.Spec.Template)
		member, _, err := r.idleMember(ctx, pool, hash)
		if err != nil {
			r.claims.mu.Unlock()
			return true, false, ctrl.Result{}, err
		}
		if member == nil {
			continue
		}
		// The template names the image by tag; the snapshot was taken of
		// one image ID. A member made before the tag moved is not used.
		ct, err := r.docker.Find(ctx, string(member.UID))
		if err != nil || ct.ID != member.Status.ContainerID || ct.ImageID != snap.Status.ImageID {
			continue
		}
		template := pool.Spec.Template.DeepCopy()
		record := func(s, m *sandboxv1alpha1.Sandbox) metav1.Condition {
			s.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{TemplateHash: hash, Template: template,
				Member: &sandboxv1alpha1.WarmPoolMemberReference{Name: m.Name, UID: m.UID}}
			s.Status.ContainerID = m.Status.ContainerID
			claim := metav1.Condition{Type: string(sandboxv1alpha1.SandboxConditionWarmPoolClaim), ObservedGeneration: s.Generation,
				Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.SandboxReasonWarmPoolClaimed,
				Message: fmt.Sprintf("took over idle member %s of warm pool %s for the fork from SandboxSnapshot %s", m.Name, pool.Name, snap.Name)}
			meta.SetStatusCondition(&s.Status.Conditions, claim)
			return claim
		}
		claimed, result, err := r.takeMember(ctx, sbx, pool, member, record, false) // releases r.claims.mu
		return true, claimed, result, err
	}
	r.claims.mu.Unlock()
	return false, false, ctrl.Result{}, nil
}

// canRestore says whether this node can restore snap: it holds it, or its
// data is in this node's snapshot registry.
func (r *SandboxReconciler) canRestore(snap *sandboxv1alpha1.SandboxSnapshot) bool {
	if r.opts.Snapshots == nil {
		return false
	}
	return snap.Status.Node == r.opts.NodeName || r.opts.Snapshots.Shared(snap.Status.Storage)
}

// notHeld says why this node cannot restore snap.
func (r *SandboxReconciler) notHeld(snap *sandboxv1alpha1.SandboxSnapshot) string {
	return fmt.Sprintf("SandboxSnapshot %s is held by node %s, not by %s, and is not in this node's snapshot registry", snap.Name, snap.Status.Node, r.opts.NodeName)
}

// restoreSpec points a restored Sandbox's container spec at the snapshot's
// image by digest, or says why it cannot be restored.
func (r *SandboxReconciler) restoreSpec(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, spec *dockerruntime.Spec) (string, error) {
	snap, _, msg, err := r.snapshotFor(ctx, sbx)
	if err != nil {
		return "", err
	}
	if snap == nil {
		return msg, nil
	}
	if !r.canRestore(snap) {
		return r.notHeld(snap), nil
	}
	if why := mismatch(sbx, snap); why != "" {
		return why, nil
	}
	if snap.Status.Node != r.opts.NodeName {
		// Another node's image store: run spec.image as the Sandbox says;
		// restoreFiles refuses it unless it is the snapshot's image.
		return "", nil
	}
	spec.Image = snap.Status.ImageID
	spec.PullPolicy = dockerruntime.PullPolicy(sandboxv1alpha1.PullNever)
	return "", nil
}

// mismatch says why sbx cannot take snap's files: the files belong to the
// source's working directory, and the image by digest must be the one spec
// names, so that what runs is what the Sandbox (and its quota) says.
func mismatch(sbx *sandboxv1alpha1.Sandbox, snap *sandboxv1alpha1.SandboxSnapshot) string {
	src := snap.Status.Source
	workdir := sbx.Spec.WorkingDir
	if workdir == "" {
		workdir = sandboxv1alpha1.DefaultWorkingDir
	}
	if sbx.Spec.Image != src.Image {
		return fmt.Sprintf("spec.image %q differs from the image %q of SandboxSnapshot %s's source", sbx.Spec.Image, src.Image, snap.Name)
	}
	if workdir != src.WorkingDir {
		return fmt.Sprintf("spec.workingDir %q differs from the working directory %q of SandboxSnapshot %s's source", workdir, src.WorkingDir, snap.Name)
	}
	return ""
}

// restoreFiles writes the snapshot's files into the running container once;
// it returns false while the Sandbox must not be Ready.
func (r *SandboxReconciler) restoreFiles(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) (bool, ctrl.Result) {
	if sbx.Spec.SnapshotRef == nil || meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionSnapshotRestored)) {
		return true, ctrl.Result{}
	}
	fail := func(msg string) (bool, ctrl.Result) {
		r.setRestored(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonRestoreFailed, msg)
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonRestoreFailed, msg)
		return false, ctrl.Result{RequeueAfter: r.backoff.next(sbx.UID)}
	}
	if !ct.State.Running || ct.State.Paused {
		return fail("the container is not running; the files are restored once it runs")
	}
	snap, _, msg, err := r.snapshotFor(ctx, sbx)
	if err != nil {
		return fail(err.Error())
	}
	if snap == nil {
		return fail(msg)
	}
	if !r.canRestore(snap) {
		return fail(r.notHeld(snap))
	}
	if why := mismatch(sbx, snap); why != "" {
		return fail(why)
	}
	if ct.ImageID != snap.Status.ImageID {
		return fail(fmt.Sprintf("the container runs image %s, but SandboxSnapshot %s was taken of image %s: spec.image %q resolves to another image on node %s",
			ct.ImageID, snap.Name, snap.Status.ImageID, sbx.Spec.Image, r.opts.NodeName))
	}
	disk := sandboxv1alpha1.DefaultDiskBytes
	if d := sbx.Spec.Resources.Disk; d != nil {
		disk = d.Value()
	}
	start := r.clock.Now()
	open, cleanup, err := spoolSnapshot(ctx, r.opts.Snapshots, snap.Status.Storage, r.opts.SnapshotSpoolDir)
	if err != nil {
		return fail(fmt.Sprintf("reading SandboxSnapshot %s: %v", snap.Name, err))
	}
	defer cleanup()
	limits := execio.UploadLimits{MaxBytes: disk * snapshotRootsPerSandbox}
	stats, err := r.docker.Restore(ctx, ct.ID, dockerruntime.SnapshotRoots(snap.Status.Source.WorkingDir), open, limits)
	if err != nil {
		return fail(fmt.Sprintf("restoring SandboxSnapshot %s: %v", snap.Name, err))
	}
	ObserveRestore(storageKind(r.opts.Snapshots, snap.Status.Storage), r.clock.Since(start))
	msg = fmt.Sprintf("restored %d files, %d directories, %d bytes from SandboxSnapshot %s", stats.Files, stats.Dirs, stats.Bytes, snap.Name)
	r.setRestored(sbx, metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonSnapshotRestored, msg)
	r.recorder.Eventf(sbx, nil, "Normal", sandboxv1alpha1.SandboxReasonSnapshotRestored, "Restore", "%s", msg)
	return true, ctrl.Result{}
}

func (r *SandboxReconciler) setRestored(sbx *sandboxv1alpha1.Sandbox, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1alpha1.SandboxConditionSnapshotRestored), Status: status, Reason: reason,
		Message: truncateMessage(msg), ObservedGeneration: sbx.Generation,
	})
}

// sandboxesRestoring maps a SandboxSnapshot to the Sandboxes of its
// namespace that restore from it.
func (r *SandboxReconciler) sandboxesRestoring() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		var list sandboxv1alpha1.SandboxList
		if err := r.client.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{snapshotRefField: obj.GetName()}); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return out
	})
}
