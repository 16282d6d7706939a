package dockerruntime

import (
	"context"
	"strings"
	"sync"
	"time"
)

// Pause freezes a running container with the cgroup freezer: its processes
// get no CPU time and keep their memory. Pausing a paused container is not
// an error.
func (c *Client) Pause(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.ContainerPause(ctx, id)
	if err != nil && strings.Contains(err.Error(), "already paused") {
		return nil
	}
	return classify(err, "pausing container "+ShortID(id))
}

// Unpause thaws a paused container. Unpausing a running container that is
// not paused is not an error.
//
// It returns once Docker reports the container unpaused: Docker 20.10
// records the thaw from containerd's event, a moment after the unpause
// call returns, and refuses an exec ("is paused") until then; so would a
// command right after a warm claim's thaw (seen in
// BenchmarkTimeToInteractive).
func (c *Client) Unpause(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.ContainerUnpause(ctx, id)
	if err != nil && strings.Contains(err.Error(), "is not paused") {
		return nil
	}
	if err != nil {
		return classify(err, "unpausing container "+ShortID(id))
	}
	for {
		ct, err := c.docker.ContainerInspect(ctx, id)
		if err != nil {
			return classify(err, "inspecting container "+ShortID(id)+" after unpausing it")
		}
		if ct.State == nil || !ct.State.Paused {
			return nil
		}
		select {
		case <-ctx.Done():
			return classify(ctx.Err(), "waiting for Docker to report container "+ShortID(id)+" unpaused")
		case <-time.After(2 * time.Millisecond):
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
