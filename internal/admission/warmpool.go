/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// WarmPoolPath is where the webhook server serves the SandboxWarmPool
// validator; the ValidatingWebhookConfiguration in config/webhook points at
// it.
const WarmPoolPath = "/validate-sandbox-code-sandbox-dev-v1alpha1-sandboxwarmpool"

// baseFunc says what a quota has used, for a charge that must not take
// status.used at its word.
type baseFunc func(ctx context.Context, q *sandboxv1alpha1.SandboxQuota) (sandboxv1alpha1.SandboxQuotaUsage, error)

// makeRoom admits a claimant that does not fit (refusal says why) when
// evicting one idle member of its pool would make room for it, and charges
// it in full on top of that member; otherwise the claim is refused as
// before.
//
// Members are charged like any Sandbox, so a pool that fills its quota
// would otherwise refuse the very claims it exists for. The claimant cannot
// simply take over the charge of the member it will run in, because which
// member that is, if any, is decided later by a node's manager.
//
// Admission never deletes anything: an AdmissionReview says only that
// someone asked, not that the claimant was stored (a later webhook may
// refuse it, or the request may be forged), so deleting here would let a
// claim that never happens take a member away. The pool controller evicts
// the member once the claimant exists and still holds none while a quota
// is over its limit (controllers/sandboxwarmpool, evictForClaimants). Until
// then status.used honestly shows the quota one member over, which refuses
// every other create.
func (v *SandboxValidator) makeRoom(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, pool *sandboxv1alpha1.SandboxWarmPool,
	usage sandboxv1alpha1.SandboxQuotaUsage, dryRun bool, refusal metav1.StatusCause) admission.Response {
	refused := denied(sbx.Name, []metav1.StatusCause{refusal})
	quotas, err := v.quotas(ctx, sbx.Namespace)
	if err != nil {
		return errored(http.StatusInternalServerError, err)
	}
	sandboxes, pools, err := v.namespace(ctx, sbx.Namespace)
	if err != nil {
		return errored(http.StatusInternalServerError, err)
	}
	statusUsed := func(q *sandboxv1alpha1.SandboxQuota) sandboxv1alpha1.SandboxQuotaUsage { return q.Status.Used }
	member := warmpool.RoomyMember(quotas, statusUsed, sandboxes, pools, pool, usage)
	if member == nil {
		return refused
	}
	if dryRun {
		return admission.Allowed("")
	}
	// The quotas' status.used may still count the member until the
	// controller recounts, or may not any more: only a count of what the
	// namespace holds now can tell. The member's usage is the room the
	// eviction will make.
	room := quota.Usage(warmpool.Charged(member, pools))
	_, resp := v.chargeAll(ctx, quotas, sandboxSubject(sbx), usage, false, v.recount, &room)
	if resp.Allowed {
		logf.FromContext(ctx).Info("admitted a claimant at a full quota; the pool controller evicts an idle member once it exists",
			"sandbox", client.ObjectKeyFromObject(sbx), "uid", sbx.UID, "pool", pool.Name, "member", member.Name)
	}
	return resp
}

// recount is a baseFunc: the quota's usage counted from the namespace as
// the API server has it now, with every reservation still recorded.
func (v *SandboxValidator) recount(ctx context.Context, q *sandboxv1alpha1.SandboxQuota) (sandboxv1alpha1.SandboxQuotaUsage, error) {
	sandboxes, pools, err := v.namespace(ctx, q.Namespace)
	if err != nil {
		return sandboxv1alpha1.SandboxQuotaUsage{}, err
	}
	// A reservation whose Sandbox is not listed may stand for a create
	// still in flight; only the controller decides when it is overdue.
	charged := func(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox { return warmpool.Charged(sbx, pools) }
	count := quota.Count(q.Status.Reservations, sandboxes, nil, charged, nil, v.clock.Now(), 0)
	for _, res := range count.Overdue {
		count.Keep(res)
	}
	// Snapshots are not listed here: their figures, reservations
	// included, stay as the quota records them.
	count.Used.Snapshots = q.Status.Used.Snapshots
	count.Used.SnapshotBytes = q.Status.Used.SnapshotBytes
	return count.Used, nil
}

// namespace lists the namespace's Sandboxes and warm pools from the API
// server.
func (v *SandboxValidator) namespace(ctx context.Context, namespace string) ([]sandboxv1alpha1.Sandbox, warmpool.Templates, error) {
	var sandboxes sandboxv1alpha1.SandboxList
	if err := v.reader.List(ctx, &sandboxes, client.InNamespace(namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing the Sandboxes in namespace %s: %w", namespace, err)
	}
	var pools sandboxv1alpha1.SandboxWarmPoolList
	if err := v.reader.List(ctx, &pools, client.InNamespace(namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing the SandboxWarmPools in namespace %s: %w", namespace, err)
	}
	return sandboxes.Items, warmpool.TemplatesOf(pools.Items), nil
}

// membership refuses an update that makes sbx a warm pool member, moves it
// to another pool, or takes it out of a pool that still exists: the
// warm-pool label and a controller ownerReference to a SandboxWarmPool are
// the pool controller's to set when it creates a member. A member must
// never have been used before it is claimed (the node API refuses exec on
// members for that), and a Sandbox that joined a pool later could have
// been. Leaving a pool that is gone or being deleted is allowed, because
// the garbage collector orphans members that way.
func (v *SandboxValidator) membership(ctx context.Context, old, sbx *sandboxv1alpha1.Sandbox) *admission.Response {
	oldLabel, oldHas := old.Labels[sandboxv1alpha1.LabelWarmPool]
	newLabel, newHas := sbx.Labels[sandboxv1alpha1.LabelWarmPool]
	oldRef, newRef := poolRef(old), poolRef(sbx)
	labelSame := oldHas == newHas && oldLabel == newLabel
	refSame := sameRef(oldRef, newRef)
	if labelSame && refSame {
		return nil
	}
	field := "metadata.labels"
	if labelSame {
		field = "metadata.ownerReferences"
	}
	joins := (newHas && !labelSame) || (newRef != nil && !refSame)
	if !joins {
		if oldRef == nil {
			return nil // it never was a member
		}
		gone, err := v.poolGone(ctx, old.Namespace, oldRef)
		if err != nil {
			resp := errored(http.StatusInternalServerError, err)
			return &resp
		}
		if gone {
			return nil
		}
		resp := denied(sbx.Name, []metav1.StatusCause{{Type: subresource.CauseWarmPoolMembership, Field: field,
			Message: fmt.Sprintf("Sandbox %q is a member of SandboxWarmPool %q: its %s label and controller ownerReference stay as the pool created them while the pool exists",
				sbx.Name, oldRef.Name, sandboxv1alpha1.LabelWarmPool)}})
		return &resp
	}
	resp := denied(sbx.Name, []metav1.StatusCause{{Type: subresource.CauseWarmPoolMembership, Field: field,
		Message: fmt.Sprintf("Sandbox %q cannot join a warm pool or move to another one: the %s label and the controller ownerReference to a SandboxWarmPool are set only by the pool when it creates a member, which must never have been used",
			sbx.Name, sandboxv1alpha1.LabelWarmPool)}})
	return &resp
}

// newMember refuses a Sandbox created with warm pool membership (a pool's
// label or an ownerReference to a SandboxWarmPool) by anyone but the pool
// controller. A claim hands a member's container over as the template's,
// and the member stops counting against quotas once claimed, so a member
// made by a user, with the user's image, command, resources and network,
// would reach every claimant and escape the quota by any ratio. The
// manager also claims only members whose spec is the template's
// (warmpool.Matches); this keeps them from existing at all, in every
// namespace, quota or not (config/policy/sandbox_member_policy.yaml does
// the same in the API server).
func (v *SandboxValidator) newMember(req admission.Request, sbx *sandboxv1alpha1.Sandbox) *admission.Response {
	field := ""
	for _, l := range []string{sandboxv1alpha1.LabelWarmPool, sandboxv1alpha1.LabelTemplateHash} {
		if _, ok := sbx.Labels[l]; ok {
			field = "metadata.labels"
		}
	}
	for i := range sbx.OwnerReferences {
		ref := &sbx.OwnerReferences[i]
		if gv, err := schema.ParseGroupVersion(ref.APIVersion); ref.Kind == "SandboxWarmPool" && err == nil && gv.Group == sandboxv1alpha1.GroupVersion.Group {
			field = "metadata.ownerReferences"
		}
	}
	if field == "" || (v.poolController != "" && req.UserInfo.Username == v.poolController) {
		return nil
	}
	resp := denied(sbx.Name, []metav1.StatusCause{{Type: subresource.CauseWarmPoolMembership, Field: field,
		Message: fmt.Sprintf("only the warm pool controller creates warm pool members: a Sandbox created by %s may not carry the %s or %s label or an ownerReference to a SandboxWarmPool; claim from a pool with spec.warmPoolRef instead",
			req.UserInfo.Username, sandboxv1alpha1.LabelWarmPool, sandboxv1alpha1.LabelTemplateHash)}})
	return &resp
}

// poolRef is sbx's controller ownerReference if it points at a
// SandboxWarmPool (of any version), else nil.
func poolRef(sbx *sandboxv1alpha1.Sandbox) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(sbx)
	if ref == nil || ref.Kind != "SandboxWarmPool" {
		return nil
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != sandboxv1alpha1.GroupVersion.Group {
		return nil
	}
	return ref
}

func sameRef(a, b *metav1.OwnerReference) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID
}

// poolGone reports whether the pool ref names no longer exists (or is
// another pool of that name) or is being deleted.
func (v *SandboxValidator) poolGone(ctx context.Context, namespace string, ref *metav1.OwnerReference) (bool, error) {
	pool := &sandboxv1alpha1.SandboxWarmPool{}
	err := v.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, pool)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading SandboxWarmPool %s/%s: %w", namespace, ref.Name, err)
	}
	return pool.UID != ref.UID || pool.DeletionTimestamp != nil, nil
}

// WarmPoolValidator refuses SandboxWarmPools whose template a SandboxQuota
// of their namespace does not allow (images, runtimes, egress). Nothing is
// charged: each member is charged when the pool creates it.
type WarmPoolValidator struct {
	reader  client.Reader
	decoder admission.Decoder
}

// NewWarmPoolValidator builds the validator. reader must read from the API
// server directly (a manager's GetAPIReader).
func NewWarmPoolValidator(reader client.Reader, scheme *runtime.Scheme) *WarmPoolValidator {
	return &WarmPoolValidator{reader: reader, decoder: admission.NewDecoder(scheme)}
}

// Handle implements admission.Handler.
func (v *WarmPoolValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	pool := &sandboxv1alpha1.SandboxWarmPool{}
	if err := v.decoder.Decode(req, pool); err != nil {
		return errored(http.StatusBadRequest, fmt.Errorf("decoding the SandboxWarmPool: %w", err))
	}
	if pool.Name == "" {
		pool.Name = req.Name
	}
	if pool.Namespace == "" {
		pool.Namespace = req.Namespace
	}
	var old *sandboxv1alpha1.SandboxWarmPool
	switch req.Operation {
	case admissionv1.Create:
	case admissionv1.Update:
		old = &sandboxv1alpha1.SandboxWarmPool{}
		if err := v.decoder.DecodeRaw(req.OldObject, old); err != nil {
			return errored(http.StatusBadRequest, fmt.Errorf("decoding the old SandboxWarmPool: %w", err))
		}
		// Scaling, finalizers and deletion never depend on the quotas.
		if pool.DeletionTimestamp != nil || apiequality.Semantic.DeepEqual(old.Spec.Template, pool.Spec.Template) {
			return admission.Allowed("")
		}
	default:
		return admission.Allowed("")
	}
	var list sandboxv1alpha1.SandboxQuotaList
	if err := v.reader.List(ctx, &list, client.InNamespace(pool.Namespace)); err != nil {
		return errored(http.StatusInternalServerError, fmt.Errorf("listing the SandboxQuotas in namespace %s: %w", pool.Namespace, err))
	}
	// The lifetime is each claimant's own, so only the shape is checked.
	var shape sandboxv1alpha1.SandboxSpec
	warmpool.ApplyTemplate(&shape, pool.Spec.Template)
	var causes []metav1.StatusCause
	for i := range list.Items {
		for _, msg := range quota.ShapeViolations(&list.Items[i], &shape) {
			causes = append(causes, metav1.StatusCause{Type: subresource.CauseQuotaRule, Message: msg})
		}
	}
	if len(causes) > 0 {
		return deniedKind(subresource.StatusKindWarmPool, pool.Name, causes)
	}
	if len(list.Items) == 0 {
		return admission.Allowed("")
	}
	if old != nil {
		causes = templateGrowth(list.Items, old, pool)
	} else {
		var err error
		if causes, err = v.waitingClaimants(ctx, pool); err != nil {
			return errored(http.StatusInternalServerError, err)
		}
	}
	if len(causes) > 0 {
		return deniedKind(subresource.StatusKindWarmPool, pool.Name, causes)
	}
	return admission.Allowed("")
}

// A claimant is charged at its pool's template when it is created, and the
// manager makes its container from the template it finds at the claim
// (warm or cold). So that the container is never bigger than the charge,
// a template in a namespace with quotas never grows in what a quota limits
// (cpu, memory, disk): a claimant admitted before the change may be
// claimed after it. It may shrink, or change otherwise. To grow it, create
// a new pool (or delete this one once no claim waits for it).
func templateGrowth(quotas []sandboxv1alpha1.SandboxQuota, old, pool *sandboxv1alpha1.SandboxWarmPool) []metav1.StatusCause {
	var before, after sandboxv1alpha1.Sandbox
	warmpool.ApplyTemplate(&before.Spec, old.Spec.Template)
	warmpool.ApplyTemplate(&after.Spec, pool.Spec.Template)
	was, is := quota.Usage(&before), quota.Usage(&after)
	limited := func(pick func(h sandboxv1alpha1.SandboxQuotaHard) *resource.Quantity) bool {
		for i := range quotas {
			if pick(quotas[i].Spec.Hard) != nil {
				return true
			}
		}
		return false
	}
	var causes []metav1.StatusCause
	for _, r := range []struct {
		field    string
		was, is  resource.Quantity
		limitedF func(h sandboxv1alpha1.SandboxQuotaHard) *resource.Quantity
	}{
		{"cpu", was.CPU, is.CPU, func(h sandboxv1alpha1.SandboxQuotaHard) *resource.Quantity { return h.CPU }},
		{"memory", was.Memory, is.Memory, func(h sandboxv1alpha1.SandboxQuotaHard) *resource.Quantity { return h.Memory }},
		{"disk", was.Disk, is.Disk, func(h sandboxv1alpha1.SandboxQuotaHard) *resource.Quantity { return h.Disk }},
	} {
		if r.is.Cmp(r.was) > 0 && limited(r.limitedF) {
			causes = append(causes, metav1.StatusCause{Type: subresource.CauseQuotaRule, Field: "spec.template.resources." + r.field,
				Message: fmt.Sprintf("the template's %s may not grow from %s to %s while a sandbox quota of namespace %s limits %s: Sandboxes admitted at the old size may still claim from the pool; create a new pool for the bigger template",
					r.field, r.was.String(), r.is.String(), pool.Namespace, r.field)})
		}
	}
	return causes
}

// waitingClaimants refuses creating a pool in a namespace with quotas while
// Sandboxes that name it wait to claim: they were admitted against an
// earlier pool of that name (the webhook refuses claimants of a pool that
// does not exist), charged at its template, and would be claimed from this
// one's.
func (v *WarmPoolValidator) waitingClaimants(ctx context.Context, pool *sandboxv1alpha1.SandboxWarmPool) ([]metav1.StatusCause, error) {
	var list sandboxv1alpha1.SandboxList
	if err := v.reader.List(ctx, &list, client.InNamespace(pool.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the Sandboxes in namespace %s: %w", pool.Namespace, err)
	}
	var waiting []string
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.WarmPoolRef != nil && s.Spec.WarmPoolRef.Name == pool.Name && s.Status.WarmPool == nil && s.DeletionTimestamp == nil {
			waiting = append(waiting, s.Name)
		}
	}
	if len(waiting) == 0 {
		return nil, nil
	}
	sort.Strings(waiting)
	if len(waiting) > 5 {
		waiting = append(waiting[:5], fmt.Sprintf("and %d more", len(waiting)-5))
	}
	return []metav1.StatusCause{{Type: subresource.CauseQuotaRule, Field: "metadata.name",
		Message: fmt.Sprintf("Sandboxes admitted against an earlier SandboxWarmPool %q still wait to claim from it (%s), charged at its template; delete them, or name the new pool differently",
			pool.Name, strings.Join(waiting, ", "))}}, nil
}

// Self returns the user name the API server knows c's credentials by (a
// SelfSubjectReview, as kubectl auth whoami does). The webhook process runs
// the warm pool controller with its own credentials, so this is the name
// WithPoolController needs; asking the API server rather than a flag keeps
// it right whatever the ServiceAccount is called.
func Self(ctx context.Context, c client.Client) (string, error) {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return "", fmt.Errorf("asking the API server who this process is (SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("the API server's SelfSubjectReview names no user")
	}
	return review.Status.UserInfo.Username, nil
}
