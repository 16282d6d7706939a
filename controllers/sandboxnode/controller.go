/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package sandboxnode is the control plane's node-loss controller. For each
// node that has Sandboxes bound to it, it reads the kubelet's node Lease,
// the Node and the node manager's Lease, and when Decide says the node is
// lost it marks the node's Sandboxes NodeLost (Ready=False, terminal) and
// releases the finalizer of those being deleted, whose node manager will
// not come back to do it. The quota controller then stops counting them,
// and the warm pool controller replaces such members on other nodes. See
// docs/node-loss.md.
package sandboxnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodelease"
)

// KubeletLeaseNamespace holds the kubelets' node Leases.
const KubeletLeaseNamespace = "kube-node-lease"

// nodeIndex indexes Sandboxes by status.nodeName in this controller's
// cache (a name of its own: the node role registers status.nodeName).
const nodeIndex = "sandboxnode.status.nodeName"

// Options configure the Reconciler.
type Options struct {
	// ManagerNamespace holds the node managers' Leases (internal/nodelease).
	ManagerNamespace string
	// SkipNameValidation lets several controllers run in one process (tests).
	SkipNameValidation bool
}

// Reconciler reconciles one node at a time: the request's Name is the node.
type Reconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	clock     clock.PassiveClock
	opts      Options
}

// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes/status,verbs=patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update

// NewReconciler builds the node-loss controller. Leases and Nodes are read
// through apiReader (uncached: a few GETs per node and Lease period); the
// clock is injectable, so that expiry is tested without waiting.
func NewReconciler(c client.Client, apiReader client.Reader, recorder events.EventRecorder, clk clock.PassiveClock, opts Options) (*Reconciler, error) {
	if opts.ManagerNamespace == "" {
		return nil, errors.New("the node managers' Lease namespace is required")
	}
	return &Reconciler{client: c, apiReader: apiReader, recorder: recorder, clock: clk, opts: opts}, nil
}

// SetupWithManager watches Sandboxes and reconciles the node each is bound
// to. Nothing watches the Leases: a node is rechecked when its earliest
// current Lease expires (Verdict.RecheckAt), which is exactly when the
// verdict can change by itself.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &sandboxv1alpha1.Sandbox{}, nodeIndex,
		func(o client.Object) []string {
			if node := o.(*sandboxv1alpha1.Sandbox).Status.NodeName; node != "" {
				return []string{node}
			}
			return nil
		}); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("sandboxnode").
		Watches(&sandboxv1alpha1.Sandbox{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			sbx, ok := o.(*sandboxv1alpha1.Sandbox)
			if !ok || sbx.Status.NodeName == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: sbx.Status.NodeName}}}
		}))
	if r.opts.SkipNameValidation {
		b = b.WithOptions(controllerOptions())
	}
	return b.Complete(r)
}

// Reconcile decides whether node req.Name is lost and, if so, settles its
// Sandboxes.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := req.Name
	log := logf.FromContext(ctx).WithValues("node", node)
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.MatchingFields{nodeIndex: node}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the Sandboxes of node %s: %w", node, err)
	}
	if len(list.Items) == 0 {
		return ctrl.Result{}, nil
	}
	obs, err := r.observe(ctx, node)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.clock.Now()
	v := Decide(obs, now)
	if !v.Lost {
		if v.RecheckAt.IsZero() {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{RequeueAfter: max(v.RecheckAt.Sub(now), 0) + time.Millisecond}, nil
	}
	log.Info("node is lost; its Sandboxes are NodeLost", "why", v.Message, "sandboxes", len(list.Items))
	var errs []error
	for i := range list.Items {
		if err := r.settle(ctx, &list.Items[i], v.Message); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	// A Sandbox that a manager bound meanwhile, or one deleted later, comes
	// back through its own watch event.
	return ctrl.Result{}, nil
}

// observe reads what Decide needs, from the API server.
func (r *Reconciler) observe(ctx context.Context, node string) (Observation, error) {
	o := Observation{Node: node, NodeExists: true}
	var n corev1.Node
	switch err := r.apiReader.Get(ctx, client.ObjectKey{Name: node}, &n); {
	case apierrors.IsNotFound(err):
		o.NodeExists = false
	case err != nil:
		return o, fmt.Errorf("reading Node %s: %w", node, err)
	}
	kl := &coordinationv1.Lease{}
	switch err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: KubeletLeaseNamespace, Name: node}, kl); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return o, fmt.Errorf("reading the kubelet Lease of node %s: %w", node, err)
	default:
		o.KubeletLease = kl
	}
	name, err := nodelease.Name(node)
	if err != nil {
		// No manager can hold a Lease for such a node; the kubelet decides.
		return o, nil
	}
	ml := &coordinationv1.Lease{}
	switch err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: r.opts.ManagerNamespace, Name: name}, ml); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return o, fmt.Errorf("reading the manager Lease of node %s: %w", node, err)
	default:
		o.ManagerLease = ml
	}
	return o, nil
}

// settle makes one Sandbox of a lost node NodeLost, and releases the
// finalizer of a deleted one.
func (r *Reconciler) settle(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, why string) error {
	if !sbx.DeletionTimestamp.IsZero() {
		return r.release(ctx, sbx)
	}
	if sbx.IsNodeLost() {
		return nil
	}
	base := sbx.DeepCopy()
	meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
		Type:               string(sandboxv1alpha1.SandboxConditionReady),
		Status:             metav1.ConditionFalse,
		Reason:             sandboxv1alpha1.SandboxReasonNodeLost,
		Message:            why + "; the Sandbox is not provisioned again: delete it and create a new one",
		ObservedGeneration: readyGeneration(base),
	})
	// Optimistic: a manager that came back and wrote meanwhile wins, and
	// the node is decided again.
	if err := r.client.Status().Patch(ctx, sbx, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("marking Sandbox %s/%s NodeLost: %w", sbx.Namespace, sbx.Name, err)
	}
	r.recorder.Eventf(sbx, nil, "Warning", sandboxv1alpha1.SandboxReasonNodeLost, "NodeLost", "%s", why)
	return nil
}

// release removes the node manager's finalizer from a deleted Sandbox of a
// lost node, which that manager cannot do. Should the node return, its
// manager removes the container as an orphan (its Sandbox is gone).
func (r *Reconciler) release(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(sbx, sandboxv1alpha1.FinalizerContainer) {
		return nil
	}
	base := sbx.DeepCopy()
	controllerutil.RemoveFinalizer(sbx, sandboxv1alpha1.FinalizerContainer)
	if err := r.client.Patch(ctx, sbx, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing the finalizer of Sandbox %s/%s on a lost node: %w", sbx.Namespace, sbx.Name, err)
	}
	return nil
}

// readyGeneration keeps the Ready condition's observedGeneration: the
// control plane observes the node, not the spec.
func readyGeneration(sbx *sandboxv1alpha1.Sandbox) int64 {
	if c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)); c != nil {
		return c.ObservedGeneration
	}
	return 0
}

func controllerOptions() controller.Options {
	return controller.Options{SkipNameValidation: ptr.To(true)}
}
