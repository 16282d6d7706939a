/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

// dockerEventWatcher turns Docker container events (die, oom, destroy, …)
// into reconciles, so status follows the container without polling. Events
// sent while the stream is down are lost, so every reconnect resyncs all
// Sandboxes on the node.
type dockerEventWatcher struct {
	reconciler *SandboxReconciler
}

// NeedLeaderElection is false: every node's manager watches its own Docker.
func (w *dockerEventWatcher) NeedLeaderElection() bool { return false }

func (w *dockerEventWatcher) Start(ctx context.Context) error {
	r := w.reconciler
	log := logf.FromContext(ctx).WithName("docker-events").WithValues("node", r.opts.NodeName)
	backoff := 500 * time.Millisecond
	resyncNeeded := false
	for {
		connected := time.Now()
		if r.docker.Ping(ctx) == nil {
			dockerUp.Set(1)
			if resyncNeeded {
				// Events sent while the stream was down are lost.
				w.resync(ctx)
			}
		}
		err := r.docker.WatchEvents(ctx, r.opts.NodeName, func(ev dockerruntime.Event) {
			if ev.Action == "die" || ev.Action == "destroy" {
				// Its address goes back to Docker; its policy must not
				// outlive it.
				r.forgetEgress(ctx, ev.ContainerID)
			}
			if ev.Owner.Namespace == "" || ev.Owner.Name == "" {
				return
			}
			r.enqueue(ev.Owner.Namespace, ev.Owner.Name, types.UID(ev.Owner.UID))
			// A claimed warm pool member's container carries the member's
			// labels; its events are its claimant's.
			if claimant, ok, _ := r.claimantOf(ctx, types.UID(ev.Owner.UID)); ok {
				r.enqueue(claimant.Namespace, claimant.Name, "")
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		dockerUp.Set(0)
		resyncNeeded = true
		log.Info("Docker event stream ended; reconnecting", "error", errString(err), "after", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if time.Since(connected) > time.Minute {
			backoff = 500 * time.Millisecond
		} else {
			backoff = min(backoff*2, 30*time.Second)
		}
	}
}

// resync enqueues every Sandbox bound to this node.
func (w *dockerEventWatcher) resync(ctx context.Context) {
	r := w.reconciler
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.MatchingFields{statusNodeNameField: r.opts.NodeName}); err != nil {
		logf.FromContext(ctx).Error(err, "resync after Docker reconnect")
		return
	}
	for i := range list.Items {
		r.enqueue(list.Items[i].Namespace, list.Items[i].Name, list.Items[i].UID)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// orphanCollector removes containers whose Sandbox no longer exists: for
// example when a finalizer was stripped by hand, or the Sandbox was deleted
// through a path that skipped the manager. It asks the API server directly,
// not the cache, before it deletes anything, and it only ever looks at
// containers that carry our labels for this node.
type orphanCollector struct {
	reconciler *SandboxReconciler
	interval   time.Duration
}

func (o *orphanCollector) NeedLeaderElection() bool { return false }

func (o *orphanCollector) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("orphan-gc").WithValues("node", o.reconciler.opts.NodeName)
	interval := o.interval
	if interval <= 0 {
		interval = time.Minute
	}
	for {
		if removed, err := o.reconciler.CollectOrphans(ctx); err != nil {
			log.Error(err, "orphan collection failed")
		} else if removed > 0 {
			log.Info("removed orphaned containers", "count", removed)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// CollectOrphans removes this node's containers whose Sandbox is gone or has
// a different UID (deleted and recreated under the same name). It returns how
// many it removed.
func (r *SandboxReconciler) CollectOrphans(ctx context.Context) (int, error) {
	list, err := r.docker.ListManaged(ctx, dockerruntime.ListFilter{Node: r.opts.NodeName})
	if err != nil {
		return 0, err
	}
	return r.removeOrphans(ctx, list)
}

// removeOrphans removes those of the given containers (this node's, listed by
// their labels) whose Sandbox no longer exists with the UID on the container,
// and drops their exec history. It is the one judgement shared by the
// periodic sweep and by Reconcile when a Sandbox vanishes. It asks the API
// server, not the cache, before it deletes anything: a cache that has not
// yet seen a new Sandbox must not cost that Sandbox its container.
func (r *SandboxReconciler) removeOrphans(ctx context.Context, list []dockerruntime.Container) (int, error) {
	log := logf.FromContext(ctx)
	removed := 0
	var errs []error
	for _, ct := range list {
		uid := ct.Labels[dockerruntime.LabelSandboxUID]
		ns, name := ct.Labels[dockerruntime.LabelNamespace], ct.Labels[dockerruntime.LabelName]
		if uid == "" || ns == "" || name == "" {
			// Without the full index we cannot prove it is an orphan.
			log.Info("skipping container with incomplete labels", "container", dockerruntime.ShortID(ct.ID))
			continue
		}
		if _, claimed, err := r.claimantOf(ctx, types.UID(uid)); err != nil || claimed {
			// A warm pool member's container that a Sandbox took over:
			// the member object goes, the container stays with the claimant.
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		var sbx sandboxv1alpha1.Sandbox
		err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &sbx)
		switch {
		case err == nil && string(sbx.UID) == uid:
			continue
		case err == nil, apierrors.IsNotFound(err):
		default:
			errs = append(errs, err)
			continue
		}
		log.Info("removing orphaned container", "container", dockerruntime.ShortID(ct.ID), "sandbox", ns+"/"+name, "uid", uid)
		// No stop grace period: kill at once. Its Sandbox is gone without
		// finalize having run (the finalizer was stripped by hand, or the
		// object was deleted behind the managers' back), so quota and node
		// capacity were already released and nobody can reach the container
		// through the API any more. Every second of SIGTERM grace is a
		// second it runs uncounted; looping strip-and-delete would turn that
		// into more containers than the quota allows.
		if err := r.docker.Remove(ctx, ct.ID, 0); err != nil {
			errs = append(errs, err)
			continue
		}
		r.forgetEgress(ctx, ct.ID)
		orphansRemoved.Inc()
		removed++
		r.backoff.reset(types.UID(uid))
		// A Sandbox whose finalizer was stripped never reached finalize,
		// so its exec history goes with its orphaned container.
		r.deleteHistoryOf(ctx, types.UID(uid))
	}
	return removed, errors.Join(errs...)
}
