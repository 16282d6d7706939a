package dockerruntime

import (
	"context"
	"errors"
	"fmt"
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
	out := Container{ID: resp.ID, Name: strings.TrimPrefix(resp.Name, "/")}
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
	return fromInspect(resp), nil
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
