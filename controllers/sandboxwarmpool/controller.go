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
	"sort"
	"strings"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
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

// poolState is what one pool's reconciles remember between them.
type poolState struct {
	// creates and deletes are this controller's own writes that the cache
	// has not shown yet. Without them a reconcile that runs before the
	// cache catches up would create members twice, or delete a second
	// stale member on a node whose first replacement it cannot see.
	creates map[types.UID]pendingCreate
	deletes map[types.UID]time.Time

	// Creates refused in a row, the last refusal, and when to try again.
	failures    int
	lastFailure string
	retryAt     time.Time
}

type pendingCreate struct {
	hash string
	at   time.Time
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

// view is a pool's members as one reconcile sees them.
type view struct {
	hash     string
	template sandboxv1alpha1.SandboxTemplate
	// active are the members that count toward spec.replicas: not
	// deleting, not claimed, not broken.
	active []*sandboxv1alpha1.Sandbox
	// pending are members this controller created that the cache does not
	// show yet; they count as active, unbound and not idle.
	pending []pendingCreate
}

func (v *view) count() int { return len(v.active) + len(v.pending) }

// fresh: made from the current template. The label is what the member
// says; the spec is what its container was made from, and a member whose
// spec is not the template's is never claimed (warmpool.Matches), so it is
// replaced like a stale one. This controller's cache holds no command or
// env (controllers.CacheOptions), so the rest of the shape is compared
// here; the claiming manager compares the whole spec.
func (v *view) fresh(sbx *sandboxv1alpha1.Sandbox) bool {
	return sbx.Labels[sandboxv1alpha1.LabelTemplateHash] == v.hash && warmpool.MatchesStripped(&sbx.Spec, v.template)
}

func (v *view) stale() int {
	n := 0
	for _, s := range v.active {
		if !v.fresh(s) {
			n++
		}
	}
	for _, p := range v.pending {
		if p.hash != v.hash {
			n++
		}
	}
	return n
}

func (v *view) ready() int {
	n := 0
	for _, s := range v.active {
		if v.fresh(s) && warmpool.Idle(s) {
			n++
		}
	}
	return n
}

func (v *view) remove(sbx *sandboxv1alpha1.Sandbox) {
	for i, s := range v.active {
		if s.UID == sbx.UID {
			v.active = append(v.active[:i], v.active[i+1:]...)
			return
		}
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

func (r *Reconciler) setReady(pool *sandboxv1alpha1.SandboxWarmPool, v *view, want int, createFailure string, failing []string) {
	status, reason := metav1.ConditionFalse, sandboxv1alpha1.SandboxWarmPoolReasonFilling
	msg := fmt.Sprintf("%d of %d members idle", v.ready(), want)
	sort.Strings(failing)
	if len(failing) > maxFailingNamed {
		failing = append(failing[:maxFailingNamed], fmt.Sprintf("and %d more", len(failing)-maxFailingNamed))
	}
	switch stale := v.stale(); {
	case createFailure != "":
		reason = sandboxv1alpha1.SandboxWarmPoolReasonMembersFailing
		msg = "creating members: " + createFailure
		if len(failing) > 0 {
			msg += "; " + strings.Join(failing, "; ")
		}
	case len(failing) > 0:
		reason = sandboxv1alpha1.SandboxWarmPoolReasonMembersFailing
		msg = strings.Join(failing, "; ")
	case v.ready() == v.count() && v.count() == want:
		status, reason = metav1.ConditionTrue, sandboxv1alpha1.SandboxWarmPoolReasonFilled
		msg = fmt.Sprintf("%d of %d members idle", v.ready(), want)
	case stale > 0:
		reason = sandboxv1alpha1.SandboxWarmPoolReasonRollingOut
		msg = fmt.Sprintf("%d of %d members were made from an older template; %d of %d idle", stale, v.count(), v.ready(), want)
	}
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{
		Type:               string(sandboxv1alpha1.SandboxWarmPoolConditionReady),
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: pool.Generation,
		LastTransitionTime: metav1.NewTime(r.clock.Now()),
	})
}

// createMembers creates up to n members, stopping at the first refusal:
// the next would be refused the same way. After a refusal it does not try
// again before the backoff ends, however often the pool is requeued.
func (r *Reconciler) createMembers(ctx context.Context, key types.NamespacedName, pool *sandboxv1alpha1.SandboxWarmPool,
	v *view, n int, now time.Time) (created int, failure string, retryAt time.Time) {
	r.mu.Lock()
	st := r.state(key)
	if now.Before(st.retryAt) {
		failure, retryAt = st.lastFailure, st.retryAt
		r.mu.Unlock()
		return 0, failure, retryAt
	}
	r.mu.Unlock()

	lifetime, err := r.memberLifetime(ctx, pool.Namespace)
	if err != nil {
		return 0, err.Error(), now.Add(r.backoff(1))
	}
	for range n {
		sbx := warmpool.Member(pool)
		sbx.Spec.ActiveDeadlineSeconds = lifetime
		if err := r.client.Create(ctx, sbx); err != nil {
			logf.FromContext(ctx).Info("creating a warm pool member failed", "pool", key, "error", err.Error())
			r.mu.Lock()
			defer r.mu.Unlock()
			st.failures++
			st.lastFailure = err.Error()
			st.retryAt = now.Add(r.backoff(st.failures))
			return created, st.lastFailure, st.retryAt
		}
		created++
		p := pendingCreate{hash: v.hash, at: now}
		v.pending = append(v.pending, p)
		r.mu.Lock()
		st.creates[sbx.UID] = p
		r.mu.Unlock()
	}
	r.clearFailures(key)
	return created, "", time.Time{}
}

// memberLifetime is the activeDeadlineSeconds new members get: none, or
// where the namespace's SandboxQuotas demand a lifetime
// (maxActiveDeadlineSeconds), the shortest they allow. A member that reaches
// it expires and is replaced, so idle members are recycled rather than
// refused; a claimant's own lifetime counts from its claim.
func (r *Reconciler) memberLifetime(ctx context.Context, namespace string) (*int64, error) {
	var quotas sandboxv1alpha1.SandboxQuotaList
	if err := r.client.List(ctx, &quotas, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing the SandboxQuotas of namespace %s: %w", namespace, err)
	}
	var lifetime *int64
	for i := range quotas.Items {
		if max := quotas.Items[i].Spec.MaxActiveDeadlineSeconds; max != nil && (lifetime == nil || *max < *lifetime) {
			lifetime = ptr.To(*max)
		}
	}
	return lifetime, nil
}

func (r *Reconciler) backoff(failures int) time.Duration {
	d := createBackoffBase
	for i := 1; i < failures && d < r.opts.CreateBackoffMax; i++ {
		d *= 2
	}
	return min(d, r.opts.CreateBackoffMax)
}

func (r *Reconciler) clearFailures(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state(key)
	st.failures, st.lastFailure, st.retryAt = 0, "", time.Time{}
}

// deleteMember deletes a member, only the very object that was looked at.
func (r *Reconciler) deleteMember(ctx context.Context, key types.NamespacedName, sbx *sandboxv1alpha1.Sandbox, now time.Time) error {
	uid := sbx.UID
	err := r.client.Delete(ctx, sbx, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting warm pool member %s/%s: %w", sbx.Namespace, sbx.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state(key).deletes[uid] = now
	return nil
}

// observe settles the pool's expectations against what the cache shows and
// returns the creates it does not show yet and the deletes it still shows
// as live.
func (r *Reconciler) observe(key types.NamespacedName, sandboxes []sandboxv1alpha1.Sandbox, now time.Time) ([]pendingCreate, map[types.UID]bool) {
	live := make(map[types.UID]bool, len(sandboxes))
	for i := range sandboxes {
		live[sandboxes[i].UID] = sandboxes[i].DeletionTimestamp.IsZero()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state(key)
	var pending []pendingCreate
	for uid, p := range st.creates {
		if _, seen := live[uid]; seen || now.Sub(p.at) > expectationTTL {
			delete(st.creates, uid)
			continue
		}
		pending = append(pending, p)
	}
	deleting := map[types.UID]bool{}
	for uid, at := range st.deletes {
		if !live[uid] || now.Sub(at) > expectationTTL {
			delete(st.deletes, uid)
			continue
		}
		deleting[uid] = true
	}
	return pending, deleting
}

// state returns key's state, creating it; r.mu must be held.
func (r *Reconciler) state(key types.NamespacedName) *poolState {
	st := r.pools[key]
	if st == nil {
		st = &poolState{creates: map[types.UID]pendingCreate{}, deletes: map[types.UID]time.Time{}}
		r.pools[key] = st
	}
	return st
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pools, key)
}

// removeOrphans deletes the members of a pool named name whose pool is
// gone. Garbage collection does the same through the ownerReference; this
// covers clusters where it lags or does not run.
func (r *Reconciler) removeOrphans(ctx context.Context, namespace, name string, liveUID types.UID) error {
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.InNamespace(namespace),
		client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: name}); err != nil {
		return fmt.Errorf("listing the members of SandboxWarmPool %s/%s: %w", namespace, name, err)
	}
	return r.deleteOrphans(ctx, orphans(list.Items, name, liveUID))
}

// orphans are the Sandboxes controlled by a SandboxWarmPool called name
// other than the one with liveUID.
func orphans(sandboxes []sandboxv1alpha1.Sandbox, name string, liveUID types.UID) []*sandboxv1alpha1.Sandbox {
	var out []*sandboxv1alpha1.Sandbox
	for i := range sandboxes {
		sbx := &sandboxes[i]
		if warmpool.PoolOf(sbx) != name || !sbx.DeletionTimestamp.IsZero() {
			continue
		}
		if ref := metav1.GetControllerOfNoCopy(sbx); ref.UID != liveUID {
			out = append(out, sbx)
		}
	}
	return out
}

// deleteOrphans deletes candidates whose pool the API server confirms is
// gone: the cache may not have seen a pool that was just created.
func (r *Reconciler) deleteOrphans(ctx context.Context, candidates []*sandboxv1alpha1.Sandbox) error {
	if len(candidates) == 0 {
		return nil
	}
	log := logf.FromContext(ctx)
	current := map[string]types.UID{}
	for _, sbx := range candidates {
		ref := metav1.GetControllerOfNoCopy(sbx)
		uid, known := current[ref.Name]
		if !known {
			pool := &sandboxv1alpha1.SandboxWarmPool{}
			err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: sbx.Namespace, Name: ref.Name}, pool)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return fmt.Errorf("checking SandboxWarmPool %s/%s: %w", sbx.Namespace, ref.Name, err)
			default:
				uid = pool.UID
			}
			current[ref.Name] = uid
		}
		if uid == ref.UID {
			continue
		}
		memberUID := sbx.UID
		err := r.client.Delete(ctx, sbx, client.Preconditions{UID: &memberUID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting orphaned warm pool member %s/%s: %w", sbx.Namespace, sbx.Name, err)
		}
		log.Info("deleted a member whose SandboxWarmPool is gone", "sandbox", client.ObjectKeyFromObject(sbx), "pool", ref.Name)
	}
	return nil
}

// byDeletionPreference orders members best to delete first: stale before
// fresh, then not idle before idle (an idle member is what a claim
// wants), then newest first (the least invested in).
func byDeletionPreference(v *view, members []*sandboxv1alpha1.Sandbox) []*sandboxv1alpha1.Sandbox {
	out := append([]*sandboxv1alpha1.Sandbox(nil), members...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if fa, fb := v.fresh(a), v.fresh(b); fa != fb {
			return !fa
		}
		if ia, ib := warmpool.Idle(a), warmpool.Idle(b); ia != ib {
			return !ia
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Name > b.Name
	})
	return out
}

// rolloutVictims picks the stale members to replace now: one on each node
// that hosts stale members and has no fresh member on its way to idle, so
// that a broken template costs each node one member, not all of them, and a
// node never has more than one replacement starting. A fresh member not yet
// bound to a node may land on any, so it holds back every node. Stale
// members not bound to any node are replaced one at a time, only when no
// fresh member is in flight at all.
func rolloutVictims(v *view) []*sandboxv1alpha1.Sandbox {
	staleByNode := map[string][]*sandboxv1alpha1.Sandbox{}
	inFlight := map[string]bool{}
	anywhere := false
	for _, p := range v.pending {
		if p.hash == v.hash {
			anywhere = true
		}
	}
	for _, s := range v.active {
		switch {
		case !v.fresh(s):
			staleByNode[s.Status.NodeName] = append(staleByNode[s.Status.NodeName], s)
		case warmpool.Idle(s):
		case s.Status.NodeName == "":
			anywhere = true
		default:
			inFlight[s.Status.NodeName] = true
		}
	}
	if anywhere || len(staleByNode) == 0 {
		return nil
	}
	nodes := make([]string, 0, len(staleByNode))
	for node := range staleByNode {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	var victims []*sandboxv1alpha1.Sandbox
	for _, node := range nodes {
		if inFlight[node] || (node == "" && len(inFlight) > 0) {
			continue
		}
		victims = append(victims, byDeletionPreference(v, staleByNode[node])[0])
	}
	return victims
}

func readyReason(sbx *sandboxv1alpha1.Sandbox) (reason, msg string) {
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if c == nil {
		return "", ""
	}
	return c.Reason, c.Message
}

func nodeOf(sbx *sandboxv1alpha1.Sandbox) string {
	if sbx.Status.NodeName == "" {
		return "(none)"
	}
	return sbx.Status.NodeName
}
