package dockerruntime

import (
	"context"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
)

// Event is a Docker container event for one of our containers.
type Event struct {
	// Action is Docker's: start, die, oom, destroy, …
	Action      string
	ContainerID string
	Owner       Owner
}

// WatchEvents streams lifecycle events of our containers on one node until
// the stream breaks or ctx ends; it returns the reason. Callers resubscribe
// and resync, because events that happen while disconnected are lost.
func (c *Client) WatchEvents(ctx context.Context, node string, handle func(Event)) error {
	args := filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("label", LabelManagedBy+"="+c.managedBy),
	)
	if node != "" {
		args.Add("label", LabelNode+"="+node)
	}
	for _, action := range []events.Action{events.ActionStart, events.ActionDie, events.ActionOOM, events.ActionDestroy, events.ActionCreate,
		events.ActionPause, events.ActionUnPause} {
		args.Add("event", string(action))
	}
	c.negotiate(ctx)
	msgs, errs := c.docker.Events(ctx, events.ListOptions{Filters: args})
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return classify(err, "watching Docker events")
		case m := <-msgs:
			attrs := m.Actor.Attributes
			handle(Event{
				Action:      string(m.Action),
				ContainerID: m.Actor.ID,
				Owner: Owner{
					UID:       attrs[LabelSandboxUID],
					Namespace: attrs[LabelNamespace],
					Name:      attrs[LabelName],
					Node:      attrs[LabelNode],
				},
			})
		}
	}
}
