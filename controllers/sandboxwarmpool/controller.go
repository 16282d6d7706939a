/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package sandboxwarmpool holds the SandboxWarmPool controller: it keeps
// each pool's member Sandboxes at spec.replicas, deletes the members whose
// containers claims took over or that broke, replaces the members made from
// an older template one node at a time, and reports the pool's status. The
// node managers provision and pause the members like any Sandbox and hand
// them to claimants; this controller never touches a container.
package sandboxwarmpool

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

const (
	// DefaultResync is how often a pool is reconciled with no event, in
	// case an event was missed.
	DefaultResync = 30 * time.Second
	// DefaultCreateBackoffMax caps the wait between attempts to create
	// members after a refusal. A refusal (usually the namespace's
	// SandboxQuota) does not change by retrying at once, and the quota's
	// usage going down is not an event this controller sees, so this is
	// also how long a pool may stay short after room was made.
	DefaultCreateBackoffMax = 30 * time.Second
	createBackoffBase       = time.Second
	// expectationTTL bounds how long a create or delete this controller
	// made is assumed to be on its way into the cache. Well past any watch
	// delay; it only matters if the object changed again before the cache
	// saw it.
	expectationTTL = time.Minute
	// maxFailingNamed bounds the members the Ready message names.
	maxFailingNamed = 3
)

// brokenReasons are the Ready reasons of members that never become idle
// again; they are deleted and replaced.
var brokenReasons = map[string]bool{
	sandboxv1alpha1.SandboxReasonContainerExited:  true,
	sandboxv1alpha1.SandboxReasonOOMKilled:        true,
	sandboxv1alpha1.SandboxReasonContainerMissing: true,
	sandboxv1alpha1.SandboxReasonExpired:          true,
	// The node is gone (controllers/sandboxnode); the member's container
	// is out of reach and the Sandbox is terminal.
	sandboxv1alpha1.SandboxReasonNodeLost: true,
}

// failingReasons are the Ready reasons of members that are kept (the
// manager retries them, and a replacement would fail the same way) but
// make the pool report MembersFailing.
var failingReasons = map[string]bool{
	sandboxv1alpha1.SandboxReasonImageNotFound:           true,
	sandboxv1alpha1.SandboxReasonCreateFailed:            true,
	sandboxv1alpha1.SandboxReasonRuntimeUnavailable:      true,
	sandboxv1alpha1.SandboxReasonImageRegistryNotAllowed: true,
	sandboxv1alpha1.SandboxReasonHealthCheckFailed:       true,
}

// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxwarmpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxwarmpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxquotas,verbs=get;list;watch
// Events go to the pools, in every namespace that has one.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update

// Options configure the Reconciler.
type Options struct {
	// Resync: see DefaultResync.
	Resync time.Duration
	// CreateBackoffMax: see DefaultCreateBackoffMax.
	CreateBackoffMax time.Duration
	// MaxConcurrentReconciles bounds pools reconciled in parallel.
	MaxConcurrentReconciles int
	// SkipNameValidation lets several controllers run in one process
	// (tests).
	SkipNameValidation bool
}

// Reconciler keeps SandboxWarmPools filled.
type Reconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	clock     clock.PassiveClock
	opts      Options

	mu    sync.Mutex
	pools map[types.NamespacedName]*poolState
}

// NewReconciler builds the reconciler. apiReader must read from the API
// server directly: it confirms that a member's pool is gone before the
// member is deleted as an orphan.
func NewReconciler(c client.Client, apiReader client.Reader, recorder events.EventRecorder, clk clock.PassiveClock, opts Options) *Reconciler {
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.CreateBackoffMax <= 0 {
		opts.CreateBackoffMax = DefaultCreateBackoffMax
	}
	if opts.MaxConcurrentReconciles <= 0 {
		opts.MaxConcurrentReconciles = 2
	}
	return &Reconciler{client: c, apiReader: apiReader, recorder: recorder, clock: clk, opts: opts,
		pools: map[types.NamespacedName]*poolState{}}
}

// SetupWithManager registers the controller. A Sandbox event requeues the
// pool it is a member of or claims from; a SandboxQuota whose spec changes
// requeues the pools of its namespace at once, past any create backoff,
// since that is what usually ends a refusal.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.SandboxWarmPool{}).
		Watches(&sandboxv1alpha1.Sandbox{}, r.sandboxHandler()).
		Watches(&sandboxv1alpha1.SandboxQuota{}, handler.EnqueueRequestsFromMapFunc(r.poolsAfterQuotaChange),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles, SkipNameValidation: &r.opts.SkipNameValidation}).
		Named("sandboxwarmpool").
		Complete(r)
}

func (r *Reconciler) sandboxHandler() handler.EventHandler {
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], namespace, name string) {
		if name != "" {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}})
		}
	}
	both := func(obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		sbx, ok := obj.(*sandboxv1alpha1.Sandbox)
		if !ok {
			return
		}
		add(q, sbx.Namespace, warmpool.PoolOf(sbx))
		if sbx.Spec.WarmPoolRef != nil {
			add(q, sbx.Namespace, sbx.Spec.WarmPoolRef.Name)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			both(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			newS, okNew := e.ObjectNew.(*sandboxv1alpha1.Sandbox)
			oldS, okOld := e.ObjectOld.(*sandboxv1alpha1.Sandbox)
			if !okNew || !okOld {
				return
			}
			add(q, newS.Namespace, warmpool.PoolOf(oldS))
			add(q, newS.Namespace, warmpool.PoolOf(newS))
			// Claimants change often; only recording the member they took
			// matters to the pool.
			if newS.Spec.WarmPoolRef != nil && claimedUID(oldS) != claimedUID(newS) {
				add(q, newS.Namespace, newS.Spec.WarmPoolRef.Name)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			both(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			both(e.Object, q)
		},
	}
}

func (r *Reconciler) poolsAfterQuotaChange(ctx context.Context, obj client.Object) []reconcile.Request {
	var list sandboxv1alpha1.SandboxWarmPoolList
	if err := r.client.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
		logf.FromContext(ctx).Error(err, "listing SandboxWarmPools to requeue", "namespace", obj.GetNamespace())
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range list.Items {
		key := client.ObjectKeyFromObject(&list.Items[i])
		if st := r.pools[key]; st != nil {
			st.retryAt = time.Time{}
		}
		reqs[i] = reconcile.Request{NamespacedName: key}
	}
	return reqs
}

func claimedUID(sbx *sandboxv1alpha1.Sandbox) types.UID {
	if sbx.Status.WarmPool == nil || sbx.Status.WarmPool.Member == nil {
		return ""
	}
	return sbx.Status.WarmPool.Member.UID
}

// note is an event to record once the status is written.
type note struct {
	eventType, reason, action, msg string
	related                        *sandboxv1alpha1.Sandbox
}

// Reconcile brings one SandboxWarmPool to its replicas and writes its
// status if it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &sandboxv1alpha1.SandboxWarmPool{}
	if err := r.client.Get(ctx, req.NamespacedName, pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.forget(req.NamespacedName)
		return ctrl.Result{}, r.removeOrphans(ctx, req.Namespace, req.Name, "")
	}
	if !pool.DeletionTimestamp.IsZero() {
		// Garbage collection deletes the members (they are owned by the
		// pool); creating more now would only race it.
		return ctrl.Result{}, nil
	}
	old := pool.Status.DeepCopy()
	result, notes, reconcileErr := r.reconcile(ctx, pool)
	if !apiequality.Semantic.DeepEqual(old, &pool.Status) {
		if err := r.client.Status().Update(ctx, pool); err != nil {
			r.record(pool, notes)
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				// The newer version's event requeues it anyway.
				return ctrl.Result{RequeueAfter: time.Second}, reconcileErr
			}
			return ctrl.Result{}, fmt.Errorf("updating the status of SandboxWarmPool %s: %w", req.NamespacedName, err)
		}
	}
	r.record(pool, notes)
	return result, reconcileErr
}

func (r *Reconciler) record(pool *sandboxv1alpha1.SandboxWarmPool, notes []note) {
	for _, n := range notes {
		// A nil *Sandbox is not a nil runtime.Object.
		if n.related == nil {
			r.recorder.Eventf(pool, nil, n.eventType, n.reason, n.action, "%s", n.msg)
			continue
		}
		r.recorder.Eventf(pool, n.related, n.eventType, n.reason, n.action, "%s", n.msg)
	}
}

// reconcile deletes spent members, scales, rolls out and fills pool.Status.
func (r *Reconciler) reconcile(ctx context.Context, pool *sandboxv1alpha1.SandboxWarmPool) (ctrl.Result, []note, error) {
	key := client.ObjectKeyFromObject(pool)
	now := r.clock.Now()
	want := int(warmpool.Replicas(pool))
	var notes []note

	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.InNamespace(pool.Namespace)); err != nil {
		return ctrl.Result{}, nil, fmt.Errorf("listing the Sandboxes in namespace %s: %w", pool.Namespace, err)
	}
	if err := r.deleteOrphans(ctx, orphans(list.Items, pool.Name, pool.UID)); err != nil {
		return ctrl.Result{}, nil, err
	}

	claimed := map[types.UID]bool{}
	for i := range list.Items {
		if uid := claimedUID(&list.Items[i]); uid != "" {
			claimed[uid] = true
		}
	}
	v := &view{hash: warmpool.Hash(pool.Spec.Template), template: pool.Spec.Template}
	var deleting map[types.UID]bool
	v.pending, deleting = r.observe(key, list.Items, now)

	var failing []string
	for i := range list.Items {
		sbx := &list.Items[i]
		if !warmpool.IsMemberOf(sbx, pool) || !sbx.DeletionTimestamp.IsZero() || deleting[sbx.UID] {
			continue
		}
		reason, msg := readyReason(sbx)
		switch {
		case claimed[sbx.UID] || reason == sandboxv1alpha1.SandboxReasonClaimed:
			// Its container belongs to the claimant now; the object is
			// all that is left.
			if err := r.deleteMember(ctx, key, sbx, now); err != nil {
				return ctrl.Result{}, notes, err
			}
		case brokenReasons[reason]:
			if err := r.deleteMember(ctx, key, sbx, now); err != nil {
				return ctrl.Result{}, notes, err
			}
			notes = append(notes, note{eventType: "Warning", reason: "MemberReplaced", action: "Delete", related: sbx,
				msg: fmt.Sprintf("deleted member %s, which failed (%s: %s); a new one replaces it", sbx.Name, reason, msg)})
		default:
			v.active = append(v.active, sbx)
			if failingReasons[reason] {
				failing = append(failing, fmt.Sprintf("member %s: %s: %s", sbx.Name, reason, msg))
			}
		}
	}

	evictions, err := r.evictForClaimants(ctx, key, pool, list.Items, v, deleting, now)
	notes = append(notes, evictions...)
	if err != nil {
		return ctrl.Result{}, notes, err
	}

	result := ctrl.Result{RequeueAfter: r.opts.Resync}
	createFailure := ""
	switch n := v.count(); {
	case n > want:
		r.clearFailures(key)
		surplus := byDeletionPreference(v, v.active)
		if len(surplus) > n-want {
			surplus = surplus[:n-want]
		}
		for _, sbx := range surplus {
			if err := r.deleteMember(ctx, key, sbx, now); err != nil {
				return ctrl.Result{}, notes, err
			}
			v.remove(sbx)
		}
		if len(surplus) > 0 {
			notes = append(notes, note{eventType: "Normal", reason: "ScaledDown", action: "Delete",
				msg: fmt.Sprintf("deleted %d members to keep %d", len(surplus), want)})
		}
	case n < want:
		created, failure, retryAt := r.createMembers(ctx, key, pool, v, want-n, now)
		if created > 0 {
			notes = append(notes, note{eventType: "Normal", reason: "MembersCreated", action: "Create",
				msg: fmt.Sprintf("created %d members", created)})
		}
		if failure != "" {
			createFailure = failure
			if d := retryAt.Sub(now); d > 0 && d < result.RequeueAfter {
				result.RequeueAfter = d
			}
		}
	default:
		r.clearFailures(key)
		for _, sbx := range rolloutVictims(v) {
			if err := r.deleteMember(ctx, key, sbx, now); err != nil {
				return ctrl.Result{}, notes, err
			}
			v.remove(sbx)
			notes = append(notes, note{eventType: "Normal", reason: "RollingOut", action: "Delete", related: sbx,
				msg: fmt.Sprintf("deleted member %s on node %s, made from an older template; a new one replaces it", sbx.Name, nodeOf(sbx))})
		}
	}

	pool.Status.Replicas = int32(v.count())
	pool.Status.ReadyReplicas = int32(v.ready())
	pool.Status.Selector = warmpool.Selector(pool).String()
	pool.Status.ObservedGeneration = pool.Generation
	r.setReady(pool, v, want, createFailure, failing)
	return result, notes, nil
}
