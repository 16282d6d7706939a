package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
)

// ContainerState is the part of Docker's state the controller acts on.
type ContainerState struct {
	// Status is Docker's: created, running, paused, restarting, removing,
	// exited or dead.
	Status  string
	Running bool
	// Paused is true while the cgroup freezer holds the container (Running
	// stays true then, as Docker reports it).
	Paused     bool
	ExitCode   int
	OOMKilled  bool
	Error      string
	StartedAt  time.Time
	FinishedAt time.Time
}

// Container is a sandbox container as Docker reports it.
type Container struct {
	ID     string
	Name   string
	Labels map[string]string
	State  ContainerState
	// ImageID is the digest of the image the container runs (sha256:…),
	// as Docker resolved its image name at create; empty where the
	// listing did not say.
	ImageID string
	// EgressAddr is the container's IPv4 address on the egress network
	// (NetworkEgress), the source address the node's egress proxy knows it
	// by; invalid when it is not attached or not running. Only Inspect
	// (and so Find and CreateAndStart) fills it in.
	EgressAddr netip.Addr
}

// Owned reports whether the container carries the operator's labels for
// this UID.
func (c Container) Owned(uid string) bool { return c.OwnedBy(ManagedByValue, uid) }

// OwnedBy reports whether the container carries managedBy's labels for this
// UID.
func (c Container) OwnedBy(managedBy, uid string) bool {
	return c.Labels[LabelManagedBy] == managedBy && c.Labels[LabelSandboxUID] == uid
}

func fromInspect(resp container.InspectResponse) Container {
	out := Container{ID: resp.ID, Name: strings.TrimPrefix(resp.Name, "/"), ImageID: resp.Image}
	if resp.Config != nil {
		out.Labels = resp.Config.Labels
	}
	if st := resp.State; st != nil {
		out.State = ContainerState{
			Status:    st.Status,
			Running:   st.Running,
			Paused:    st.Paused,
			ExitCode:  st.ExitCode,
			OOMKilled: st.OOMKilled,
			Error:     st.Error,
		}
		out.State.StartedAt, _ = time.Parse(time.RFC3339Nano, st.StartedAt)
		out.State.FinishedAt, _ = time.Parse(time.RFC3339Nano, st.FinishedAt)
	}
	if ns := resp.NetworkSettings; ns != nil {
		for _, n := range []string{NetworkEgress, NetworkEgressPolicy} {
			if ep := ns.Networks[n]; ep != nil {
				if a, err := netip.ParseAddr(ep.IPAddress); err == nil && a.Is4() {
					out.EgressAddr = a
				}
			}
		}
	}
	return out
}

// Inspect returns a container by ID or name.
func (c *Client) Inspect(ctx context.Context, idOrName string) (Container, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	resp, err := c.docker.ContainerInspect(ctx, idOrName)
	if err != nil {
		return Container{}, classify(err, "inspecting container "+idOrName)
	}
	return fromInspect(c.awaitOOMFlag(ctx, resp)), nil
}

// oomFlagLag bounds how long after a container's exit Inspect waits for
// Docker to record that the exit was the OOM killer's.
const oomFlagLag = 3 * time.Second

// awaitOOMFlag re-inspects a container that has just exited with 137 (a
// SIGKILL) under a memory limit until Docker's record says whether the
// kernel's OOM killer did it, for at most oomFlagLag after the exit and
// within ctx. Docker 20.10 sets State.OOMKilled when it handles
// containerd's OOM event, apart from the exit event (daemon/monitor.go);
// the shim sends the two from different goroutines, so on a loaded host
// the exit can be recorded first, and an Inspect in between reports an
// OOM-killed sandbox as merely exited with 137. The wait costs only an
// inspect of a container that was SIGKILLed within the last few seconds;
// resp is returned as it is when the flag does not come.
func (c *Client) awaitOOMFlag(ctx context.Context, resp container.InspectResponse) container.InspectResponse {
	if !oomFlagPending(resp) {
		return resp
	}
	finished, err := time.Parse(time.RFC3339Nano, resp.State.FinishedAt)
	if err != nil {
		return resp
	}
	deadline := finished.Add(oomFlagLag)
	for delay := 5 * time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
			return resp
		case <-time.After(min(delay, time.Until(deadline))):
		}
		again, err := c.docker.ContainerInspect(ctx, resp.ID)
		if err != nil || again.ContainerJSONBase == nil || again.State == nil || again.State.Status != resp.State.Status {
			return resp
		}
		resp = again
		if resp.State.OOMKilled {
			return resp
		}
	}
	return resp
}

// oomFlagPending is an exit the OOM killer may have caused, not (yet)
// recorded as its.
func oomFlagPending(resp container.InspectResponse) bool {
	if resp.ContainerJSONBase == nil || resp.State == nil || resp.HostConfig == nil {
		return false
	}
	st := resp.State
	return (st.Status == container.StateExited || st.Status == container.StateDead) &&
		st.ExitCode == 137 && !st.OOMKilled && resp.HostConfig.Memory > 0
}

// ListFilter narrows ListManaged. Empty fields match everything.
type ListFilter struct {
	UID  string
	Node string
}

// ListManaged lists containers (running or not) that carry our managed-by
// label. Containers without it are invisible to this package.
func (c *Client) ListManaged(ctx context.Context, f ListFilter) ([]Container, error) {
	args := filters.NewArgs(filters.Arg("label", LabelManagedBy+"="+c.managedBy))
	if f.UID != "" {
		args.Add("label", LabelSandboxUID+"="+f.UID)
	}
	if f.Node != "" {
		args.Add("label", LabelNode+"="+f.Node)
	}
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	summaries, err := c.docker.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return nil, classify(err, "listing containers")
	}
	out := make([]Container, 0, len(summaries))
	for _, s := range summaries {
		name := ""
		if len(s.Names) > 0 {
			name = strings.TrimPrefix(s.Names[0], "/")
		}
		out = append(out, Container{
			ID:     s.ID,
			Name:   name,
			Labels: s.Labels,
			State:  ContainerState{Status: s.State, Running: s.State == container.StateRunning},
		})
	}
	return out, nil
}

// Find returns the one container that belongs to uid. It returns ErrNotFound
// when there is none and ErrMultipleContainers when the label is claimed
// more than once, or when the deterministic name is held by a container that
// is not ours.
func (c *Client) Find(ctx context.Context, uid string) (Container, error) {
	list, err := c.ListManaged(ctx, ListFilter{UID: uid})
	if err != nil {
		return Container{}, err
	}
	switch len(list) {
	case 0:
		// The name could still be squatted by an unlabelled container, which
		// would make every create fail; report that clearly.
		squatter, err := c.Inspect(ctx, ContainerName(uid))
		if err == nil && !squatter.OwnedBy(c.managedBy, uid) {
			return Container{}, fmt.Errorf("%w: container %s holds name %s without our labels", ErrMultipleContainers, ShortID(squatter.ID), ContainerName(uid))
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			return Container{}, err
		}
		return Container{}, fmt.Errorf("sandbox %s: %w", uid, ErrNotFound)
	case 1:
		// The label is only an index: the container must also hold the
		// deterministic name, which only a create for this UID can take.
		if list[0].Name != ContainerName(uid) {
			return Container{}, fmt.Errorf("%w: container %s (%s) carries sandbox UID %s but not the name %s; refusing to adopt it",
				ErrMultipleContainers, ShortID(list[0].ID), list[0].Name, uid, ContainerName(uid))
		}
		return c.Inspect(ctx, list[0].ID)
	default:
		ids := make([]string, 0, len(list))
		for _, ct := range list {
			ids = append(ids, ShortID(ct.ID))
		}
		return Container{}, fmt.Errorf("%w: %d containers carry sandbox UID %s: %s", ErrMultipleContainers, len(list), uid, strings.Join(ids, ", "))
	}
}

// ShortID is the 12-character form of a container ID, for messages.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
