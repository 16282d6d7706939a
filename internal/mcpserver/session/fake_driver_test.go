package session

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeDriver is an in-memory Driver that records what it is asked to do.
// Its sandboxes are "sbx-N" with Ref "ref-N".
type fakeDriver struct {
	mu   sync.Mutex
	next int
	// live holds the Refs of sandboxes that exist.
	live map[string]bool
	// calls are "Method id" (or "Method" when there is no sandbox), in order.
	calls []string
	// handles are the Handles the sandbox methods were given, in order.
	handles []Handle

	// createGate, when set, holds every Create until it is closed;
	// creating is signalled once per Create that waits.
	createGate chan struct{}
	creating   chan struct{}
	// execGate, when set, holds every Exec until it is closed; execing
	// is signalled once per Exec that waits.
	execGate chan struct{}
	execing  chan struct{}
	// removeErr fails Remove (stop and reap) while set.
	removeErr error
	// getErr is returned by Get while set.
	getErr error
	// removeAllErr is returned by RemoveAll.
	removeAllErr error
	closed       bool
	// paused holds the Refs of frozen sandboxes; Exec, Upload and
	// Download in one fail, as Docker's do. pauseErr fails Pause.
	paused   map[string]bool
	pauseErr error
}

var (
	_ Driver = (*fakeDriver)(nil)
	_ Pauser = (*fakeDriver)(nil)
)

func newFakeDriver() *fakeDriver {
	return &fakeDriver{live: map[string]bool{}, paused: map[string]bool{}}
}

func (f *fakeDriver) Pause(_ context.Context, h Handle) error {
	f.record("Pause", &h)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pauseErr != nil {
		return f.pauseErr
	}
	f.paused[h.Ref] = true
	return nil
}

func (f *fakeDriver) Resume(_ context.Context, h Handle) error {
	f.record("Resume", &h)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.paused, h.Ref)
	return nil
}

func (f *fakeDriver) isPaused(ref string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paused[ref]
}

// frozen fails an operation in a paused sandbox.
func (f *fakeDriver) frozen(h Handle) error {
	if f.isPaused(h.Ref) {
		return fmt.Errorf("%w: sandbox %s is paused", contract.ErrNotRunning, h.ID)
	}
	return nil
}

func (f *fakeDriver) record(method string, h *Handle) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h == nil {
		f.calls = append(f.calls, method)
		return
	}
	f.calls = append(f.calls, method+" "+h.ID)
	f.handles = append(f.handles, *h)
}

func (f *fakeDriver) callList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeDriver) isLive(ref string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[ref]
}

func (f *fakeDriver) Create(ctx context.Context, caller contract.Caller, req contract.CreateRequest) (string, contract.Sandbox, error) {
	f.record("Create", nil)
	f.mu.Lock()
	gate, signal := f.createGate, f.creating
	f.mu.Unlock()
	if gate != nil {
		if signal != nil {
			signal <- struct{}{}
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return "", contract.Sandbox{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	ref := fmt.Sprintf("ref-%d", f.next)
	f.live[ref] = true
	return ref, contract.Sandbox{ID: fmt.Sprintf("sbx-%d", f.next), Image: req.Image, Status: "running", Network: contract.NetworkNone, WorkingDir: "/app"}, nil
}

func (f *fakeDriver) Get(_ context.Context, h Handle) (contract.Sandbox, error) {
	f.record("Get", &h)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return contract.Sandbox{}, f.getErr
	}
	return h.Sandbox, nil
}

func (f *fakeDriver) List(_ context.Context, _ contract.Caller, mine []Handle) ([]contract.Sandbox, error) {
	f.record("List", nil)
	out := make([]contract.Sandbox, 0, len(mine))
	for _, h := range mine {
		out = append(out, h.Sandbox)
	}
	return out, nil
}

func (f *fakeDriver) Exec(ctx context.Context, h Handle, req execio.Request, out contract.OutputFunc) (execio.Result, error) {
	f.record("Exec", &h)
	if err := f.frozen(h); err != nil {
		return execio.Result{}, err
	}
	f.mu.Lock()
	gate, signal := f.execGate, f.execing
	f.mu.Unlock()
	if gate != nil {
		if signal != nil {
			signal <- struct{}{}
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return execio.Result{}, ctx.Err()
		}
	}
	out("stdout", []byte(req.Shell))
	return execio.Result{}, nil
}

func (f *fakeDriver) Upload(_ context.Context, h Handle, _ string, archive io.Reader, _ execio.UploadLimits) (execio.TransferStats, error) {
	f.record("Upload", &h)
	if err := f.frozen(h); err != nil {
		return execio.TransferStats{}, err
	}
	_, _ = io.Copy(io.Discard, archive)
	return execio.TransferStats{}, nil
}

func (f *fakeDriver) Download(_ context.Context, h Handle, _ string, _ io.Writer, _ int64) (execio.TransferStats, error) {
	f.record("Download", &h)
	if err := f.frozen(h); err != nil {
		return execio.TransferStats{}, err
	}
	return execio.TransferStats{}, nil
}

func (f *fakeDriver) Logs(_ context.Context, h Handle, _ contract.LogsOptions) (contract.Logs, error) {
	f.record("Logs", &h)
	return contract.Logs{}, nil
}

func (f *fakeDriver) Remove(_ context.Context, h Handle, how Removal) error {
	method := "Stop"
	if how == RemoveReap {
		method = "Reap"
	}
	f.record(method, &h)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.removeErr != nil {
		return f.removeErr
	}
	delete(f.live, h.Ref)
	return nil
}

func (f *fakeDriver) RemoveAll(context.Context) error {
	f.record("RemoveAll", nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.removeAllErr != nil {
		return f.removeAllErr
	}
	f.live = map[string]bool{}
	return nil
}

func (f *fakeDriver) Sweep(context.Context) { f.record("Sweep", nil) }

func (f *fakeDriver) Ready(context.Context) error { return nil }

func (f *fakeDriver) Close(context.Context) error {
	f.record("Close", nil)
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	return nil
}

// sharedDriver is a fakeDriver that is a SharedDriver and an Authorizer:
// others counts the sandboxes of other server instances per identity,
// deny refuses operations, and foreign sandboxes (not the Manager's) are
// found by ID.
type sharedDriver struct {
	*fakeDriver
	others  map[string]int
	deny    map[Op]bool
	foreign map[string]string // sandbox ID → owner identity
	authz   []string
}

var (
	_ SharedDriver = (*sharedDriver)(nil)
	_ Authorizer   = (*sharedDriver)(nil)
)

func (s *sharedDriver) Authorize(_ context.Context, caller contract.Caller, op Op, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authz = append(s.authz, fmt.Sprintf("%s %s %s", caller.ID, op, id))
	if s.deny[op] {
		return fmt.Errorf("%w: %s may not %s", contract.ErrInvalid, caller.ID, op)
	}
	return nil
}

func (s *sharedDriver) CountOthers(_ context.Context, caller contract.Caller) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.others[caller.ID], nil
}

func (s *sharedDriver) Get(ctx context.Context, h Handle) (contract.Sandbox, error) {
	if h.Ref == "" {
		s.record("Get", &h)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.foreign[h.ID] != h.Caller.ID {
			return contract.Sandbox{}, fmt.Errorf("%w: %q", contract.ErrNotFound, h.ID)
		}
		return contract.Sandbox{ID: h.ID, Status: "running"}, nil
	}
	return s.fakeDriver.Get(ctx, h)
}

// List lists the Manager's sandboxes that are live, and the caller's
// foreign ones.
func (s *sharedDriver) List(_ context.Context, caller contract.Caller, mine []Handle) ([]contract.Sandbox, error) {
	s.record("List", nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []contract.Sandbox
	for _, h := range mine {
		if s.live[h.Ref] {
			out = append(out, h.Sandbox)
		}
	}
	for id, owner := range s.foreign {
		if owner == caller.ID {
			out = append(out, contract.Sandbox{ID: id})
		}
	}
	return out, nil
}
