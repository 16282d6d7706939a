/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package sandboxquota holds the SandboxQuota controller: it recounts each
// quota's status.used from the Sandboxes in its namespace, which releases
// usage when Sandboxes are deleted or expire, and settles the reservations
// the admission webhook records.
package sandboxquota

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// DefaultReservationTimeout is how long a reservation counts without its
// Sandbox being seen. kube-apiserver gives a request 60 seconds by default,
// so a create admitted longer ago than that has been stored or has failed;
// only then does the controller ask the API server which.
const DefaultReservationTimeout = 60 * time.Second

// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxquotas/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes,verbs=get;list;watch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxsnapshots,verbs=get;list;watch
// A Sandbox that claims from a warm pool is counted with the pool's template
// until its manager records the template it used.
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxwarmpools,verbs=get;list;watch
// One webhook replica runs the controller at a time (leader election with a
// Lease in the webhook's own namespace).
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,namespace=system,resources=events,verbs=create;patch

// Options configure the Reconciler.
type Options struct {
	// ReservationTimeout: see DefaultReservationTimeout.
	ReservationTimeout time.Duration
	// MaxConcurrentReconciles bounds quotas counted in parallel.
	MaxConcurrentReconciles int
}

// Reconciler recounts SandboxQuota usage.
type Reconciler struct {
	client    client.Client
	apiReader client.Reader
	clock     clock.PassiveClock
	opts      Options

	// deleted remembers the UIDs of Sandboxes seen deleted, so that a
	// reservation for a Sandbox created and deleted before any recount
	// saw it is settled at once instead of when it is overdue.
	mu      sync.Mutex
	deleted map[types.UID]time.Time
}

// NewReconciler builds the reconciler. apiReader must read from the API
// server directly; it settles overdue reservations.
func NewReconciler(c client.Client, apiReader client.Reader, clk clock.PassiveClock, opts Options) *Reconciler {
	if opts.ReservationTimeout <= 0 {
		opts.ReservationTimeout = DefaultReservationTimeout
	}
	if opts.MaxConcurrentReconciles <= 0 {
		opts.MaxConcurrentReconciles = 2
	}
	return &Reconciler{client: c, apiReader: apiReader, clock: clk, opts: opts, deleted: map[types.UID]time.Time{}}
}

// SetupWithManager registers the controller. Every Sandbox event requeues
// the quotas of its namespace, and so does every warm pool event: an
// unclaimed claimant is counted with its pool's current template.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.SandboxQuota{}).
		Watches(&sandboxv1alpha1.Sandbox{}, r.sandboxHandler()).
		Watches(&sandboxv1alpha1.SandboxSnapshot{}, r.snapshotHandler()).
		Watches(&sandboxv1alpha1.SandboxWarmPool{}, handler.EnqueueRequestsFromMapFunc(r.quotasOf)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles}).
		Named("sandboxquota").
		Complete(r)
}

func (r *Reconciler) sandboxHandler() handler.EventHandler {
	enqueue := handler.EnqueueRequestsFromMapFunc(r.quotasOf)
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue.Create(ctx, e, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			// Only what changes usage: deletion starting, expiry, or a
			// warm pool claim (it records the template the claimant is
			// counted with, and the member that stops counting).
			oldS, okOld := e.ObjectOld.(*sandboxv1alpha1.Sandbox)
			newS, okNew := e.ObjectNew.(*sandboxv1alpha1.Sandbox)
			if okOld && okNew && quota.Counts(oldS) == quota.Counts(newS) &&
				apiequality.Semantic.DeepEqual(oldS.Status.WarmPool, newS.Status.WarmPool) {
				return
			}
			enqueue.Update(ctx, e, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.rememberDeleted(e.Object.GetUID())
			enqueue.Delete(ctx, e, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue.Generic(ctx, e, q)
		},
	}
}

// snapshotHandler requeues a namespace's quotas when a SandboxSnapshot is
// created, starts being deleted, is gone, or changes what it counts (its
// size becomes known, it fails for good).
func (r *Reconciler) snapshotHandler() handler.EventHandler {
	enqueue := handler.EnqueueRequestsFromMapFunc(r.quotasOf)
	counts := func(s *sandboxv1alpha1.SandboxSnapshot) quota.SnapshotUsage {
		return quota.CountSnapshots([]sandboxv1alpha1.SandboxSnapshot{*s}, "")
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue.Create(ctx, e, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			oldS, okOld := e.ObjectOld.(*sandboxv1alpha1.SandboxSnapshot)
			newS, okNew := e.ObjectNew.(*sandboxv1alpha1.SandboxSnapshot)
			if okOld && okNew && counts(oldS) == counts(newS) {
				return
			}
			enqueue.Update(ctx, e, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.rememberDeleted(e.Object.GetUID())
			enqueue.Delete(ctx, e, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue.Generic(ctx, e, q)
		},
	}
}

func (r *Reconciler) quotasOf(ctx context.Context, obj client.Object) []reconcile.Request {
	var list sandboxv1alpha1.SandboxQuotaList
	if err := r.client.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
		logf.FromContext(ctx).Error(err, "listing SandboxQuotas to requeue", "namespace", obj.GetNamespace())
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return reqs
}

func (r *Reconciler) rememberDeleted(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.deleted[uid] = now
	for id, at := range r.deleted {
		if now.Sub(at) > 2*r.opts.ReservationTimeout {
			delete(r.deleted, id)
		}
	}
}

func (r *Reconciler) wasDeleted(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.deleted[uid]
	return ok
}

// Reconcile recounts one SandboxQuota and writes its status if it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	q := &sandboxv1alpha1.SandboxQuota{}
	if err := r.client.Get(ctx, req.NamespacedName, q); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// No finalizer: a quota owns nothing outside the API server.
	old := q.Status.DeepCopy()
	result, countErr := r.reconcile(ctx, q)
	if apiequality.Semantic.DeepEqual(old, &q.Status) {
		return result, countErr
	}
	// Written with the resourceVersion read above: if the webhook charged
	// the quota meanwhile, this fails with a conflict and is recounted
	// rather than overwriting the charge.
	if err := r.client.Status().Update(ctx, q); err != nil {
		if apierrors.IsConflict(err) {
			// The newer version's watch event requeues it anyway; the
			// delay only covers a missed event.
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, fmt.Errorf("updating the status of SandboxQuota %s: %w", req.NamespacedName, err)
	}
	return result, countErr
}

// reconcile recounts usage into q.Status.
func (r *Reconciler) reconcile(ctx context.Context, q *sandboxv1alpha1.SandboxQuota) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	var sandboxes sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &sandboxes, client.InNamespace(q.Namespace)); err != nil {
		r.setCondition(q, sandboxv1alpha1.SandboxQuotaConditionReady, metav1.ConditionFalse,
			sandboxv1alpha1.SandboxQuotaReasonCountFailed, fmt.Sprintf("listing Sandboxes: %v", err))
		return ctrl.Result{}, fmt.Errorf("listing the Sandboxes in namespace %s: %w", q.Namespace, err)
	}
	var pools sandboxv1alpha1.SandboxWarmPoolList
	if err := r.client.List(ctx, &pools, client.InNamespace(q.Namespace)); err != nil {
		r.setCondition(q, sandboxv1alpha1.SandboxQuotaConditionReady, metav1.ConditionFalse,
			sandboxv1alpha1.SandboxQuotaReasonCountFailed, fmt.Sprintf("listing SandboxWarmPools: %v", err))
		return ctrl.Result{}, fmt.Errorf("listing the SandboxWarmPools in namespace %s: %w", q.Namespace, err)
	}
	var snapshots sandboxv1alpha1.SandboxSnapshotList
	if err := r.client.List(ctx, &snapshots, client.InNamespace(q.Namespace)); err != nil {
		r.setCondition(q, sandboxv1alpha1.SandboxQuotaConditionReady, metav1.ConditionFalse,
			sandboxv1alpha1.SandboxQuotaReasonCountFailed, fmt.Sprintf("listing SandboxSnapshots: %v", err))
		return ctrl.Result{}, fmt.Errorf("listing the SandboxSnapshots in namespace %s: %w", q.Namespace, err)
	}
	now := r.clock.Now()
	templates := warmpool.TemplatesOf(pools.Items)
	charged := func(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox { return warmpool.Charged(sbx, templates) }
	count := quota.Count(q.Status.Reservations, sandboxes.Items, snapshots.Items, charged, r.wasDeleted, now, r.opts.ReservationTimeout)
	for _, res := range count.Overdue {
		exists, err := r.exists(ctx, q.Namespace, res)
		if err != nil {
			// Unknown: keep charging it rather than risk admitting too
			// much, and try again soon.
			count.Keep(res)
			r.setCondition(q, sandboxv1alpha1.SandboxQuotaConditionReady, metav1.ConditionFalse,
				sandboxv1alpha1.SandboxQuotaReasonCountFailed, fmt.Sprintf("checking reserved Sandbox %s: %v", res.Name, err))
			return ctrl.Result{}, err
		}
		if exists {
			count.Keep(res)
			continue
		}
		log.Info("dropping the reservation of an object that was never stored", "quota", q.Name, "kind", res.Kind, "name", res.Name, "uid", res.UID)
	}

	q.Status.Used = count.Used
	q.Status.Reservations = count.Reservations
	q.Status.Summary = quota.Summary(q.Spec.Hard, count.Used)
	q.Status.ObservedGeneration = q.Generation
	r.setCondition(q, sandboxv1alpha1.SandboxQuotaConditionReady, metav1.ConditionTrue, sandboxv1alpha1.SandboxQuotaReasonCounted,
		fmt.Sprintf("counted %d Sandboxes, %d SandboxSnapshots and %d pending reservations",
			count.Used.Sandboxes-reservedOf(count.Reservations, false), count.Used.Snapshots-reservedOf(count.Reservations, true), len(count.Reservations)))
	reason, msg := quota.Exhaustion(q.Spec.Hard, count.Used)
	status := metav1.ConditionTrue
	if reason == sandboxv1alpha1.SandboxQuotaReasonWithinLimits {
		status = metav1.ConditionFalse
	}
	r.setCondition(q, sandboxv1alpha1.SandboxQuotaConditionExhausted, status, reason, msg)

	if count.NextDeadline.IsZero() {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: count.NextDeadline.Sub(now) + time.Second}, nil
}

// reservedOf is how many of reservations are for snapshots (snapshots) or
// for Sandboxes (!snapshots).
func reservedOf(reservations []sandboxv1alpha1.SandboxQuotaReservation, snapshots bool) int64 {
	var n int64
	for _, res := range reservations {
		if (res.Kind == sandboxv1alpha1.ReservationKindSnapshot) == snapshots {
			n++
		}
	}
	return n
}

// exists asks the API server whether the reserved object was stored after
// all; a cache that has not caught up must not make it look gone.
func (r *Reconciler) exists(ctx context.Context, namespace string, res sandboxv1alpha1.SandboxQuotaReservation) (bool, error) {
	if res.Kind == sandboxv1alpha1.ReservationKindSnapshot {
		snap := &sandboxv1alpha1.SandboxSnapshot{}
		err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: res.Name}, snap)
		switch {
		case apierrors.IsNotFound(err):
			return false, nil
		case err != nil:
			return false, err
		}
		return snap.UID == res.UID && quota.CountSnapshots([]sandboxv1alpha1.SandboxSnapshot{*snap}, "").Count > 0, nil
	}
	sbx := &sandboxv1alpha1.Sandbox{}
	err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: res.Name}, sbx)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return sbx.UID == res.UID && quota.Counts(sbx), nil
}

func (r *Reconciler) setCondition(q *sandboxv1alpha1.SandboxQuota, t sandboxv1alpha1.ConditionType, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&q.Status.Conditions, metav1.Condition{
		Type:               string(t),
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: q.Generation,
		LastTransitionTime: metav1.NewTime(r.clock.Now()),
	})
}
