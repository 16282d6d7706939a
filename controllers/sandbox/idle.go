/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// The idle policy of spec.lifecycle: the node manager, which serves every
// exec, file transfer and log read of its Sandboxes (internal/nodeapi),
// keeps their last activity in memory (Activity), persists it to
// status.lastActivityTime at most every activityPersistInterval and always
// before it acts, and pauses or deletes a Sandbox that stayed idle. No MCP
// server or other client decides when a sandbox ends.

// activityPersistInterval throttles the status writes of lastActivityTime:
// a busy Sandbox costs at most one write per interval. A manager restart
// loses at most this much of the idle clock: the clock goes on from the
// persisted time, so such a sandbox idles out at most this much early.
const activityPersistInterval = 30 * time.Second

// Activity records the exec, file transfer and log read activity of this
// node's Sandboxes and thaws an idle-paused container for an operation that
// needs it running. The node API calls Begin (nodeapi.Activity); the
// reconciler reads it. One per manager, shared by both.
type Activity struct {
	clock clock.PassiveClock

	mu      sync.Mutex
	entries map[types.UID]*activityEntry

	// Set by NewSandboxReconciler: how to thaw a container (the freezer
	// path warm claims use, so concurrent operations wait for the same
	// thaw) and how to ask for a reconcile.
	thaw   func(id string) func(context.Context) error
	notify func(namespace, name string, uid types.UID)
}

type activityEntry struct {
	// mu serialises an idle pause with the operations that thaw: a pause
	// checks inflight under it, and Begin thaws under it.
	mu       sync.Mutex
	last     time.Time // last activity, zero if none in this process
	inflight int       // execs and transfers running now
	// frozen is the container this manager froze for idleness, "" if none;
	// known says frozen is this process's knowledge rather than unknown
	// (after a restart the Paused condition says it).
	frozen string
	known  bool
	// notified is when Begin last asked for a reconcile to persist.
	notified time.Time
	// background: a background process was started through this
	// manager's node API and was running when last asked (Background,
	// busyInBackground).
	background bool
	// deleteDue: the last reconcile found the Sandbox idle past
	// idleDeleteSeconds; Reconcile deletes it after its status write.
	deleteDue string
}

// NewActivity returns an empty activity record on clk.
func NewActivity(clk clock.PassiveClock) *Activity {
	return &Activity{clock: clk, entries: map[types.UID]*activityEntry{}}
}

func (a *Activity) entry(uid types.UID) *activityEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.entries[uid]
	if !ok {
		e = &activityEntry{}
		a.entries[uid] = e
	}
	return e
}

// forget drops a Sandbox whose container is gone.
func (a *Activity) forget(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.entries, uid)
}

// Begin records activity on sbx now and returns end, to be called when the
// operation ends (which records activity again). With wake, the operation
// needs the container running: an idle-paused one is thawed before Begin
// returns, and no idle pause happens until end. A container frozen because
// spec.paused is true is never thawed here (such a Sandbox is not Ready and
// the node API refuses it before).
func (a *Activity) Begin(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, wake bool) (end func(), err error) {
	e := a.entry(sbx.UID)
	e.mu.Lock()
	defer e.mu.Unlock()
	now := a.clock.Now()
	e.last = now
	if wake {
		frozen := e.frozen
		if !e.known && idlePaused(sbx) {
			frozen = sbx.Status.ContainerID
		}
		if frozen != "" && !sbx.Spec.Paused && a.thaw != nil {
			thawStart := a.clock.Now()
			if err := a.thaw(frozen)(ctx); err != nil {
				return nil, fmt.Errorf("thawing the idle sandbox %s/%s: %w", sbx.Namespace, sbx.Name, err)
			}
			ObserveStart(PathResume, a.clock.Since(thawStart))
			e.frozen, e.known = "", true
			logf.FromContext(ctx).Info("thawed an idle-paused sandbox", "container", dockerruntime.ShortID(frozen))
			a.ask(sbx, e, now, true)
		}
		e.inflight++
	}
	a.ask(sbx, e, now, false)
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			if wake {
				e.inflight--
			}
			e.last = a.clock.Now()
		})
	}, nil
}

// Background records that a background process was started in sbx (the
// node API calls it after a successful start). It is activity, and until
// busyInBackground finds no process running, a failed process list counts
// as one running.
func (a *Activity) Background(sbx *sandboxv1alpha1.Sandbox) {
	e := a.entry(sbx.UID)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.background = true
	e.last = a.clock.Now()
}

// backgroundListTimeout bounds the process list the idle clock asks for:
// a helper that does not answer must not hold up the reconcile long.
const backgroundListTimeout = 10 * time.Second

// busyInBackground restarts the idle clock of a running sandbox whose idle
// timeout is due while a background process (exec handles, background:
// true) runs in it: such a sandbox is working, though no exec, transfer or
// log read comes. It asks the helper only when a timeout is due, so a
// sandbox costs at most one process list per idle period. It asks every
// running sandbox whose clock is due, not only those this process saw
// start one: a process started before a manager restart still counts. A
// list that fails counts as a running process only when this process saw
// a start (a helper without process support, for example, answers with an
// error and must not keep its sandbox forever).
func (r *SandboxReconciler) busyInBackground(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct *dockerruntime.Container) {
	lc := sbx.Spec.Lifecycle
	if lc == nil || ct == nil || ct.State.Paused || !ct.State.Running || sbx.Spec.Paused ||
		(lc.IdlePauseSeconds == nil && lc.IdleDeleteSeconds == nil) {
		return
	}
	e := r.activity.entry(sbx.UID)
	e.mu.Lock()
	last := lastActivity(sbx, e.last)
	seen := e.background
	inflight := e.inflight
	e.mu.Unlock()
	if last.IsZero() || inflight > 0 {
		return
	}
	due := time.Duration(1<<63 - 1)
	for _, sec := range []*int64{lc.IdlePauseSeconds, lc.IdleDeleteSeconds} {
		if sec != nil && time.Duration(*sec)*time.Second < due {
			due = time.Duration(*sec) * time.Second
		}
	}
	if r.clock.Since(last) < due {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, backgroundListTimeout)
	procs, err := r.docker.ListProcesses(lctx, ct.ID)
	cancel()
	running := false
	for _, p := range procs {
		if p.State == execio.ProcessRunning {
			running = true
			break
		}
	}
	if err != nil {
		logf.FromContext(ctx).Info("could not list the background processes for the idle clock", "error", err.Error(), "counted as running", seen)
		running = seen
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if running {
		e.last = r.clock.Now()
		e.background = true
	} else {
		e.background = false
	}
}

// ask requests a reconcile: always when force, else when the persisted
// last activity is activityPersistInterval behind and none was asked for
// within that interval. Called with e.mu held.
func (a *Activity) ask(sbx *sandboxv1alpha1.Sandbox, e *activityEntry, now time.Time, force bool) {
	if a.notify == nil {
		return
	}
	if !force {
		if p := sbx.Status.LastActivityTime; p != nil && now.Sub(p.Time) < activityPersistInterval {
			return
		}
		if now.Sub(e.notified) < activityPersistInterval {
			return
		}
	}
	e.notified = now
	a.notify(sbx.Namespace, sbx.Name, sbx.UID)
}

// idlePaused says whether the status records an idle pause.
func idlePaused(sbx *sandboxv1alpha1.Sandbox) bool {
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == sandboxv1alpha1.SandboxReasonIdle
}

// lastActivity is the start of the idle clock: the newer of the activity
// this process saw and the persisted one, or status.startTime (the first
// start, or the warm claim) when there was none.
func lastActivity(sbx *sandboxv1alpha1.Sandbox, inMemory time.Time) time.Time {
	last := inMemory
	if p := sbx.Status.LastActivityTime; p != nil && p.After(last) {
		last = p.Time
	}
	if last.IsZero() && sbx.Status.StartTime != nil {
		last = sbx.Status.StartTime.Time
	}
	return last
}

// idleFrozen says whether a paused container (with spec.paused false) was
// frozen for idleness and stays so: this process froze it, or, after a
// restart, the status says so. It records what it found.
func (r *SandboxReconciler) idleFrozen(sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) bool {
	e := r.activity.entry(sbx.UID)
	e.mu.Lock()
	defer e.mu.Unlock()
	frozen := e.frozen == ct.ID || (!e.known && idlePaused(sbx) && sbx.Status.ContainerID == ct.ID)
	if frozen {
		e.frozen, e.known = ct.ID, true
	}
	return frozen
}

// notIdleFrozen records that the container is not frozen for idleness
// (running, or frozen by spec.paused).
func (r *SandboxReconciler) notIdleFrozen(sbx *sandboxv1alpha1.Sandbox) {
	e := r.activity.entry(sbx.UID)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.frozen, e.known = "", true
}

// applyIdle applies spec.lifecycle's idle timeouts to a Sandbox that is not
// a warm pool member, after settlePaused recorded its live container ct
// (nil when its container exited: then only idle deletion applies): it
// persists the last activity (throttled), pauses the container once
// idlePauseSeconds passed (Paused=True, reason Idle; Ready stays True), and
// marks the Sandbox for deletion once idleDeleteSeconds passed. It returns
// when to look again.
func (r *SandboxReconciler) applyIdle(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct *dockerruntime.Container, result ctrl.Result) (ctrl.Result, error) {
	r.busyInBackground(ctx, sbx, ct)
	e := r.activity.entry(sbx.UID)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.deleteDue = ""
	now := r.clock.Now()
	last := lastActivity(sbx, e.last)
	persist := func() {
		if !e.last.IsZero() {
			t := metav1.NewTime(e.last.Truncate(time.Second))
			if p := sbx.Status.LastActivityTime; p == nil || p.Before(&t) {
				sbx.Status.LastActivityTime = &t
			}
		}
	}
	if p := sbx.Status.LastActivityTime; !e.last.IsZero() && (p == nil || e.last.Sub(p.Time) >= activityPersistInterval) {
		persist()
	}
	lc := sbx.Spec.Lifecycle
	if lc == nil || last.IsZero() || e.inflight > 0 {
		// An operation in flight is activity: look again after it.
		if lc != nil && e.inflight > 0 {
			result = soonest(result, time.Second)
		}
		return result, nil
	}
	idle := now.Sub(last)
	if lc.IdleDeleteSeconds != nil {
		after := time.Duration(*lc.IdleDeleteSeconds) * time.Second
		if idle >= after {
			persist()
			e.deleteDue = fmt.Sprintf("no exec, file transfer or log read for %s (spec.lifecycle.idleDeleteSeconds is %d)",
				idle.Truncate(time.Second), *lc.IdleDeleteSeconds)
			return result, nil
		}
		result = soonest(result, after-idle)
	}
	if lc.IdlePauseSeconds == nil || sbx.Spec.Paused || ct == nil {
		return result, nil
	}
	after := time.Duration(*lc.IdlePauseSeconds) * time.Second
	if idle < after {
		return soonest(result, after-idle), nil
	}
	if !ct.State.Paused {
		if err := r.docker.Pause(ctx, ct.ID); err != nil {
			return r.dockerFailure(ctx, sbx, err)
		}
		logf.FromContext(ctx).Info("paused an idle sandbox", "idle", idle.Truncate(time.Second).String())
	}
	e.frozen, e.known = ct.ID, true
	persist()
	meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionTrue,
		Reason: sandboxv1alpha1.SandboxReasonIdle, ObservedGeneration: sbx.Generation,
		Message: fmt.Sprintf("container %s is paused: no exec, file transfer or log read since %s (spec.lifecycle.idlePauseSeconds is %d); the next exec or file transfer resumes it",
			dockerruntime.ShortID(ct.ID), last.UTC().Format(time.RFC3339), *lc.IdlePauseSeconds),
	})
	return result, nil
}

// soonest shortens result's requeue to d.
func soonest(result ctrl.Result, d time.Duration) ctrl.Result {
	if d <= 0 {
		d = time.Second
	}
	if result.RequeueAfter == 0 || d < result.RequeueAfter {
		result.RequeueAfter = d
	}
	return result
}

// endingReason says why the Sandbox deletes itself now, or "": its
// lifetime passed with shutdownPolicy Delete, or applyIdle found it idle
// past idleDeleteSeconds.
func (r *SandboxReconciler) endingReason(sbx *sandboxv1alpha1.Sandbox) string {
	if meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)) {
		if lc := sbx.Spec.Lifecycle; lc != nil && lc.ShutdownPolicy == sandboxv1alpha1.ShutdownDelete {
			return fmt.Sprintf("activeDeadlineSeconds (%d) passed and spec.lifecycle.shutdownPolicy is Delete", deref(sbx.Spec.ActiveDeadlineSeconds))
		}
		return ""
	}
	r.activity.mu.Lock()
	e := r.activity.entries[sbx.UID]
	r.activity.mu.Unlock()
	if e == nil {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// Taken: each decision is acted on once, after the status write of
	// the reconcile that made it; a failed delete is decided again.
	why := e.deleteDue
	e.deleteDue = ""
	return why
}

// selfDelete deletes the Sandbox, as it is now (its UID and
// resourceVersion: a Sandbox changed meanwhile, for example given a longer
// idle timeout, is looked at again instead), and emits an Event once the
// delete succeeded. The finalizer then removes the container as for any
// delete.
func (r *SandboxReconciler) selfDelete(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, why string) (ctrl.Result, error) {
	uid, rv := sbx.UID, sbx.ResourceVersion
	err := r.client.Delete(ctx, sbx, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, nil
	case apierrors.IsConflict(err):
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("deleting sandbox %s/%s (%s): %w", sbx.Namespace, sbx.Name, why, err)
	}
	logf.FromContext(ctx).Info("deleted the sandbox", "why", why)
	r.recorder.Eventf(sbx, nil, "Normal", EventReasonDeleted, "Delete", "%s; the Sandbox was deleted by node %s", why, r.opts.NodeName)
	return ctrl.Result{}, nil
}

// EventReasonDeleted is the Event a node manager emits when it deleted a
// Sandbox because of spec.lifecycle (idle, or expired with shutdownPolicy
// Delete).
const EventReasonDeleted = "Deleted"

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
