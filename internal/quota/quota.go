/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package quota is the pure logic of SandboxQuota: what a Sandbox costs,
// whether a quota's rules allow it, whether it fits, and how usage is
// recounted. The admission webhook (internal/admission) and the quota
// controller (controllers/sandboxquota) share it, so that they can never
// disagree about what counts.
package quota

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// The CRD's defaults for spec.resources. The API server applies them before
// admission, so these only matter for objects stored before a default
// existed; they keep such a Sandbox from counting as free.
var (
	DefaultCPU    = resource.MustParse(sandboxv1alpha1.DefaultCPU)
	DefaultMemory = resource.MustParse(sandboxv1alpha1.DefaultMemory)
	DefaultDisk   = resource.MustParse(sandboxv1alpha1.DefaultDisk)
)

// Usage is what a Sandbox takes from a quota: one sandbox and its CPU,
// memory and disk.
func Usage(sbx *sandboxv1alpha1.Sandbox) sandboxv1alpha1.SandboxQuotaUsage {
	r := sbx.Spec.Resources
	pick := func(q *resource.Quantity, def resource.Quantity) resource.Quantity {
		if q == nil {
			return def.DeepCopy()
		}
		return q.DeepCopy()
	}
	return sandboxv1alpha1.SandboxQuotaUsage{
		Sandboxes: 1,
		CPU:       pick(r.CPU, DefaultCPU),
		Memory:    pick(r.Memory, DefaultMemory),
		Disk:      pick(r.Disk, DefaultDisk),
	}
}

// Counts reports whether a Sandbox uses quota. A Sandbox that is being
// deleted, has expired or whose node was lost (NodeLost, terminal) does
// not: its container is being, or has been, removed, or is out of reach,
// and it will never be provisioned again. Both conditions are written only
// by the operator (the node managers, and for NodeLost the control plane),
// and the status policy keeps a NodeLost status from ever changing again.
func Counts(sbx *sandboxv1alpha1.Sandbox) bool {
	if sbx.DeletionTimestamp != nil || sbx.IsNodeLost() {
		return false
	}
	return !meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired))
}

// Add returns a+b.
func Add(a, b sandboxv1alpha1.SandboxQuotaUsage) sandboxv1alpha1.SandboxQuotaUsage {
	out := sandboxv1alpha1.SandboxQuotaUsage{
		Sandboxes:     a.Sandboxes + b.Sandboxes,
		CPU:           a.CPU.DeepCopy(),
		Memory:        a.Memory.DeepCopy(),
		Disk:          a.Disk.DeepCopy(),
		Snapshots:     a.Snapshots + b.Snapshots,
		SnapshotBytes: resource.NewQuantity(SnapshotBytes(a)+SnapshotBytes(b), resource.BinarySI),
	}
	out.CPU.Add(b.CPU)
	out.Memory.Add(b.Memory)
	out.Disk.Add(b.Disk)
	return canonical(out)
}

// SnapshotBytes is u's snapshot bytes (0 when unset).
func SnapshotBytes(u sandboxv1alpha1.SandboxQuotaUsage) int64 {
	if u.SnapshotBytes == nil {
		return 0
	}
	return u.SnapshotBytes.Value()
}

// SnapshotRequest is what one SandboxSnapshot is charged at admission: one
// snapshot, and no bytes, since its size is known only once its node has
// read the files (the quota controller then counts status.sizeBytes).
func SnapshotRequest() sandboxv1alpha1.SandboxQuotaUsage {
	u := Zero()
	u.Snapshots = 1
	return u
}

// Sub returns a-b, never below zero: usage recorded before a quota was
// counted may be smaller than what a rollback takes back.
func Sub(a, b sandboxv1alpha1.SandboxQuotaUsage) sandboxv1alpha1.SandboxQuotaUsage {
	out := sandboxv1alpha1.SandboxQuotaUsage{
		Sandboxes:     max(0, a.Sandboxes-b.Sandboxes),
		CPU:           a.CPU.DeepCopy(),
		Memory:        a.Memory.DeepCopy(),
		Disk:          a.Disk.DeepCopy(),
		Snapshots:     max(0, a.Snapshots-b.Snapshots),
		SnapshotBytes: resource.NewQuantity(max(0, SnapshotBytes(a)-SnapshotBytes(b)), resource.BinarySI),
	}
	for _, p := range []struct{ dst, sub *resource.Quantity }{{&out.CPU, &b.CPU}, {&out.Memory, &b.Memory}, {&out.Disk, &b.Disk}} {
		p.dst.Sub(*p.sub)
		if p.dst.Sign() < 0 {
			*p.dst = resource.Quantity{}
		}
	}
	return canonical(out)
}

// canonical rewrites quantities so that equal amounts compare and print the
// same whatever sums produced them (1000m and 1 are both "1").
func canonical(u sandboxv1alpha1.SandboxQuotaUsage) sandboxv1alpha1.SandboxQuotaUsage {
	u.CPU = *resource.NewMilliQuantity(u.CPU.MilliValue(), resource.DecimalSI)
	u.Memory = *resource.NewQuantity(u.Memory.Value(), resource.BinarySI)
	u.Disk = *resource.NewQuantity(u.Disk.Value(), resource.BinarySI)
	// Unset when zero, so that a Sandbox's reservation does not carry it.
	if b := SnapshotBytes(u); b != 0 {
		u.SnapshotBytes = resource.NewQuantity(b, resource.BinarySI)
	} else {
		u.SnapshotBytes = nil
	}
	return u
}

// Zero is no usage, in canonical form.
func Zero() sandboxv1alpha1.SandboxQuotaUsage {
	return canonical(sandboxv1alpha1.SandboxQuotaUsage{})
}

// Equal reports whether two usages are the same amounts.
func Equal(a, b sandboxv1alpha1.SandboxQuotaUsage) bool {
	return a.Sandboxes == b.Sandboxes && a.CPU.Cmp(b.CPU) == 0 && a.Memory.Cmp(b.Memory) == 0 && a.Disk.Cmp(b.Disk) == 0 &&
		a.Snapshots == b.Snapshots && SnapshotBytes(a) == SnapshotBytes(b)
}

// Overage is one limit that a request would break.
type Overage struct {
	Resource  string
	Requested string
	Used      string
	Hard      string
	Over      string
	// Note, when set, replaces "(Over over)".
	Note string
}

func (o Overage) String() string {
	if o.Note != "" {
		return fmt.Sprintf("%s: requested %s, used %s, limit %s (%s)", o.Resource, o.Requested, o.Used, o.Hard, o.Note)
	}
	return fmt.Sprintf("%s: requested %s, used %s, limit %s (%s over)", o.Resource, o.Requested, o.Used, o.Hard, o.Over)
}

// Exceeds returns the limits in hard that used+req would go past, in a fixed
// order: sandboxes, cpu, memory, disk. A request for a snapshot
// (req.Snapshots > 0) is checked against the snapshot limits only, in the
// order snapshots, snapshotBytes; any other request (a Sandbox, or none)
// against the Sandbox limits only, so that neither kind is refused because
// the other is over a lowered limit.
func Exceeds(hard sandboxv1alpha1.SandboxQuotaHard, used, req sandboxv1alpha1.SandboxQuotaUsage) []Overage {
	if req.Snapshots > 0 {
		return exceedsSnapshots(hard, used, req)
	}
	var out []Overage
	if hard.Sandboxes != nil && used.Sandboxes+req.Sandboxes > *hard.Sandboxes {
		out = append(out, Overage{
			Resource:  "sandboxes",
			Requested: fmt.Sprint(req.Sandboxes),
			Used:      fmt.Sprint(used.Sandboxes),
			Hard:      fmt.Sprint(*hard.Sandboxes),
			Over:      fmt.Sprint(used.Sandboxes + req.Sandboxes - *hard.Sandboxes),
		})
	}
	check := func(name string, hard *resource.Quantity, used, req resource.Quantity, format func(resource.Quantity) string) {
		if hard == nil {
			return
		}
		total := used.DeepCopy()
		total.Add(req)
		if total.Cmp(*hard) <= 0 {
			return
		}
		over := total.DeepCopy()
		over.Sub(*hard)
		out = append(out, Overage{
			Resource:  name,
			Requested: format(req),
			Used:      format(used),
			Hard:      format(*hard),
			Over:      format(over),
		})
	}
	check("cpu", hard.CPU, used.CPU, req.CPU, cpuString)
	check("memory", hard.Memory, used.Memory, req.Memory, bytesString)
	check("disk", hard.Disk, used.Disk, req.Disk, bytesString)
	return out
}

func exceedsSnapshots(hard sandboxv1alpha1.SandboxQuotaHard, used, req sandboxv1alpha1.SandboxQuotaUsage) []Overage {
	var out []Overage
	if hard.Snapshots != nil && used.Snapshots+req.Snapshots > *hard.Snapshots {
		out = append(out, Overage{
			Resource:  "snapshots",
			Requested: fmt.Sprint(req.Snapshots),
			Used:      fmt.Sprint(used.Snapshots),
			Hard:      fmt.Sprint(*hard.Snapshots),
			Over:      fmt.Sprint(used.Snapshots + req.Snapshots - *hard.Snapshots),
		})
	}
	// Every stored snapshot has at least a tar's end blocks, so one with
	// no bytes left cannot fit: at the cap, a new snapshot is refused too.
	if h := hard.SnapshotBytes; h != nil {
		total := SnapshotBytes(used) + SnapshotBytes(req)
		if total > h.Value() || (SnapshotBytes(req) == 0 && total >= h.Value()) {
			out = append(out, Overage{
				Resource:  "snapshotBytes",
				Requested: "a new snapshot",
				Used:      bytesString(*resource.NewQuantity(SnapshotBytes(used), resource.BinarySI)),
				Hard:      bytesString(*h),
				Over:      bytesString(*resource.NewQuantity(total-h.Value(), resource.BinarySI)),
			})
			if total <= h.Value() {
				out[len(out)-1].Note = "no bytes left for its files"
			}
		}
	}
	return out
}

func cpuString(q resource.Quantity) string {
	return resource.NewMilliQuantity(q.MilliValue(), resource.DecimalSI).String()
}

func bytesString(q resource.Quantity) string {
	return resource.NewQuantity(q.Value(), resource.BinarySI).String()
}

// ExceededMessage is the admission message for a request that does not fit
// in quota name. It says which limits and by how much, in the spirit of
// ResourceQuota's "exceeded quota" message.
func ExceededMessage(name string, over []Overage) string {
	parts := make([]string, len(over))
	for i, o := range over {
		parts[i] = o.String()
	}
	return fmt.Sprintf("sandbox quota %q exceeded: %s", name, strings.Join(parts, "; "))
}

// Violations returns why the rules of q (images, runtimes, network, lifetime)
// refuse sbx; nil means they allow it.
func Violations(q *sandboxv1alpha1.SandboxQuota, sbx *sandboxv1alpha1.Sandbox) []string {
	out := ShapeViolations(q, &sbx.Spec)
	if msg := DeadlineViolation(q, sbx.Spec.ActiveDeadlineSeconds); msg != "" {
		out = append(out, msg)
	}
	return out
}

// ShapeViolations returns why the rules of q about the container (images,
// runtimes, network) refuse spec.
func ShapeViolations(q *sandboxv1alpha1.SandboxQuota, s *sandboxv1alpha1.SandboxSpec) []string {
	var out []string
	spec := q.Spec
	if len(spec.AllowedImages) > 0 && !ImageAllowed(spec.AllowedImages, s.Image) {
		norm := NormalizeImage(s.Image)
		shown := fmt.Sprintf("%q", s.Image)
		if norm != "" && norm != s.Image {
			shown += fmt.Sprintf(" (%s)", norm)
		}
		out = append(out, fmt.Sprintf("sandbox quota %q does not allow image %s; allowed images: %s",
			q.Name, shown, strings.Join(spec.AllowedImages, ", ")))
	}
	runtime := s.Runtime
	if runtime == "" {
		runtime = sandboxv1alpha1.RuntimeRunc
	}
	if len(spec.AllowedRuntimes) > 0 && !slices.Contains(spec.AllowedRuntimes, runtime) {
		names := make([]string, len(spec.AllowedRuntimes))
		for i, r := range spec.AllowedRuntimes {
			names[i] = string(r)
		}
		out = append(out, fmt.Sprintf("sandbox quota %q does not allow runtime %q; allowed runtimes: %s",
			q.Name, runtime, strings.Join(names, ", ")))
	}
	return append(out, EgressViolations(q, &s.Network)...)
}

// DeadlineViolation says why q refuses a Sandbox lifetime of deadline
// seconds (nil: none set), or returns "".
func DeadlineViolation(q *sandboxv1alpha1.SandboxQuota, deadline *int64) string {
	max := q.Spec.MaxActiveDeadlineSeconds
	switch {
	case max == nil:
		return ""
	case deadline == nil:
		return fmt.Sprintf("sandbox quota %q requires spec.activeDeadlineSeconds of at most %d; the Sandbox sets none", q.Name, *max)
	case *deadline > *max:
		return fmt.Sprintf("sandbox quota %q allows activeDeadlineSeconds of at most %d; the Sandbox asks for %d (%d over)", q.Name, *max, *deadline, *deadline-*max)
	}
	return ""
}

// Recount is the outcome of counting a quota's usage.
type Recount struct {
	// Used is the namespace's counted Sandboxes plus the reservations kept.
	Used sandboxv1alpha1.SandboxQuotaUsage
	// Reservations are those still pending, in their original order.
	Reservations []sandboxv1alpha1.SandboxQuotaReservation
	// Overdue are reservations older than the timeout whose Sandbox has
	// not been seen; the caller checks each against the API server, then
	// calls Keep for those that turn out to exist after all.
	Overdue []sandboxv1alpha1.SandboxQuotaReservation
	// NextDeadline is when the oldest kept reservation becomes overdue
	// (zero if none is kept).
	NextDeadline time.Time
}

// Keep adds an overdue reservation back as pending.
func (r *Recount) Keep(res sandboxv1alpha1.SandboxQuotaReservation) {
	r.Reservations = append(r.Reservations, res)
	r.Used = Add(r.Used, res.Usage)
}

// Count recounts usage from the namespace's Sandboxes and the quota's
// reservations. A reservation is settled once its Sandbox has been seen,
// listed or known deleted; until then it is charged, because the create
// it stands for may still be on its way to storage. After timeout it is
// overdue and the caller decides. Each Sandbox is charged as charged makes
// it (nil: as it is; warmpool.Charged for a namespace with warm pools), and
// a member another Sandbox claimed is not charged at all (ClaimedMembers).
//
// snapshots are the namespace's SandboxSnapshots, counted as
// CountSnapshots does; a caller that passes none (nil) keeps only the
// snapshot reservations, and must take the snapshot figures from elsewhere.
func Count(reservations []sandboxv1alpha1.SandboxQuotaReservation, sandboxes []sandboxv1alpha1.Sandbox,
	snapshots []sandboxv1alpha1.SandboxSnapshot,
	charged func(*sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox,
	deleted func(types.UID) bool, now time.Time, timeout time.Duration) Recount {
	if charged == nil {
		charged = func(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox { return sbx }
	}
	out := Recount{Used: Zero()}
	seen := make(map[types.UID]bool, len(sandboxes))
	claimed := ClaimedMembers(sandboxes)
	for i := range sandboxes {
		sbx := &sandboxes[i]
		seen[sbx.UID] = true
		if Counts(sbx) && !claimed[sbx.UID] {
			out.Used = Add(out.Used, Usage(charged(sbx)))
		}
	}
	for i := range snapshots {
		seen[snapshots[i].UID] = true
	}
	if snaps := CountSnapshots(snapshots, ""); snaps.Count > 0 {
		u := Zero()
		u.Snapshots = snaps.Count
		u.SnapshotBytes = resource.NewQuantity(snaps.Bytes, resource.BinarySI)
		out.Used = Add(out.Used, u)
	}
	for _, res := range reservations {
		if seen[res.UID] || (deleted != nil && deleted(res.UID)) {
			continue
		}
		due := res.Time.Add(timeout)
		if !now.Before(due) {
			out.Overdue = append(out.Overdue, res)
			continue
		}
		out.Keep(res)
		if out.NextDeadline.IsZero() || due.Before(out.NextDeadline) {
			out.NextDeadline = due
		}
	}
	return out
}

// Summary renders used/hard for each limit, for `kubectl get`.
func Summary(hard sandboxv1alpha1.SandboxQuotaHard, used sandboxv1alpha1.SandboxQuotaUsage) string {
	var parts []string
	if hard.Sandboxes != nil {
		parts = append(parts, fmt.Sprintf("sandboxes: %d/%d", used.Sandboxes, *hard.Sandboxes))
	}
	if hard.CPU != nil {
		parts = append(parts, fmt.Sprintf("cpu: %s/%s", cpuString(used.CPU), cpuString(*hard.CPU)))
	}
	if hard.Memory != nil {
		parts = append(parts, fmt.Sprintf("memory: %s/%s", bytesString(used.Memory), bytesString(*hard.Memory)))
	}
	if hard.Disk != nil {
		parts = append(parts, fmt.Sprintf("disk: %s/%s", bytesString(used.Disk), bytesString(*hard.Disk)))
	}
	if hard.Snapshots != nil {
		parts = append(parts, fmt.Sprintf("snapshots: %d/%d", used.Snapshots, *hard.Snapshots))
	}
	if hard.SnapshotBytes != nil {
		parts = append(parts, fmt.Sprintf("snapshotBytes: %s/%s", bytesString(*resource.NewQuantity(SnapshotBytes(used), resource.BinarySI)), bytesString(*hard.SnapshotBytes)))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("sandboxes: %d (no limits)", used.Sandboxes)
	}
	return strings.Join(parts, ", ")
}

// Exhaustion describes the fullest limits: reason is
// SandboxQuotaReasonOverLimit if usage is above any limit,
// SandboxQuotaReasonLimitReached if it is at one, else
// SandboxQuotaReasonWithinLimits.
func Exhaustion(hard sandboxv1alpha1.SandboxQuotaHard, used sandboxv1alpha1.SandboxQuotaUsage) (reason, message string) {
	var over, full []string
	note := func(name string, cmp int, usedS, hardS string) {
		switch {
		case cmp > 0:
			over = append(over, fmt.Sprintf("%s %s used of %s", name, usedS, hardS))
		case cmp == 0:
			full = append(full, fmt.Sprintf("%s %s of %s", name, usedS, hardS))
		}
	}
	if hard.Sandboxes != nil {
		note("sandboxes", cmp64(used.Sandboxes, *hard.Sandboxes), fmt.Sprint(used.Sandboxes), fmt.Sprint(*hard.Sandboxes))
	}
	if hard.CPU != nil {
		note("cpu", used.CPU.Cmp(*hard.CPU), cpuString(used.CPU), cpuString(*hard.CPU))
	}
	if hard.Memory != nil {
		note("memory", used.Memory.Cmp(*hard.Memory), bytesString(used.Memory), bytesString(*hard.Memory))
	}
	if hard.Disk != nil {
		note("disk", used.Disk.Cmp(*hard.Disk), bytesString(used.Disk), bytesString(*hard.Disk))
	}
	if hard.Snapshots != nil {
		note("snapshots", cmp64(used.Snapshots, *hard.Snapshots), fmt.Sprint(used.Snapshots), fmt.Sprint(*hard.Snapshots))
	}
	if hard.SnapshotBytes != nil {
		b := SnapshotBytes(used)
		note("snapshotBytes", cmp64(b, hard.SnapshotBytes.Value()), bytesString(*resource.NewQuantity(b, resource.BinarySI)), bytesString(*hard.SnapshotBytes))
	}
	switch {
	case len(over) > 0:
		return sandboxv1alpha1.SandboxQuotaReasonOverLimit,
			"over the limit (lowered below what already runs; new Sandboxes are refused until usage drops): " + strings.Join(over, ", ")
	case len(full) > 0:
		return sandboxv1alpha1.SandboxQuotaReasonLimitReached, "fully used: " + strings.Join(full, ", ")
	}
	return sandboxv1alpha1.SandboxQuotaReasonWithinLimits, "every limit has room left"
}

func cmp64(a, b int64) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
}
