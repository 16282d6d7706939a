/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// Defaults of the orphaned snapshot data sweep.
const (
	// DefaultSnapshotSweepGrace is the least age of data the sweep
	// removes. A take records its ref in status.storage right after the
	// data is stored, or removes the data when that write fails, all
	// within one reconcile (seconds); a Put's partial file is written to
	// all the time it streams (bounded by the request's context). Ten
	// minutes is far beyond either, so an in-flight take is never
	// touched.
	DefaultSnapshotSweepGrace = 10 * time.Minute
	// DefaultSnapshotSweepInterval is how often the sweep runs.
	DefaultSnapshotSweepInterval = 10 * time.Minute
	// DefaultSnapshotSweepMax bounds the removals of one sweep, so that a
	// large backlog (or a mistake) costs a bounded amount of work at a
	// time; the rest waits for the next sweep.
	DefaultSnapshotSweepMax = 100
)

// snapshotSweepPageSize is the page of the SandboxSnapshot list.
const snapshotSweepPageSize = 500

// leftoverStore is a store that can list what it holds on this node
// (snapshotstore.Node).
type leftoverStore interface {
	Leftovers() ([]snapshotstore.Entry, error)
	RemoveLeftover(ctx context.Context, e snapshotstore.Entry) error
}

// SnapshotSweeper removes snapshot data of this node that no
// SandboxSnapshot records: data a manager stored and then died before
// writing status.storage (or before removing it after a failed write), or
// whose object lost its finalizer by hand. What it looks at is this node's
// own: the files of its directory store, and the registry refs it pushed,
// which it journals in that directory before each push (the registry API
// lists no manifest without a tag, so the journal is the only list). It
// never touches another node's data.
//
// Which refs are recorded is read from the API server, not the cache, and
// after the store was listed: a ref recorded before the list is seen. Only
// the holding node's manager writes status.storage
// (config/policy/snapshot_status_policy.yaml), so no user can make it
// remove data that a snapshot still holds.
type SnapshotSweeper struct {
	reader client.Reader
	store  leftoverStore
	clock  clock.PassiveClock
	// Grace, Interval and Max: see the defaults above.
	Grace    time.Duration
	Interval time.Duration
	Max      int
	node     string
}

// NewSnapshotSweeper builds the sweep of store, or returns nil when store
// cannot list what it holds. reader must read from the API server.
func NewSnapshotSweeper(reader client.Reader, store SnapshotStore, clk clock.PassiveClock, node string) *SnapshotSweeper {
	ls, ok := store.(leftoverStore)
	if !ok {
		return nil
	}
	return &SnapshotSweeper{reader: reader, store: ls, clock: clk, node: node,
		Grace: DefaultSnapshotSweepGrace, Interval: DefaultSnapshotSweepInterval, Max: DefaultSnapshotSweepMax}
}

// NeedLeaderElection: every node's manager sweeps its own data.
func (s *SnapshotSweeper) NeedLeaderElection() bool { return false }

// Start runs the sweep every Interval until ctx ends.
func (s *SnapshotSweeper) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("snapshot-sweep").WithValues("node", s.node)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.Interval):
		}
		removed, err := s.Sweep(ctx)
		if err != nil {
			log.Error(err, "sweeping orphaned snapshot data", "removed", removed)
		} else if removed > 0 {
			log.Info("removed orphaned snapshot data", "count", removed)
		}
	}
}

// Sweep removes, at most Max at a time, the entries older than Grace that
// no SandboxSnapshot records. It returns how many it removed.
func (s *SnapshotSweeper) Sweep(ctx context.Context) (int, error) {
	entries, err := s.store.Leftovers()
	if err != nil {
		return 0, err
	}
	now := s.clock.Now()
	var old []snapshotstore.Entry
	for _, e := range entries {
		if now.Sub(e.ModTime) >= s.Grace {
			old = append(old, e)
		}
	}
	if len(old) == 0 {
		return 0, nil // no API call when there is nothing to judge
	}
	recorded, err := s.recorded(ctx)
	if err != nil {
		return 0, err
	}
	log := logf.FromContext(ctx).WithName("snapshot-sweep").WithValues("node", s.node)
	removed := 0
	var errs []error
	for _, e := range old {
		if removed >= s.Max {
			break
		}
		if e.Ref != "" && recorded[e.Ref] {
			continue
		}
		if err := s.store.RemoveLeftover(ctx, e); err != nil {
			errs = append(errs, fmt.Errorf("removing %s %s: %w", e.Kind, e.Ref, err))
			continue
		}
		log.Info("removed snapshot data no SandboxSnapshot records", "kind", e.Kind, "ref", e.Ref, "age", now.Sub(e.ModTime).Round(time.Second))
		removed++
	}
	return removed, errors.Join(errs...)
}

// recorded is every status.storage of every SandboxSnapshot, in pages.
func (s *SnapshotSweeper) recorded(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	opts := []client.ListOption{client.Limit(snapshotSweepPageSize)}
	for {
		var list sandboxv1alpha1.SandboxSnapshotList
		if err := s.reader.List(ctx, &list, opts...); err != nil {
			return nil, fmt.Errorf("listing SandboxSnapshots: %w", err)
		}
		for i := range list.Items {
			if ref := list.Items[i].Status.Storage; ref != "" {
				out[ref] = true
			}
		}
		if list.Continue == "" {
			return out, nil
		}
		opts = []client.ListOption{client.Limit(snapshotSweepPageSize), client.Continue(list.Continue)}
	}
}
