/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package admission is the validating webhook that enforces SandboxQuota.
//
// A create is checked against every SandboxQuota in the Sandbox's namespace
// and, if it fits, charged to each of them before it is admitted: the
// webhook adds the Sandbox's usage to status.used and records a reservation,
// writing the quota with its resourceVersion. Two creates racing for the
// last unit of a quota cannot both succeed, because the second write fails
// with a conflict and is re-checked against the first one's charge. This is
// how Kubernetes' own ResourceQuota admission works, and it is why the check
// never trusts a count taken from a cache.
//
// A Sandbox that claims from a SandboxWarmPool is checked and charged as the
// pool's template makes it, and SandboxWarmPool templates are checked
// against the quotas' rules (warmpool.go).
package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// MaxReservations is the most reservations (admitted Sandboxes not yet
// counted by the quota controller, which counts within seconds) one
// SandboxQuota records; a create beyond it is refused as QuotaExceeded
// until the controller catches up. 500 reservations keep the status
// under about 200 KiB, far below etcd's object size limit.
const MaxReservations = 500

// fieldReservations is the field a QuotaExceeded cause names when the
// quota records MaxReservations already.
const fieldReservations = "status.reservations"

// fieldDeadline is the field a lifetime rule's QuotaRule cause names.
const fieldDeadline = "spec.activeDeadlineSeconds"

// fieldEgress is the field an egress rule's QuotaRule cause names.
const fieldEgress = "spec.network.egress"

// denied refuses the Sandbox name for causes (subresource.CauseQuota*): a 403
// Forbidden Status whose message is the causes' messages joined by "; ",
// exactly as people read it, and whose details carry the causes, so that
// clients tell quota usage from quota rules without reading the message.
// kube-apiserver passes the Status on, prefixing the message with
// `admission webhook "…" denied the request: `.
func denied(name string, causes []metav1.StatusCause) admission.Response {
	return deniedKind(subresource.StatusKind, name, causes)
}

// deniedKind is denied for an object of another resource (details.kind).
func deniedKind(kind, name string, causes []metav1.StatusCause) admission.Response {
	msgs := make([]string, len(causes))
	for i, c := range causes {
		msgs[i] = c.Message
	}
	resp := admission.Denied(strings.Join(msgs, "; "))
	resp.Result.Details = &metav1.StatusDetails{Name: name, Group: subresource.StatusGroup, Kind: kind, Causes: causes}
	return resp
}

// errored is admission.Errored with the standard reason for code
// (BadRequest or InternalError), for clients that decide by the reason.
func errored(code int32, err error) admission.Response {
	resp := admission.Errored(code, err)
	resp.Result.Reason = metav1.StatusReasonInternalError
	if code == http.StatusBadRequest {
		resp.Result.Reason = metav1.StatusReasonBadRequest
	}
	return resp
}

// Path is where the webhook server serves the Sandbox validator; the
// ValidatingWebhookConfiguration in config/webhook points at it.
const Path = "/validate-sandbox-code-sandbox-dev-v1alpha1-sandbox"

// The webhook reads quotas and Sandboxes and charges quota status.
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxquotas/status,verbs=get;update;patch
// It reads warm pools to check what their claimants will run. It deletes
// nothing: the pool controller evicts members (see makeRoom).
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxwarmpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes,verbs=get;list;watch

// SandboxValidator admits Sandboxes that every SandboxQuota in their
// namespace allows, and charges them to those quotas.
type SandboxValidator struct {
	charger
	decoder admission.Decoder
	// poolController is the user the warm pool controller creates members
	// as; see WithPoolController.
	poolController string
}

// charger charges quotas: the one reservation path of Sandboxes and
// SandboxSnapshots.
type charger struct {
	// reader lists quotas from the API server itself, not a cache: the
	// decision must be made against the newest quota.
	reader client.Reader
	writer client.Client
	clock  clock.PassiveClock
}

// NewSandboxValidator builds the validator. reader must read from the API
// server directly (a manager's GetAPIReader); writer writes quota status.
func NewSandboxValidator(reader client.Reader, writer client.Client, scheme *runtime.Scheme, clk clock.PassiveClock) *SandboxValidator {
	return &SandboxValidator{charger: charger{reader: reader, writer: writer, clock: clk}, decoder: admission.NewDecoder(scheme)}
}

// WithPoolController names the user the warm pool controller
// (controllers/sandboxwarmpool) creates members as: the only one whose
// creates may carry warm pool membership (see newMember). Without it,
// every such create is refused.
func (v *SandboxValidator) WithPoolController(username string) *SandboxValidator {
	v.poolController = username
	return v
}

// Handle implements admission.Handler.
func (v *SandboxValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	sbx := &sandboxv1alpha1.Sandbox{}
	if err := v.decoder.Decode(req, sbx); err != nil {
		return errored(http.StatusBadRequest, fmt.Errorf("decoding the Sandbox: %w", err))
	}
	// The name and UID are assigned before validating admission; the
	// request's copy is a fallback for API servers that send them apart.
	if sbx.Name == "" {
		sbx.Name = req.Name
	}
	if sbx.Namespace == "" {
		sbx.Namespace = req.Namespace
	}
	switch req.Operation {
	case admissionv1.Create:
		return v.create(ctx, req, sbx)
	case admissionv1.Update:
		return v.update(ctx, req, sbx)
	}
	return admission.Allowed("")
}

// update checks the fields that may change on a live Sandbox and that a
// quota limits: activeDeadlineSeconds and the egress policy
// (spec.network.egress). Usage cannot change, because resources are
// immutable. It also keeps warm pool membership as it was
// created (see membership).
func (v *SandboxValidator) update(ctx context.Context, req admission.Request, sbx *sandboxv1alpha1.Sandbox) admission.Response {
	old := &sandboxv1alpha1.Sandbox{}
	if err := v.decoder.DecodeRaw(req.OldObject, old); err != nil {
		return errored(http.StatusBadRequest, fmt.Errorf("decoding the old Sandbox: %w", err))
	}
	if resp := v.membership(ctx, old, sbx); resp != nil {
		return *resp
	}
	deadline := !equalDeadline(old.Spec.ActiveDeadlineSeconds, sbx.Spec.ActiveDeadlineSeconds)
	// A claimant's network is its pool template's (warmpool.Effective),
	// checked when the template was; its own is not used.
	egress := sbx.Spec.WarmPoolRef == nil && !equality.Semantic.DeepEqual(old.Spec.Network.Egress, sbx.Spec.Network.Egress)
	if !deadline && !egress {
		return admission.Allowed("")
	}
	quotas, err := v.quotas(ctx, sbx.Namespace)
	if err != nil {
		return errored(http.StatusInternalServerError, err)
	}
	var causes []metav1.StatusCause
	for i := range quotas {
		if !deadline {
			break
		}
		if msg := quota.DeadlineViolation(&quotas[i], sbx.Spec.ActiveDeadlineSeconds); msg != "" {
			causes = append(causes, metav1.StatusCause{Type: subresource.CauseQuotaRule, Field: fieldDeadline, Message: msg})
		}
	}
	for i := range quotas {
		if !egress {
			break
		}
		for _, msg := range quota.EgressViolations(&quotas[i], &sbx.Spec.Network) {
			causes = append(causes, metav1.StatusCause{Type: subresource.CauseQuotaRule, Field: fieldEgress, Message: msg})
		}
	}
	if len(causes) > 0 {
		return denied(sbx.Name, causes)
	}
	return admission.Allowed("")
}

func equalDeadline(a, b *int64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func (v *SandboxValidator) create(ctx context.Context, req admission.Request, sbx *sandboxv1alpha1.Sandbox) admission.Response {
	if sbx.UID == "" {
		// Without a UID the reservation could not be matched to the
		// Sandbox later; no supported API server sends one without it.
		return errored(http.StatusBadRequest, errors.New("the Sandbox in the admission request has no metadata.uid"))
	}
	// Before the quotas: membership is refused in every namespace.
	if resp := v.newMember(req, sbx); resp != nil {
		return *resp
	}
	quotas, err := v.quotas(ctx, sbx.Namespace)
	if err != nil {
		return errored(http.StatusInternalServerError, err)
	}
	if len(quotas) == 0 {
		return admission.Allowed("")
	}

	// A claimant is charged and checked as what it will run: its spec with
	// the pool's template, which is where its container's shape comes from.
	checked := sbx
	var pool *sandboxv1alpha1.SandboxWarmPool
	if ref := sbx.Spec.WarmPoolRef; ref != nil {
		pool = &sandboxv1alpha1.SandboxWarmPool{}
		if err := v.reader.Get(ctx, client.ObjectKey{Namespace: sbx.Namespace, Name: ref.Name}, pool); err != nil {
			if apierrors.IsNotFound(err) {
				return denied(sbx.Name, []metav1.StatusCause{{Type: subresource.CauseWarmPoolNotFound, Field: "spec.warmPoolRef.name",
					Message: fmt.Sprintf("SandboxWarmPool %q does not exist in namespace %s, so the Sandbox cannot be checked against the namespace's sandbox quotas; create the pool first",
						ref.Name, sbx.Namespace)}})
			}
			return errored(http.StatusInternalServerError, fmt.Errorf("reading SandboxWarmPool %s/%s: %w", sbx.Namespace, ref.Name, err))
		}
		checked = sbx.DeepCopy()
		warmpool.ApplyTemplate(&checked.Spec, pool.Spec.Template)
	}

	// Rules first: they need no charge, and a Sandbox they forbid should
	// hear about that rather than about usage.
	var causes []metav1.StatusCause
	for i := range quotas {
		deadline := quota.DeadlineViolation(&quotas[i], sbx.Spec.ActiveDeadlineSeconds)
		for _, msg := range quota.Violations(&quotas[i], checked) {
			c := metav1.StatusCause{Type: subresource.CauseQuotaRule, Message: msg}
			switch {
			case msg == deadline:
				c.Field = fieldDeadline
			case pool != nil:
				c.Message += fmt.Sprintf(" (set by the template of SandboxWarmPool %q)", pool.Name)
			}
			causes = append(causes, c)
		}
	}
	if len(causes) > 0 {
		return denied(sbx.Name, causes)
	}

	usage := quota.Usage(checked)
	dryRun := req.DryRun != nil && *req.DryRun
	refusal, resp := v.chargeAll(ctx, quotas, sandboxSubject(sbx), usage, dryRun, nil, nil)
	// Evicting a warm pool member frees usage, not reservations.
	if refusal != nil && refusal.Type == subresource.CauseQuotaExceeded && refusal.Field != fieldReservations && pool != nil {
		return v.makeRoom(ctx, sbx, pool, usage, dryRun, *refusal)
	}
	return resp
}

// subject is what a charge is for: a Sandbox or a SandboxSnapshot. Both are
// charged by this one path (chargeAll, charge, release), so they are
// reserved alike.
type subject struct {
	// kind is the reservation's kind: "" for a Sandbox,
	// ReservationKindSnapshot for a snapshot.
	kind string
	// details is details.kind of a refusal.
	details   string
	namespace string
	name      string
	uid       types.UID
}

func sandboxSubject(sbx *sandboxv1alpha1.Sandbox) subject {
	return subject{details: subresource.StatusKind, namespace: sbx.Namespace, name: sbx.Name, uid: sbx.UID}
}

// chargeAll charges sbx to every quota, or to none. base, if not nil, is
// what each quota is taken to have used instead of its status.used; room,
// if not nil, is usage about to be freed (see makeRoom). A refusal is
// returned with the response that carries it.
func (v *charger) chargeAll(ctx context.Context, quotas []sandboxv1alpha1.SandboxQuota, sbx subject,
	usage sandboxv1alpha1.SandboxQuotaUsage, dryRun bool, base baseFunc, room *sandboxv1alpha1.SandboxQuotaUsage) (*metav1.StatusCause, admission.Response) {
	log := logf.FromContext(ctx).WithValues("object", client.ObjectKey{Namespace: sbx.namespace, Name: sbx.name}, "uid", sbx.uid)
	var charged []string
	for i := range quotas {
		refusal, err := v.charge(ctx, &quotas[i], sbx, usage, dryRun, base, room)
		if err == nil && refusal == nil {
			if !dryRun {
				charged = append(charged, quotas[i].Name)
			}
			continue
		}
		// All quotas or none: undo what was charged before this one.
		v.release(ctx, sbx, charged)
		if err != nil {
			log.Error(err, "charging the Sandbox to its quota", "quota", quotas[i].Name)
			return nil, errored(http.StatusInternalServerError,
				fmt.Errorf("sandbox quota %q: could not record usage: %w", quotas[i].Name, err))
		}
		return refusal, deniedKind(sbx.details, sbx.name, []metav1.StatusCause{*refusal})
	}
	if len(charged) > 0 {
		log.V(1).Info("charged to quotas", "quotas", charged, "usage", quota.Summary(sandboxv1alpha1.SandboxQuotaHard{}, usage))
	}
	return nil, admission.Allowed("")
}

// quotas lists the namespace's SandboxQuotas from the API server.
func (v *charger) quotas(ctx context.Context, namespace string) ([]sandboxv1alpha1.SandboxQuota, error) {
	var list sandboxv1alpha1.SandboxQuotaList
	if err := v.reader.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing the SandboxQuotas in namespace %s: %w", namespace, err)
	}
	return list.Items, nil
}

// charge adds usage to q and records a reservation for sbx, retrying on
// conflicts until it succeeds, the quota refuses (refusal: why, as a
// QuotaExceeded or QuotaNotCounted cause), or ctx ends. With dryRun it only
// checks.
// With base, the quota's usage is what base says rather than its
// status.used. With room, the check subtracts it (usage the pool
// controller is about to free), but the charge written does not: the
// quota shows what is really held until the member is gone.
func (v *charger) charge(ctx context.Context, q *sandboxv1alpha1.SandboxQuota, sbx subject,
	usage sandboxv1alpha1.SandboxQuotaUsage, dryRun bool, base baseFunc, room *sandboxv1alpha1.SandboxQuotaUsage) (refusal *metav1.StatusCause, err error) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			fresh := &sandboxv1alpha1.SandboxQuota{}
			if err := v.reader.Get(ctx, client.ObjectKeyFromObject(q), fresh); err != nil {
				if apierrors.IsNotFound(err) {
					return nil, nil // deleted meanwhile: nothing left to charge
				}
				return nil, fmt.Errorf("reading the quota: %w", err)
			}
			q = fresh
		}
		if hasReservation(q, sbx.uid) {
			return nil, nil // charged by an earlier call for this very request
		}
		if q.Status.ObservedGeneration == 0 {
			// Like ResourceQuota's "status unknown for quota": a quota
			// whose usage has never been counted cannot say what fits.
			return &metav1.StatusCause{Type: subresource.CauseQuotaNotCounted,
				Message: fmt.Sprintf("sandbox quota %q has not counted its usage yet; retry in a few seconds", q.Name)}, nil
		}
		used := q.Status.Used
		if base != nil {
			if used, err = base(ctx, q); err != nil {
				return nil, err
			}
		}
		checked := used
		if room != nil {
			checked = quota.Sub(used, *room)
		}
		if over := quota.Exceeds(q.Spec.Hard, checked, usage); len(over) > 0 {
			return &metav1.StatusCause{Type: subresource.CauseQuotaExceeded, Message: quota.ExceededMessage(q.Name, over)}, nil
		}
		if len(q.Status.Reservations) >= MaxReservations {
			// Every reservation is a few hundred bytes of the quota's
			// status; without a cap, creates (or forged admission
			// requests) faster than the controller counts would grow the
			// object toward etcd's size limit, after which no charge,
			// count or spec change of the quota could be written.
			return &metav1.StatusCause{Type: subresource.CauseQuotaExceeded, Field: fieldReservations,
				Message: fmt.Sprintf("sandbox quota %q has %d %s admitted but not yet counted, the most it records; retry in a few seconds",
					q.Name, len(q.Status.Reservations), admittedNoun(q.Status.Reservations))}, nil
		}
		if dryRun {
			return nil, nil
		}
		q.Status.Used = quota.Add(used, usage)
		q.Status.Reservations = append(q.Status.Reservations, sandboxv1alpha1.SandboxQuotaReservation{
			Kind:  sbx.kind,
			Name:  sbx.name,
			UID:   sbx.uid,
			Time:  metav1.NewTime(v.clock.Now()),
			Usage: usage,
		})
		q.Status.Summary = quota.Summary(q.Spec.Hard, q.Status.Used)
		err := v.writer.Status().Update(ctx, q)
		switch {
		case err == nil:
			return nil, nil
		case apierrors.IsConflict(err):
			if ctx.Err() != nil {
				return nil, fmt.Errorf("gave up after %d conflicting updates: %w", attempt+1, ctx.Err())
			}
			continue
		case apierrors.IsNotFound(err):
			return nil, nil
		default:
			return nil, err
		}
	}
}

// admittedNoun names what the reservations stand for: "Sandboxes" (the
// wording since before snapshots were charged), or "Sandboxes and
// SandboxSnapshots" once any is a snapshot's.
func admittedNoun(reservations []sandboxv1alpha1.SandboxQuotaReservation) string {
	for _, r := range reservations {
		if r.Kind == sandboxv1alpha1.ReservationKindSnapshot {
			return "Sandboxes and SandboxSnapshots"
		}
	}
	return "Sandboxes"
}

func hasReservation(q *sandboxv1alpha1.SandboxQuota, uid types.UID) bool {
	for _, r := range q.Status.Reservations {
		if r.UID == uid {
			return true
		}
	}
	return false
}

// release takes back the charges made for sbx on the named quotas. It is
// best effort: a reservation it cannot remove names a Sandbox that never
// gets stored, and the quota controller drops it once it is overdue.
func (v *charger) release(ctx context.Context, sbx subject, names []string) {
	log := logf.FromContext(ctx)
	// The request may already be out of time; the undo deserves its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, name := range names {
		for {
			q := &sandboxv1alpha1.SandboxQuota{}
			err := v.reader.Get(ctx, client.ObjectKey{Namespace: sbx.namespace, Name: name}, q)
			if err == nil {
				if !removeReservation(q, sbx.uid) {
					break
				}
				err = v.writer.Status().Update(ctx, q)
			}
			if apierrors.IsConflict(err) && ctx.Err() == nil {
				continue
			}
			if err != nil && !apierrors.IsNotFound(err) {
				log.Error(err, "releasing a charge; the quota controller will drop it once overdue", "quota", name, "object", sbx.name)
			}
			break
		}
	}
}

// removeReservation drops uid's reservation from q and subtracts its usage.
func removeReservation(q *sandboxv1alpha1.SandboxQuota, uid types.UID) bool {
	for i, r := range q.Status.Reservations {
		if r.UID != uid {
			continue
		}
		q.Status.Reservations = append(q.Status.Reservations[:i], q.Status.Reservations[i+1:]...)
		q.Status.Used = quota.Sub(q.Status.Used, r.Usage)
		q.Status.Summary = quota.Summary(q.Spec.Hard, q.Status.Used)
		return true
	}
	return false
}
