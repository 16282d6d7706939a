package dockerruntime

import (
	"context"
	"strings"
	"sync"
	"time"
)

// Pause freezes a running container with the cgroup freezer: its processes
// get no CPU time and keep their memory. Pausing a paused container is not
// an error. It returns once Docker records the container as paused.
//
// A helper start that prestartHelper began is waited for first: a process
// being spawned into the container (runc's exec joining its cgroup, a Go
// runtime making its threads) is what keeps a cgroup v1 freezer from
// settling. runc gives up then ("unable to freeze") and thaws the
// container back, so such a failure is retried, with a pause between
// tries, until ctx (bounded by the call timeout) ends.
func (c *Client) Pause(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	c.awaitPrestart(ctx, id)
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		done := c.gates.pauseExclusive(id)
		err := c.docker.ContainerPause(ctx, id)
		done()
		switch {
		case err == nil, strings.Contains(err.Error(), "already paused"):
			return c.awaitPausedRecord(ctx, id, true)
		case !freezeRaced(err):
			return classify(err, "pausing container "+ShortID(id))
		}
		select {
		case <-ctx.Done():
			return classify(err, "pausing container "+ShortID(id)+" (the freezer did not settle)")
		case <-time.After(delay):
		}
	}
}

// freezeRaced is runc's cgroup v1 freeze giving up while a task in the
// container could not be frozen in time; runc has thawed it again.
func freezeRaced(err error) bool {
	return strings.Contains(err.Error(), "unable to freeze")
}

// Unpause thaws a paused container. Unpausing a running container that is
// not paused is not an error. It returns once Docker records the container
// as not paused, so that an exec right after it is not refused.
func (c *Client) Unpause(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.ContainerUnpause(ctx, id)
	if err != nil && !strings.Contains(err.Error(), "is not paused") {
		return classify(err, "unpausing container "+ShortID(id))
	}
	return c.awaitPausedRecord(ctx, id, false)
}

// awaitPausedRecord waits until Docker's record of id (State.Paused, which
// it checks before an exec and before an unpause) says paused, or says not.
// Docker 20.10 updates that record when it handles containerd's "paused"
// and "resumed" events, asynchronously, so the record can lag a call that
// has returned. After a quick pause and unpause that lag made two failures:
// an unpause right after a pause was answered "is not paused" (taken for
// success) while the container stayed frozen, and an exec right after an
// unpause was refused as paused though the container ran. Events for one
// container are handled in order, so once the record shows the call's
// effect it stays.
func (c *Client) awaitPausedRecord(ctx context.Context, id string, paused bool) error {
	what := "unpausing"
	if paused {
		what = "pausing"
	}
	for delay := 2 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		resp, err := c.docker.ContainerInspect(ctx, id)
		if err != nil {
			return classify(err, what+" container "+ShortID(id)+": inspecting it")
		}
		if resp.ContainerJSONBase != nil && resp.State != nil && resp.State.Paused == paused {
			return nil
		}
		select {
		case <-ctx.Done():
			return classify(ctx.Err(), what+" container "+ShortID(id)+": waiting for Docker to record it")
		case <-time.After(delay):
		}
	}
}

// thaws are the unpauses BeginUnpause started that have not ended.
type thaws struct {
	mu       sync.Mutex
	inflight map[string]*thaw
}

type thaw struct {
	done chan struct{}
	err  error
}

// BeginUnpause starts thawing container id and returns at once; wait says
// how the thaw ended. Until it ends, RunCommand, CopyIn and CopyOut on id
// wait for it, so the caller may declare the container usable (a warm
// claim's Ready) while Docker is still thawing it.
func (c *Client) BeginUnpause(id string) (wait func(context.Context) error) {
	t := &thaw{done: make(chan struct{})}
	c.thaws.mu.Lock()
	if c.thaws.inflight == nil {
		c.thaws.inflight = map[string]*thaw{}
	}
	c.thaws.inflight[id] = t
	c.thaws.mu.Unlock()
	go func() {
		t.err = c.Unpause(context.Background(), id)
		c.thaws.mu.Lock()
		if c.thaws.inflight[id] == t {
			delete(c.thaws.inflight, id)
		}
		c.thaws.mu.Unlock()
		close(t.done)
	}()
	return func(ctx context.Context) error {
		select {
		case <-t.done:
			return t.err
		case <-ctx.Done():
			return classify(ctx.Err(), "waiting for container "+ShortID(id)+" to thaw")
		}
	}
}

// awaitThaw waits for a thaw of id that BeginUnpause started. If it
// failed, the operation that waited finds the container paused itself.
func (c *Client) awaitThaw(ctx context.Context, id string) error {
	c.thaws.mu.Lock()
	t := c.thaws.inflight[id]
	c.thaws.mu.Unlock()
	if t == nil {
		return nil
	}
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return classify(ctx.Err(), "waiting for container "+ShortID(id)+" to thaw")
	}
}
