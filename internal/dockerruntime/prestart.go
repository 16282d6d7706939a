package dockerruntime

import (
	"context"
	"errors"
)

// A sandbox's first command used to start its resident helper: one Docker
// exec, about 50 ms on this project's reference machine, almost all of it
// the daemon, containerd and runc setting up a process in the container
// (ExecCreate and the attach return within a millisecond; the helper's
// ready frame comes ~48 ms later). So CreateAndStart starts the helper as
// soon as the container runs, in the background, while the caller inspects
// the container and reports it Ready: a command that comes before the
// helper is up waits for it instead of starting a second one, and every
// command after that costs what a repeated one does. A warm pool member's
// health check runs in that helper and leaves it parked, so a claimed
// member's first command finds it too (frozen with its container, and
// thawed with it).
//
// A start that fails (a helper without serve, a container that stopped,
// Docker too slow) leaves nothing: the first command starts a helper as it
// always did, and reports what went wrong.

// prestartHelper starts container id's resident helper in the background
// and parks it as the container's idle one.
func (c *Client) prestartHelper(id string) {
	c.standby.mu.Lock()
	if c.standby.closed || c.standby.starting[id] != nil {
		c.standby.mu.Unlock()
		return
	}
	if c.standby.starting == nil {
		c.standby.starting = map[string]chan struct{}{}
	}
	done := make(chan struct{})
	c.standby.starting[id] = done
	c.standby.mu.Unlock()
	go func() {
		defer func() {
			c.standby.mu.Lock()
			delete(c.standby.starting, id)
			c.standby.mu.Unlock()
			close(done)
		}()
		// Bounded as a command's start is (acceptedServe): a loaded host
		// can take seconds to spawn a process.
		ctx, cancel := context.WithTimeout(context.Background(), c.callTimeout+helperBackstopGrace)
		defer cancel()
		s, err := c.startServe(ctx, id)
		switch {
		case errors.Is(err, errHelperWithoutServe):
			c.markLegacy(id)
		case err == nil:
			c.park(id, s)
		}
	}()
}

// awaitPrestart waits, within ctx, for a helper start prestartHelper began
// on id, so that the command that comes first takes that helper instead of
// starting another.
func (c *Client) awaitPrestart(ctx context.Context, id string) {
	c.standby.mu.Lock()
	done := c.standby.starting[id]
	c.standby.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// AwaitHelper waits, within ctx, until the resident helper start that
// CreateAndStart began on container id has ended (parked, or failed and
// left nothing), and returns at once when none is under way. The Sandbox
// reconciler calls it before it reports a cold-created Sandbox Ready, so
// that the first command after Ready finds the helper serving instead of
// waiting for its spawn (see prestart.go's opening comment).
func (c *Client) AwaitHelper(ctx context.Context, id string) {
	c.awaitPrestart(ctx, id)
}

// HelperParked says whether container id has an idle resident helper
// parked, ready for its next command (for tests and diagnostics).
func (c *Client) HelperParked(id string) bool {
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	return c.standby.idle[id] != nil
}

// HelperStarting says whether a resident helper start CreateAndStart began
// on container id is still under way (for tests and diagnostics).
func (c *Client) HelperStarting(id string) bool {
	c.standby.mu.Lock()
	defer c.standby.mu.Unlock()
	return c.standby.starting[id] != nil
}
