package dockerruntime

import (
	"context"
	"sync"
	"time"
)

// execGates keeps a container's pause and the starts of its execs apart.
//
// On cgroup v1 the freezer can catch a docker exec's process while runc is
// still putting it into the container (runc init, joining the cgroup):
// runc exec then waits for it forever, and Docker's unpause, inspect and
// remove of that container hang behind it until someone thaws the freezer
// cgroup by hand. So an exec start (create, attach, and the wait until
// Docker reports its process started) holds its container's gate shared,
// and a pause holds it exclusively: a pause waits for the starts in flight,
// and a start waits for a pause in flight (and then finds the container
// paused, as it would have anyway). Each hold is bounded by its call's
// context. Only this client's execs and pauses are kept apart.
type execGates struct {
	mu sync.Mutex
	m  map[string]*execGate
}

type execGate struct {
	rw sync.RWMutex
	// users counts the holders and waiters, so that the entry goes once
	// nobody needs it (the map never keeps a removed container's gate).
	users int
}

func (g *execGates) get(id string) *execGate {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string]*execGate{}
	}
	e := g.m[id]
	if e == nil {
		e = &execGate{}
		g.m[id] = e
	}
	e.users++
	return e
}

func (g *execGates) put(id string, e *execGate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.users--; e.users == 0 {
		delete(g.m, id)
	}
}

// startShared holds id's gate for an exec start; the returned func ends the hold.
func (g *execGates) startShared(id string) func() {
	e := g.get(id)
	e.rw.RLock()
	return func() {
		e.rw.RUnlock()
		g.put(id, e)
	}
}

// pauseExclusive holds id's gate for a pause; the returned func ends the hold.
func (g *execGates) pauseExclusive(id string) func() {
	e := g.get(id)
	e.rw.Lock()
	return func() {
		e.rw.Unlock()
		g.put(id, e)
	}
}

// size is the number of containers with a gate in use (tests).
func (g *execGates) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m)
}

// awaitExecStarted waits until Docker reports the exec's process started
// (a pid), or the exec already over, or ctx ends: until then runc may still
// be putting the process into the container, which a freeze must not catch.
func (c *Client) awaitExecStarted(ctx context.Context, execID string) {
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		ins, err := c.docker.ContainerExecInspect(ctx, execID)
		if err != nil || ins.Pid != 0 || (!ins.Running && ins.ExitCode != 0) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}
