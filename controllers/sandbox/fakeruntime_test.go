/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// fakeRuntime is an in-memory Docker Engine for the reconciler's unit tests:
// containers keyed by ID, labelled as dockerruntime labels them, and the
// errors (with dockerruntime's sentinels) that the reconciler maps to
// conditions.
type fakeRuntime struct {
	mu         sync.Mutex
	containers map[string]dockerruntime.Container
	nextID     int
	// down makes every call fail as an unreachable Docker Engine does.
	down bool
	// createErr, when set, is what CreateAndStart returns.
	createErr error
	// pauseFails makes Pause fail as an unreachable Docker Engine does.
	pauseFails bool
	// unhealthy, when set, is what CheckHealth returns.
	unhealthy error
	// calls records each mutating call ("create UID", "start ID",
	// "remove ID grace").
	calls []string
	specs []dockerruntime.Spec
	// processes and processesErr are what ListProcesses returns.
	processes    []execio.ProcessStatus
	processesErr error
}

var _ Runtime = (*fakeRuntime)(nil)

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{containers: map[string]dockerruntime.Container{}}
}

func (f *fakeRuntime) unavailable(what string) error {
	return fmt.Errorf("%s: %w: dial unix /nonexistent: connect: no such file or directory", what, dockerruntime.ErrUnavailable)
}

// add puts a container for owner in the given state ("running", "created",
// "exited", …) and returns its ID.
func (f *fakeRuntime) add(owner dockerruntime.Owner, status string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addLocked(owner, status)
}

func (f *fakeRuntime) addLocked(owner dockerruntime.Owner, status string) string {
	f.nextID++
	id := fmt.Sprintf("%064x", f.nextID)
	f.containers[id] = dockerruntime.Container{
		ID:   id,
		Name: dockerruntime.ContainerName(owner.UID),
		Labels: map[string]string{
			dockerruntime.LabelManagedBy:  dockerruntime.ManagedByValue,
			dockerruntime.LabelSandboxUID: owner.UID,
			dockerruntime.LabelNamespace:  owner.Namespace,
			dockerruntime.LabelName:       owner.Name,
			dockerruntime.LabelNode:       owner.Node,
		},
		State: dockerruntime.ContainerState{Status: status, Running: status == "running"},
	}
	return id
}

// setState changes a container's state, as a die or oom event would.
func (f *fakeRuntime) setState(id string, st dockerruntime.ContainerState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ct := f.containers[id]
	ct.State = st
	f.containers[id] = ct
}

func (f *fakeRuntime) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// ids lists the containers that carry uid's label.
func (f *fakeRuntime) ids(uid string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id, ct := range f.containers {
		if ct.Labels[dockerruntime.LabelSandboxUID] == uid {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// callsWith lists the recorded calls that start with prefix.
func (f *fakeRuntime) callsWith(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeRuntime) Ping(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return f.unavailable("ping")
	}
	return nil
}

func (f *fakeRuntime) listLocked(flt dockerruntime.ListFilter) []dockerruntime.Container {
	var out []dockerruntime.Container
	for _, ct := range f.containers {
		if flt.UID != "" && ct.Labels[dockerruntime.LabelSandboxUID] != flt.UID {
			continue
		}
		if flt.Node != "" && ct.Labels[dockerruntime.LabelNode] != flt.Node {
			continue
		}
		out = append(out, ct)
	}
	slices.SortFunc(out, func(a, b dockerruntime.Container) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (f *fakeRuntime) Find(_ context.Context, uid string) (dockerruntime.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return dockerruntime.Container{}, f.unavailable("listing containers")
	}
	list := f.listLocked(dockerruntime.ListFilter{UID: uid})
	switch len(list) {
	case 0:
		return dockerruntime.Container{}, fmt.Errorf("sandbox %s: %w", uid, dockerruntime.ErrNotFound)
	case 1:
		return list[0], nil
	default:
		return dockerruntime.Container{}, fmt.Errorf("%w: %d containers carry sandbox UID %s", dockerruntime.ErrMultipleContainers, len(list), uid)
	}
}

func (f *fakeRuntime) CreateAndStart(_ context.Context, spec dockerruntime.Spec) (dockerruntime.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return dockerruntime.Container{}, f.unavailable("creating container")
	}
	f.calls = append(f.calls, "create "+spec.Owner.UID)
	f.specs = append(f.specs, spec)
	if f.createErr != nil {
		return dockerruntime.Container{}, f.createErr
	}
	// A retried create collides on the name and adopts the container.
	for id, ct := range f.containers {
		if ct.Name == dockerruntime.ContainerName(spec.Owner.UID) {
			ct.State = dockerruntime.ContainerState{Status: "running", Running: true}
			f.containers[id] = ct
			return ct, nil
		}
	}
	id := f.addLocked(spec.Owner, "running")
	return f.containers[id], nil
}

func (f *fakeRuntime) AwaitHelper(_ context.Context, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "await-helper "+id)
}

func (f *fakeRuntime) ListProcesses(_ context.Context, id string) ([]execio.ProcessStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, f.unavailable("listing processes")
	}
	f.calls = append(f.calls, "list-processes "+id)
	return f.processes, f.processesErr
}

func (f *fakeRuntime) Start(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return f.unavailable("starting container")
	}
	f.calls = append(f.calls, "start "+id)
	ct, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, dockerruntime.ErrNotFound)
	}
	ct.State = dockerruntime.ContainerState{Status: "running", Running: true}
	f.containers[id] = ct
	return nil
}

func (f *fakeRuntime) CheckHealth(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return f.unavailable("health check")
	}
	f.calls = append(f.calls, "check "+id)
	ct, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, dockerruntime.ErrNotFound)
	}
	if ct.State.Paused {
		return fmt.Errorf("container %s: %w", id, dockerruntime.ErrPaused)
	}
	return f.unhealthy
}

func (f *fakeRuntime) Pause(_ context.Context, id string) error {
	return f.freeze(id, "pause", true)
}

func (f *fakeRuntime) Unpause(_ context.Context, id string) error {
	return f.freeze(id, "unpause", false)
}

func (f *fakeRuntime) BeginUnpause(id string) func(context.Context) error {
	err := f.freeze(id, "unpause", false)
	return func(context.Context) error { return err }
}

// freeze pauses or thaws a running container, as Docker does: only a
// running container can be paused.
func (f *fakeRuntime) freeze(id, verb string, paused bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down || (paused && f.pauseFails) {
		return f.unavailable(verb + " container")
	}
	f.calls = append(f.calls, verb+" "+id)
	ct, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, dockerruntime.ErrNotFound)
	}
	if !ct.State.Running {
		return fmt.Errorf("container %s is not running", id)
	}
	ct.State.Paused = paused
	ct.State.Status = "running"
	if paused {
		ct.State.Status = "paused"
	}
	f.containers[id] = ct
	return nil
}

func (f *fakeRuntime) Remove(_ context.Context, id string, grace time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return f.unavailable("removing container")
	}
	f.calls = append(f.calls, fmt.Sprintf("remove %s %s", id, grace))
	delete(f.containers, id)
	return nil
}

func (f *fakeRuntime) ListManaged(_ context.Context, flt dockerruntime.ListFilter) ([]dockerruntime.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, f.unavailable("listing containers")
	}
	return f.listLocked(flt), nil
}

func (f *fakeRuntime) WatchEvents(ctx context.Context, _ string, _ func(dockerruntime.Event)) error {
	if err := f.Ping(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

// fakeHistory records which Sandboxes' exec history was deleted.
type fakeHistory struct {
	mu      sync.Mutex
	deleted []string
}

func (h *fakeHistory) Delete(key string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deleted = append(h.deleted, key)
	return nil
}

func (h *fakeHistory) keys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.deleted)
}

func (f *fakeRuntime) Snapshot(context.Context, string, []string, io.Writer, int64) (execio.TransferStats, error) {
	return execio.TransferStats{}, f.unavailable("snapshot")
}

func (f *fakeRuntime) Restore(context.Context, string, []string, func() (io.ReadCloser, error), execio.UploadLimits) (execio.TransferStats, error) {
	return execio.TransferStats{}, f.unavailable("restore")
}

// InstallEgressCA is not exercised by the unit tier (no egress proxy).
func (f *fakeRuntime) InstallEgressCA(context.Context, string, []byte) error {
	return errors.New("fakeRuntime: no egress CA")
}
