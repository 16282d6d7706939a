/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package sandbox holds the Sandbox reconciler, which runs on every node
// and turns Sandboxes bound to that node into hardened Docker containers.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// Finalizer keeps a Sandbox until its container is proven gone. Docker
// containers are not Kubernetes objects, so garbage collection cannot remove
// them.
const Finalizer = sandboxv1alpha1.FinalizerContainer

// statusNodeNameField indexes Sandboxes by the node that claimed them.
const statusNodeNameField = "status.nodeName"

// Options configure a SandboxReconciler.
type Options struct {
	// NodeName is the node this manager runs on. Required.
	NodeName string
	// MaxSandboxes is how many Sandboxes this node runs at once.
	MaxSandboxes int
	// StopGracePeriod is the time between SIGTERM and SIGKILL on delete;
	// zero means sandboxv1alpha1.DefaultStopGracePeriod.
	StopGracePeriod time.Duration
	// MaxConcurrentReconciles bounds parallel reconciles (and Docker calls).
	MaxConcurrentReconciles int
	// RetryBackoffBase and RetryBackoffMax shape the backoff used to recreate
	// missing containers and to retry image and runtime failures.
	RetryBackoffBase time.Duration
	RetryBackoffMax  time.Duration
	// SkipNameValidation lets several managers run in one process (tests).
	SkipNameValidation bool
	// NodeAPIEndpoint ("https://HOST:PORT") is published in the status of
	// every running Sandbox of this node, so that the aggregated API server
	// finds the node API. Empty when the node API is off.
	NodeAPIEndpoint string
	// History, when set, loses a Sandbox's exec history once its container
	// is gone for good.
	History HistoryDeleter
	// LiveNodes, when set, lists the nodes whose manager is running (their
	// Leases, internal/nodelease), so that warm pool members spread over
	// them (spread.go). Unset, members go to whichever manager claims first.
	LiveNodes func(context.Context) ([]string, error)
	// Activity is the record of exec, file transfer and log read activity
	// that the node API keeps (nodeapi.Config.Activity) and spec.lifecycle's
	// idle timeouts act on (idle.go). Unset, the reconciler keeps its own,
	// which only its status and clock feed.
	Activity *Activity
	// Snapshots, when set, is where this node keeps SandboxSnapshots'
	// files (snapshot.go) and restores spec.snapshotRef from (restore.go).
	// Unset, this node takes no snapshots and claims no Sandbox that
	// restores one.
	Snapshots SnapshotStore
	// EgressProxy, when set, is the node's egress proxy, which enforces
	// spec.network.egress (egresspolicy.go). Unset, Sandboxes with an
	// egress policy are not created on this node (Ready=False, reason
	// EgressProxyUnavailable): they must never run unrestricted.
	EgressProxy EgressProxy
	// SnapshotSpoolDir holds a registry snapshot's tar while it is
	// restored (0600 files, removed after; default os.TempDir(), which the
	// manager's read-only root file system does not allow: give a
	// directory under --state-dir).
	SnapshotSpoolDir string
}

// HistoryDeleter forgets the exec history of one Sandbox, keyed by its UID.
// *history.Store implements it.
type HistoryDeleter interface {
	Delete(key string) error
}

func (o *Options) defaults() {
	if o.MaxSandboxes <= 0 {
		o.MaxSandboxes = 50
	}
	if o.StopGracePeriod <= 0 {
		o.StopGracePeriod = sandboxv1alpha1.DefaultStopGracePeriod
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = 4
	}
	if o.RetryBackoffBase <= 0 {
		o.RetryBackoffBase = time.Second
	}
	if o.RetryBackoffMax <= 0 {
		o.RetryBackoffMax = 5 * time.Minute
	}
}

// SandboxReconciler reconciles the Sandboxes bound to one node.
type SandboxReconciler struct {
	client    client.Client
	apiReader client.Reader
	docker    Runtime
	recorder  events.EventRecorder
	clock     clock.PassiveClock
	opts      Options

	claims  *claimTracker
	members *memberClaims
	backoff *backoffTracker
	spread  *spreadTracker
	// deleted holds the UIDs of deleted Sandboxes not yet cleaned up after.
	deleted *deletedTracker
	// egressEvents rate-limits EgressAudit's Events.
	egressEvents egressEventLimiter
	// activity is the node API's record of use, for the idle policy.
	activity *Activity
	// dockerEvents carries Docker container events into the work queue.
	dockerEvents chan eventGeneric
	// egress maps containers to their egress bridge addresses, whose
	// policies the proxy holds (egresspolicy.go).
	egress *egressTable
}

// A manager deletes a Sandbox of its own node when spec.lifecycle says so
// (idle.go); config/policy/sandbox_manager_policy.yaml confines that.
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes/finalizers,verbs=update
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxwarmpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update

// NewSandboxReconciler builds a reconciler for one node. The runtime is
// normally a *dockerruntime.Client; the clock is injectable so that lifetimes
// and backoff can be tested without sleeping.
func NewSandboxReconciler(c client.Client, apiReader client.Reader, docker Runtime, recorder events.EventRecorder, clk clock.PassiveClock, opts Options) (*SandboxReconciler, error) {
	if opts.NodeName == "" {
		return nil, errors.New("a node name is required (--node-name or NODE_NAME)")
	}
	opts.defaults()
	if opts.Activity == nil {
		opts.Activity = NewActivity(clk)
	}
	r := &SandboxReconciler{
		client:       c,
		apiReader:    apiReader,
		docker:       docker,
		recorder:     recorder,
		clock:        clk,
		opts:         opts,
		claims:       newClaimTracker(),
		members:      newMemberClaims(),
		backoff:      newBackoffTracker(clk, opts.RetryBackoffBase, opts.RetryBackoffMax),
		spread:       newSpreadTracker(),
		deleted:      newDeletedTracker(),
		activity:     opts.Activity,
		dockerEvents: make(chan eventGeneric, 1024),
		egress:       newEgressTable(),
	}
	r.activity.thaw = docker.BeginUnpause
	r.activity.notify = r.enqueue
	return r, nil
}

// Reconcile brings one Sandbox's container in line with its spec. Its shape
// is kubernetes-sigs/jobset's: get the Sandbox (a vanished one only has its
// containers removed), claim it, finalize it if deleted, then let reconcile
// drive the container and fill in the status in memory, and write the status
// once at the end, when it changed; Events follow that write (writeStatus).
func (r *SandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// Deletions first: a Sandbox deleted without finalize (its finalizer
	// stripped by hand) frees quota at once, so its container must go at
	// once too, not at the next orphan sweep.
	deleted := r.deleted.take(req.NamespacedName)
	for _, uid := range deleted {
		r.claims.releaseUID(req.NamespacedName, uid)
	}
	sbx := &sandboxv1alpha1.Sandbox{}
	if err := r.client.Get(ctx, req.NamespacedName, sbx); err != nil {
		if !apierrors.IsNotFound(err) {
			r.deleted.add(req.NamespacedName, deleted...)
			return ctrl.Result{}, err
		}
		r.claims.release(req.NamespacedName)
		r.members.releaseClaimant(req.NamespacedName)
		for _, uid := range deleted {
			r.members.forgetSeen(uid)
			r.activity.forget(uid)
		}
		// Gone: remove whatever this node still runs for that name. Also
		// reached from a Docker event of a container whose Sandbox is gone.
		return ctrl.Result{}, r.removeVanished(ctx, req.NamespacedName, deleted)
	}
	if len(deleted) > 0 {
		// Deleted and already re-created under the same name: the old
		// UID's container goes, the new one's stays.
		if err := r.removeVanished(ctx, req.NamespacedName, deleted); err != nil {
			return ctrl.Result{}, err
		}
	}
	log := logf.FromContext(ctx).WithValues("node", r.opts.NodeName, "uid", sbx.UID)
	ctx = logf.IntoContext(ctx, log)

	if sbx.Status.NodeName != r.opts.NodeName {
		if !sbx.DeletionTimestamp.IsZero() || sbx.Status.NodeName != "" {
			// Bound elsewhere, or deleted before anyone claimed it (then no
			// finalizer was ever added and nothing exists to clean up).
			r.members.forgetSeen(sbx.UID)
			return ctrl.Result{}, nil
		}
		claimed, result, err := r.claim(ctx, sbx)
		if !claimed || err != nil {
			return result, err
		}
		// The cache held it without command and env (CacheOptions).
		if err := r.fillStripped(ctx, sbx); err != nil {
			return ctrl.Result{}, err
		}
	}

	if sbx.IsNodeLost() {
		return r.settleNodeLost(ctx, sbx)
	}
	if !sbx.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, sbx)
	}

	if base := sbx.DeepCopy(); controllerutil.AddFinalizer(sbx, Finalizer) {
		// The finalizer must be stored before any container exists, or a
		// quick delete could leave the container behind. A patch of the
		// finalizers alone, not an update of the whole object: the Go
		// client normalises quantities ("0.5" becomes "500m") and drops
		// empty env values, which the CRD's immutability rules would see
		// as a spec change, and the manager policy allows managers to
		// change finalizers only.
		if err := r.client.Patch(ctx, sbx, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) {
				r.claims.release(req.NamespacedName)
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, ignoreConflict(fmt.Errorf("adding finalizer: %w", err))
		}
	}

	oldStatus := sbx.Status.DeepCopy()
	result, reconcileErr := r.reconcile(ctx, sbx)
	// One status write per reconcile, when anything changed.
	if err := r.writeStatus(ctx, sbx, oldStatus); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		if apierrors.IsNotFound(err) {
			// Deleted while we worked; its finalizer path is done.
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, errors.Join(reconcileErr, fmt.Errorf("writing status: %w", err))
	}
	// After the status write, which holds the last activity: a Sandbox
	// that spec.lifecycle ends deletes itself.
	if why := r.endingReason(sbx); why != "" && reconcileErr == nil {
		return r.selfDelete(ctx, sbx, why)
	}
	return result, reconcileErr
}

// writeStatus stores sbx.Status if it differs from old, and only once the
// write succeeded emits the Event for a change of the Ready reason: an
// Event must never announce a state that the API server does not hold.
func (r *SandboxReconciler) writeStatus(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, old *sandboxv1alpha1.SandboxStatus) error {
	if equality.Semantic.DeepEqual(old, &sbx.Status) {
		return nil
	}
	if err := r.client.Status().Update(ctx, sbx); err != nil {
		return err
	}
	r.recordTransition(sbx, old)
	r.recordIdleTransition(sbx, old)
	return nil
}

// reconcile drives the container and fills in sbx.Status. It never writes
// to the API server; Reconcile does that once.
func (r *SandboxReconciler) reconcile(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	sbx.Status.NodeName = r.opts.NodeName
	sbx.Status.ObservedGeneration = sbx.Generation

	role, err := r.poolRoleOf(ctx, sbx)
	if err != nil {
		return ctrl.Result{}, err
	}
	switch role.kind {
	case memberBeingClaimed:
		// Its container is being thawed for a claimant whose claim is not
		// written yet. Whether it stays a member or becomes the claimant's
		// is known in a moment.
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	case claimedMember:
		return r.settleClaimedMember(sbx, role.claimant, role.claimantKnown), nil
	}
	if meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)) {
		// Expired is final; make sure nothing was left running.
		return r.removeContainers(ctx, sbx)
	}

	var requeueAfter time.Duration
	if expiry, ok := expiryTime(sbx); ok {
		if remaining := expiry.Sub(r.clock.Now()); remaining > 0 {
			requeueAfter = remaining
		} else {
			return r.expire(ctx, sbx)
		}
	}

	ct, err := r.docker.Find(ctx, string(sbx.ContainerUID()))
	switch {
	case err == nil:
	case errors.Is(err, dockerruntime.ErrNotFound):
		if sbx.Status.ContainerID != "" && role.kind == poolMember {
			return r.memberContainerMissing(sbx), nil
		}
		if sbx.Status.ContainerID != "" {
			// It existed and is gone: someone removed it behind our back.
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonContainerMissing,
				fmt.Sprintf("container %s disappeared; recreating with backoff", dockerruntime.ShortID(sbx.Status.ContainerID)))
			sbx.Status.ContainerID = ""
			delay := r.backoff.next(sbx.UID)
			log.Info("container missing, recreating", "after", delay)
			return ctrl.Result{RequeueAfter: delay}, nil
		}
		if wait := r.backoff.remaining(sbx.UID); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		return r.create(ctx, sbx, role, requeueAfter)
	default:
		return r.dockerFailure(ctx, sbx, err)
	}

	if role.kind == poolClaimant {
		if err := r.verifyMemberContainer(sbx, ct); err != nil {
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonWarmPoolMemberInvalid, err.Error())
			log.Error(err, "refusing to adopt a container")
			return ctrl.Result{}, nil
		}
	}
	sbx.Status.ContainerID = ct.ID
	switch ct.State.Status {
	case "running", "paused":
		if ok, result := r.restoreFiles(ctx, sbx, ct); !ok {
			return withEgress(result, r.applyEgress(ctx, sbx, ct)), nil
		}
		res, err := r.settlePaused(ctx, sbx, ct, role, requeueAfter)
		return withEgress(res, r.applyEgress(ctx, sbx, ct)), err
	case "created":
		// A manager died between create and start; adopt and start it.
		log.Info("starting adopted container", "container", dockerruntime.ShortID(ct.ID))
		if err := r.docker.Start(ctx, ct.ID); err != nil {
			return r.dockerFailure(ctx, sbx, err)
		}
		return ctrl.Result{RequeueAfter: 50 * time.Millisecond}, nil
	case "exited", "dead":
		if ct.State.OOMKilled {
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonOOMKilled,
				fmt.Sprintf("container was killed for exceeding its memory limit of %s", memoryLimit(sbx)))
		} else {
			msg := fmt.Sprintf("container exited with code %d", ct.State.ExitCode)
			if ct.State.Error != "" {
				msg += ": " + ct.State.Error
			}
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonContainerExited, msg)
		}
		r.forgetEgress(ctx, ct.ID)
		// Sandboxes are not restarted in place: the agent's state is gone.
		// Nobody can use it any more, so an idle timeout still ends it.
		if role.kind == poolMember {
			return ctrl.Result{RequeueAfter: requeueAfter}, nil
		}
		return r.applyIdle(ctx, sbx, nil, ctrl.Result{RequeueAfter: requeueAfter})
	default:
		// restarting or removing: transient; look again shortly.
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning, "container is "+ct.State.Status)
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
}

// create provisions the container and reports why it could not.
func (r *SandboxReconciler) create(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, role poolRole, requeueAfter time.Duration) (ctrl.Result, error) {
	spec, err := dockerSpecFor(sbx, r.opts)
	if err != nil {
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonCreateFailed, err.Error())
		return ctrl.Result{}, nil
	}
	if needsEgressProxy(sbx) && r.opts.EgressProxy == nil {
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonEgressProxyUnavailable,
			"spec.network.egress needs the node's egress proxy, which this node's manager does not run; the sandbox is not created rather than given unrestricted egress")
		return ctrl.Result{}, nil
	}
	if sbx.Spec.SnapshotRef != nil {
		why, err := r.restoreSpec(ctx, sbx, &spec)
		if err != nil {
			return ctrl.Result{}, err
		}
		if why != "" {
			r.setRestored(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonRestoreFailed, why)
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonRestoreFailed, why)
			return ctrl.Result{RequeueAfter: r.backoff.next(sbx.UID)}, nil
		}
	}
	if egressInjects(sbx) {
		// The CA installEgressCA writes, for the usual TLS clients.
		spec.Env = append(spec.Env, dockerruntime.EgressCAEnv()...)
	}
	ct, err := r.docker.CreateAndStart(ctx, spec)
	if err != nil {
		return r.dockerFailure(ctx, sbx, err)
	}
	containersCreated.Inc()
	sbx.Status.ContainerID = ct.ID
	// The policy first, as soon as the container has its address.
	recheck := r.applyEgress(ctx, sbx, ct)
	if err := r.installEgressCA(ctx, sbx, ct.ID); err != nil {
		// A container without the CA would fail every injected request:
		// removed and created again.
		_ = r.docker.Remove(context.WithoutCancel(ctx), ct.ID, 0)
		r.forgetEgress(ctx, ct.ID)
		sbx.Status.ContainerID = ""
		return r.dockerFailure(ctx, sbx, fmt.Errorf("installing the egress proxy's CA: %w", err))
	}
	// The start event will requeue us; checking state right away keeps the
	// create-to-Ready path short.
	if ct.State.Running {
		if ok, result := r.restoreFiles(ctx, sbx, ct); !ok {
			return withEgress(result, recheck), nil
		}
		if role.kind != poolMember && !sbx.Spec.Paused {
			// Ready only once the resident helper CreateAndStart began is
			// up: the first command then costs what a repeated one does,
			// instead of waiting for a process spawn behind Ready. A pool
			// member's health check (checkMemberBeforeFreeze) waits for
			// it the same way, so it is frozen with its helper parked.
			r.docker.AwaitHelper(ctx, ct.ID)
		}
		res, err := r.settlePaused(ctx, sbx, ct, role, requeueAfter)
		return withEgress(res, recheck), err
	}
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// settlePaused brings a live container's freezer state in line with
// spec.paused, then records it: Ready and Running when thawed, Ready=False
// and Paused when frozen. The lifetime counts from the first start either
// way, so a Sandbox created paused still expires on time.
func (r *SandboxReconciler) settlePaused(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container, role poolRole, requeueAfter time.Duration) (ctrl.Result, error) {
	idleFrozen := false
	switch {
	case sbx.Spec.Paused && !ct.State.Paused:
		if role.kind == poolMember {
			if result, healthy, err := r.checkMemberBeforeFreeze(ctx, sbx, ct, requeueAfter); !healthy {
				return result, err
			}
		}
		if err := r.docker.Pause(ctx, ct.ID); err != nil {
			return r.dockerFailure(ctx, sbx, err)
		}
	case !sbx.Spec.Paused && ct.State.Paused:
		if role.kind != poolMember && r.idleFrozen(sbx, ct) {
			// Frozen for idleness (idle.go): the next exec thaws it.
			idleFrozen = true
			break
		}
		resumeStart := r.clock.Now()
		if err := r.docker.Unpause(ctx, ct.ID); err != nil {
			return r.dockerFailure(ctx, sbx, err)
		}
		ObserveStart(PathResume, r.clock.Since(resumeStart))
	}
	if !idleFrozen {
		r.notIdleFrozen(sbx)
	}
	result := r.markRunning(sbx, ct.ID, requeueAfter)
	paused := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
	switch {
	case idleFrozen:
		// Paused=True, reason Idle, stays as applyIdle wrote it.
	case sbx.Spec.Paused:
		msg := "container " + dockerruntime.ShortID(ct.ID) + " is paused (spec.paused is true); set spec.paused to false to resume it"
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused, msg)
		meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
			Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionTrue,
			Reason: sandboxv1alpha1.SandboxReasonPaused, Message: msg, ObservedGeneration: sbx.Generation,
		})
	case paused != nil:
		meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
			Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionFalse,
			Reason: sandboxv1alpha1.SandboxReasonResumed, Message: "container " + dockerruntime.ShortID(ct.ID) + " was resumed",
			ObservedGeneration: sbx.Generation,
		})
	}
	if role.kind == poolMember {
		// A member waits frozen for a claimant and never idles out; its
		// claimant's idle clock starts at the claim (status.startTime).
		return result, nil
	}
	return r.applyIdle(ctx, sbx, &ct, result)
}

// verifyMemberContainer checks, before a Sandbox adopts the container of
// the warm pool member its status names, that the container was made for a
// Sandbox of the same namespace, with the member's name, on this node. The
// labels were set by this node's manager when it created the container;
// status.warmPool.member is only as good as whoever wrote it last.
func (r *SandboxReconciler) verifyMemberContainer(sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) error {
	uid := sbx.ContainerUID()
	if uid == sbx.UID {
		return nil
	}
	m := sbx.Status.WarmPool.Member
	ns, name, node := ct.Labels[dockerruntime.LabelNamespace], ct.Labels[dockerruntime.LabelName], ct.Labels[dockerruntime.LabelNode]
	if ns != sbx.Namespace || name != m.Name || node != r.opts.NodeName {
		return fmt.Errorf("status.warmPool.member names %s (UID %s), but container %s belongs to Sandbox %s/%s on node %q, not to a warm pool member %s/%s on node %s; refusing to adopt it",
			m.Name, uid, dockerruntime.ShortID(ct.ID), ns, name, node, sbx.Namespace, m.Name, r.opts.NodeName)
	}
	return nil
}

// ownContainers drops from list the containers verifyMemberContainer
// refuses: a Sandbox never removes a container that is not its own.
func (r *SandboxReconciler) ownContainers(sbx *sandboxv1alpha1.Sandbox, list []dockerruntime.Container) []dockerruntime.Container {
	out := list[:0:0]
	for _, ct := range list {
		if r.verifyMemberContainer(sbx, ct) == nil {
			out = append(out, ct)
		}
	}
	return out
}

// markRunning records a running container: Ready, and on the first start the
// start time (from which the lifetime counts) and the create-to-Ready
// latency. It returns when to look again: at expiry, if there is one.
func (r *SandboxReconciler) markRunning(sbx *sandboxv1alpha1.Sandbox, containerID string, requeueAfter time.Duration) ctrl.Result {
	r.backoff.reset(sbx.UID)
	if sbx.Status.StartTime == nil {
		start := metav1.NewTime(r.clock.Now())
		sbx.Status.StartTime = &start
		observeCreateToReady(r.clock.Since(sbx.CreationTimestamp.Time))
		ObserveStart(startPath(sbx), r.clock.Since(sbx.CreationTimestamp.Time))
		if expiry, ok := expiryTime(sbx); ok {
			requeueAfter = expiry.Sub(r.clock.Now())
		}
	}
	r.setReady(sbx, metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonRunning, "container "+dockerruntime.ShortID(containerID)+" is running")
	return ctrl.Result{RequeueAfter: requeueAfter}
}

// dockerFailure turns a Docker error into the Ready condition and a retry.
func (r *SandboxReconciler) dockerFailure(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, err error) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	var reason string
	switch {
	case errors.Is(err, dockerruntime.ErrUnavailable):
		dockerErrors.Inc()
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonDockerUnavailable, err.Error())
		// Returning the error gives the controller's exponential backoff.
		return ctrl.Result{}, fmt.Errorf("sandbox %s/%s: %w", sbx.Namespace, sbx.Name, err)
	case errors.Is(err, dockerruntime.ErrMultipleContainers):
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonMultipleContainers, err.Error())
		log.Error(err, "refusing to act on conflicting containers")
		// Fail closed: touch nothing until an operator resolves it, but
		// look again now and then in case they have.
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	case errors.Is(err, dockerruntime.ErrImageNotAllowed):
		// The manager's registry policy refuses the image's registry;
		// nothing was pulled. Retrying cannot help (the image is
		// immutable, and a changed policy restarts the manager, which
		// reconciles everything again).
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonImageRegistryNotAllowed, err.Error())
		log.Info("image registry refused by policy", "image", sbx.Spec.Image)
		return ctrl.Result{}, nil
	case errors.Is(err, dockerruntime.ErrImageNotFound):
		// After a failed pull the message names the failure class only
		// (dockerruntime.PullError); the daemon's text, which may quote
		// the registry's response, was logged by the runtime.
		reason = sandboxv1alpha1.SandboxReasonImageNotFound
	case errors.Is(err, dockerruntime.ErrRuntimeUnavailable):
		reason = sandboxv1alpha1.SandboxReasonRuntimeUnavailable
	case errors.Is(err, dockerruntime.ErrInvalidSpec):
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonCreateFailed, err.Error())
		return ctrl.Result{}, nil
	default:
		reason = sandboxv1alpha1.SandboxReasonCreateFailed
	}
	r.setReady(sbx, metav1.ConditionFalse, reason, err.Error())
	delay := r.backoff.next(sbx.UID)
	log.Info("provisioning failed; retrying", "reason", reason, "after", delay, "error", err.Error())
	return ctrl.Result{RequeueAfter: delay}, nil
}

// expire removes the container once the lifetime has passed.
func (r *SandboxReconciler) expire(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (ctrl.Result, error) {
	if result, err := r.removeContainers(ctx, sbx); err != nil {
		return result, err
	}
	msg := fmt.Sprintf("activeDeadlineSeconds (%ds) passed; the container was removed", *sbx.Spec.ActiveDeadlineSeconds)
	meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1alpha1.SandboxConditionExpired), Status: metav1.ConditionTrue,
		Reason: sandboxv1alpha1.SandboxReasonExpired, Message: msg, ObservedGeneration: sbx.Generation,
	})
	r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonExpired, msg)
	sbx.Status.ContainerID = ""
	// An expired Sandbox runs nothing, so it no longer uses capacity.
	r.claims.release(client.ObjectKeyFromObject(sbx))
	return ctrl.Result{}, nil
}

// removeContainers stops and removes every container of this Sandbox and
// confirms that none is left.
func (r *SandboxReconciler) removeContainers(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (ctrl.Result, error) {
	if _, claimed, err := r.claimantOf(ctx, sbx.UID); err != nil || claimed {
		// A claimed member's container is its claimant's now.
		return ctrl.Result{}, err
	}
	uid := string(sbx.ContainerUID())
	list, err := r.docker.ListManaged(ctx, dockerruntime.ListFilter{UID: uid})
	list = r.ownContainers(sbx, list)
	if err == nil {
		for _, ct := range list {
			if err = r.docker.Remove(ctx, ct.ID, r.opts.StopGracePeriod); err != nil {
				break
			}
			r.forgetEgress(ctx, ct.ID)
		}
	}
	if err == nil {
		// Proven gone: a fresh list, not the one we acted on.
		if list, err = r.docker.ListManaged(ctx, dockerruntime.ListFilter{UID: uid}); err == nil && len(r.ownContainers(sbx, list)) > 0 {
			err = fmt.Errorf("%d container(s) still present after removal", len(list))
		}
	}
	if err != nil {
		if errors.Is(err, dockerruntime.ErrUnavailable) {
			dockerErrors.Inc()
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonDockerUnavailable, err.Error())
		}
		return ctrl.Result{}, fmt.Errorf("removing containers of %s/%s: %w", sbx.Namespace, sbx.Name, err)
	}
	return ctrl.Result{}, nil
}

// finalize removes the container of a deleted Sandbox, then the finalizer.
func (r *SandboxReconciler) finalize(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(sbx, Finalizer) {
		r.claims.release(client.ObjectKeyFromObject(sbx))
		return ctrl.Result{}, nil
	}
	oldStatus := sbx.Status.DeepCopy()
	if _, err := r.removeContainers(ctx, sbx); err != nil {
		if uerr := r.writeStatus(ctx, sbx, oldStatus); uerr != nil && !apierrors.IsNotFound(uerr) {
			err = errors.Join(err, fmt.Errorf("writing status: %w", uerr))
		}
		return ctrl.Result{}, err
	}
	// Before the finalizer goes, so that a crash in between retries it.
	r.deleteHistory(ctx, sbx)
	base := sbx.DeepCopy()
	controllerutil.RemoveFinalizer(sbx, Finalizer)
	if err := r.client.Patch(ctx, sbx, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, ignoreConflict(fmt.Errorf("removing finalizer: %w", err))
	}
	r.claims.release(client.ObjectKeyFromObject(sbx))
	if m := sbx.Status.WarmPool; m != nil && m.Member != nil {
		r.members.release(m.Member.UID)
	}
	r.backoff.reset(sbx.UID)
	r.activity.forget(sbx.UID)
	r.recorder.Eventf(sbx, nil, "Normal", "ContainerRemoved", "Delete", "container removed from node %s", r.opts.NodeName)
	return ctrl.Result{}, nil
}

// settleNodeLost handles a Sandbox of this node that the control plane
// declared NodeLost while this node was gone (controllers/sandboxnode).
// NodeLost is terminal, like a Pod on a lost node: the container, if this
// node still has it, is removed and never recreated, and the status is
// never written again (the status policy refuses any change). A deleted
// one is finalized as usual, without the status write.
func (r *SandboxReconciler) settleNodeLost(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (ctrl.Result, error) {
	if _, err := r.removeContainers(ctx, sbx); err != nil {
		return ctrl.Result{}, err
	}
	r.claims.release(client.ObjectKeyFromObject(sbx))
	if sbx.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(sbx, Finalizer) {
		return ctrl.Result{}, nil
	}
	r.deleteHistory(ctx, sbx)
	base := sbx.DeepCopy()
	controllerutil.RemoveFinalizer(sbx, Finalizer)
	if err := r.client.Patch(ctx, sbx, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, ignoreConflict(fmt.Errorf("removing finalizer: %w", err))
	}
	if m := sbx.Status.WarmPool; m != nil && m.Member != nil {
		r.members.release(m.Member.UID)
	}
	r.backoff.reset(sbx.UID)
	return ctrl.Result{}, nil
}

// deleteHistory drops the exec history of a Sandbox whose container is gone.
func (r *SandboxReconciler) deleteHistory(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) {
	r.deleteHistoryOf(ctx, sbx.UID)
}

// setReady sets the Ready condition. It is also the one place that publishes
// the node API endpoint, always this manager's current value, so a manager
// restarted on a new address corrects every Sandbox on its next resync.
func (r *SandboxReconciler) setReady(sbx *sandboxv1alpha1.Sandbox, status metav1.ConditionStatus, reason, message string) {
	// The endpoint is the node's, not the container's: logs and history
	// of a Sandbox that is not Ready are served there too. Only on a
	// Sandbox bound to this node: the pending conditions a manager writes
	// to an unbound Sandbox are the only thing the status policy lets it
	// change there.
	if sbx.Status.NodeName == r.opts.NodeName {
		sbx.Status.NodeAPIEndpoint = r.opts.NodeAPIEndpoint
	}
	meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
		Type:               string(sandboxv1alpha1.SandboxConditionReady),
		Status:             status,
		Reason:             reason,
		Message:            truncateMessage(message),
		ObservedGeneration: sbx.Generation,
	})
}

// recordTransition emits an Event when the Ready reason changes, so that
// `kubectl describe` shows what happened without anyone reading logs. Only
// writeStatus calls it, after the status write succeeded.
func (r *SandboxReconciler) recordTransition(sbx *sandboxv1alpha1.Sandbox, old *sandboxv1alpha1.SandboxStatus) {
	now := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if now == nil {
		return
	}
	before := meta.FindStatusCondition(old.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if before != nil && before.Reason == now.Reason {
		return
	}
	eventType := "Warning"
	switch now.Reason {
	case sandboxv1alpha1.SandboxReasonRunning, sandboxv1alpha1.SandboxReasonProvisioning, sandboxv1alpha1.SandboxReasonPaused:
		eventType = "Normal"
	}
	r.recorder.Eventf(sbx, nil, eventType, now.Reason, "Reconcile", "%s", now.Message)
}

// recordIdleTransition emits an Event when the Paused condition turns to
// Idle (an idle pause) or leaves it (a thaw): the Ready reason does not
// change then, so recordTransition says nothing.
func (r *SandboxReconciler) recordIdleTransition(sbx *sandboxv1alpha1.Sandbox, old *sandboxv1alpha1.SandboxStatus) {
	now := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
	before := meta.FindStatusCondition(old.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
	wasIdle := before != nil && before.Status == metav1.ConditionTrue && before.Reason == sandboxv1alpha1.SandboxReasonIdle
	isIdle := now != nil && now.Status == metav1.ConditionTrue && now.Reason == sandboxv1alpha1.SandboxReasonIdle
	switch {
	case isIdle && !wasIdle:
		r.recorder.Eventf(sbx, nil, "Normal", sandboxv1alpha1.SandboxReasonIdle, "Pause", "%s", now.Message)
	case wasIdle && !isIdle && now != nil:
		r.recorder.Eventf(sbx, nil, "Normal", now.Reason, "Resume", "%s", now.Message)
	}
}

// expiryTime is when the Sandbox's lifetime ends, if it has one and has
// started.
func expiryTime(sbx *sandboxv1alpha1.Sandbox) (time.Time, bool) {
	if sbx.Spec.ActiveDeadlineSeconds == nil || sbx.Status.StartTime == nil {
		return time.Time{}, false
	}
	return sbx.Status.StartTime.Add(time.Duration(*sbx.Spec.ActiveDeadlineSeconds) * time.Second), true
}

// ignoreConflict drops optimistic-concurrency conflicts: the newer object
// triggers another reconcile anyway.
func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// truncateMessage keeps condition messages within the API's 32 KiB limit.
// It cuts at a rune boundary: a message cut inside a multi-byte character
// is invalid UTF-8, which the API server refuses to store.
func truncateMessage(msg string) string {
	const max = 4096
	if len(msg) <= max {
		return msg
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// sandboxIndexes are the cache indexes the reconciler lists Sandboxes by:
// the node that claimed them, and the warm pool member whose container
// they took over.
var sandboxIndexes = map[string]client.IndexerFunc{
	statusNodeNameField: func(obj client.Object) []string {
		return []string{obj.(*sandboxv1alpha1.Sandbox).Status.NodeName}
	},
	snapshotRefField: func(obj client.Object) []string {
		if ref := obj.(*sandboxv1alpha1.Sandbox).Spec.SnapshotRef; ref != nil {
			return []string{ref.Name}
		}
		return nil
	},
	memberClaimField: func(obj client.Object) []string {
		if m := obj.(*sandboxv1alpha1.Sandbox).Status.WarmPool; m != nil && m.Member != nil {
			return []string{string(m.Member.UID)}
		}
		return nil
	},
}

// SetupWithManager registers the controller, its field indexes, the Docker
// event watcher and the orphan collector with the manager.
func (r *SandboxReconciler) SetupWithManager(mgr ctrl.Manager, orphanGCInterval time.Duration) error {
	for field, extract := range sandboxIndexes {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &sandboxv1alpha1.Sandbox{}, field, extract); err != nil {
			return fmt.Errorf("indexing sandboxes by %s: %w", field, err)
		}
	}
	if err := mgr.Add(&dockerEventWatcher{reconciler: r}); err != nil {
		return err
	}
	if err := mgr.Add(&orphanCollector{reconciler: r, interval: orphanGCInterval}); err != nil {
		return err
	}
	skip := r.opts.SkipNameValidation
	if r.opts.Snapshots != nil {
		snaps, err := NewSnapshotReconciler(r.client, r.docker, r.opts.Snapshots, r.recorder, r.clock, r.opts.NodeName)
		if err != nil {
			return err
		}
		if err := snaps.SetupWithManager(mgr, skip); err != nil {
			return err
		}
		if sweep := NewSnapshotSweeper(r.apiReader, r.opts.Snapshots, r.clock, r.opts.NodeName); sweep != nil {
			if err := mgr.Add(sweep); err != nil {
				return err
			}
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		// Watches rather than For, for a handler that records deletions
		// (see deletedTracker); it enqueues exactly as For's would.
		Watches(&sandboxv1alpha1.Sandbox{}, &sandboxEventHandler{deleted: r.deleted}, builder.WithPredicates(r.relevant())).
		Watches(&sandboxv1alpha1.SandboxSnapshot{}, r.sandboxesRestoring()).
		WatchesRawSource(source.Channel(r.dockerEvents, &handler.TypedEnqueueRequestForObject[*sandboxv1alpha1.Sandbox]{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles, SkipNameValidation: &skip}).
		Named("sandbox").
		Complete(r)
}

// enqueue asks for a reconcile of one Sandbox.
func (r *SandboxReconciler) enqueue(namespace, name string, uid types.UID) {
	obj := &sandboxv1alpha1.Sandbox{}
	obj.Namespace, obj.Name, obj.UID = namespace, name, uid
	select {
	case r.dockerEvents <- eventGeneric{Object: obj}:
	default:
		// The queue is full; the periodic resync will catch up.
	}
}

func memoryLimit(sbx *sandboxv1alpha1.Sandbox) string {
	if spec, _ := warmpool.Effective(sbx); spec.Resources.Memory != nil {
		return spec.Resources.Memory.String()
	}
	return sandboxv1alpha1.DefaultMemory
}

// withEgress requeues res no later than after d (0: no change), for the
// egress policy's own rechecks (applyEgress).
func withEgress(res ctrl.Result, d time.Duration) ctrl.Result {
	if d > 0 && (res.RequeueAfter == 0 || d < res.RequeueAfter) {
		res.RequeueAfter = d
	}
	return res
}
