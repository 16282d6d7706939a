package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
)

// CreateAndStart creates the sandbox container under its deterministic name
// and starts it. A name collision with our own container for the same UID is
// adopted rather than duplicated; a collision with anything else fails
// closed. A container that cannot be started is removed again, so a failed
// attempt leaves nothing behind.
func (c *Client) CreateAndStart(ctx context.Context, spec Spec) (Container, error) {
	if spec.Owner.ManagedBy == "" {
		spec.Owner.ManagedBy = c.managedBy
	}
	cfg, hostCfg, err := BuildContainerConfig(spec)
	if err != nil {
		return Container{}, err
	}
	s := spec.withDefaults()
	if err := c.EnsureImage(ctx, s.Image, s.PullPolicy); err != nil {
		return Container{}, err
	}
	if err := c.ensureTools(ctx); err != nil {
		return Container{}, err
	}
	if err := c.defaultPath(ctx, s.Image, cfg); err != nil {
		return Container{}, err
	}
	if s.Network == NetworkEgress {
		if err := c.EnsureEgressNetwork(ctx); err != nil {
			return Container{}, err
		}
	}
	name := ContainerName(s.Owner.UID)
	cctx, cancel := c.bounded(ctx)
	created, err := c.docker.ContainerCreate(cctx, cfg, hostCfg, nil, nil, name)
	cancel()
	var id string
	switch {
	case err == nil:
		id = created.ID
	case cerrdefs.IsConflict(err):
		existing, ierr := c.Inspect(ctx, name)
		if ierr != nil {
			return Container{}, ierr
		}
		if !existing.OwnedBy(s.Owner.ManagedBy, s.Owner.UID) {
			return Container{}, fmt.Errorf("%w: container %s holds name %s without our labels", ErrMultipleContainers, ShortID(existing.ID), name)
		}
		id = existing.ID
		if existing.State.Status != container.StateCreated {
			return existing, nil
		}
	case strings.Contains(err.Error(), "unknown or invalid runtime"):
		return Container{}, fmt.Errorf("%w: %q is not registered with the Docker Engine: %v", ErrRuntimeUnavailable, s.Runtime, err)
	case cerrdefs.IsNotFound(err):
		return Container{}, fmt.Errorf("%w: %v", ErrImageNotFound, err)
	default:
		return Container{}, classify(err, "creating container "+name)
	}
	if err := c.Start(ctx, id); err != nil {
		if !errors.Is(err, ErrUnavailable) {
			_ = c.Remove(context.WithoutCancel(ctx), id, 0)
		}
		return Container{}, err
	}
	ct, err := c.Inspect(ctx, id)
	if err == nil {
		// After the inspect, so that Docker's work on the exec does not
		// hold up this call (prestart.go).
		c.prestartHelper(id)
	}
	return ct, err
}

// EnsureEgressNetwork checks that egress sandboxes may be created: the
// firewall is in place (Options.EgressReady) and the egress network exists
// with the right options (created if missing).
func (c *Client) EnsureEgressNetwork(ctx context.Context) error {
	if c.egressReady != nil {
		if err := c.egressReady(ctx); err != nil {
			return fmt.Errorf("%w: %v", ErrEgressUnavailable, err)
		}
	}
	c.negotiate(ctx)
	nctx, cancel := c.bounded(ctx)
	defer cancel()
	if _, err := egress.EnsureNetwork(nctx, c.docker); err != nil {
		if errors.Is(err, egress.ErrNetworkMisconfigured) {
			return fmt.Errorf("%w: %v", ErrEgressUnavailable, err)
		}
		return classify(err, "preparing the egress network")
	}
	if c.egressReady != nil {
		// The firewall's rules live in this process's network namespace;
		// they filter the sandboxes only if Docker's bridge is here too.
		if err := egress.BridgeVisible(egress.BridgeName); err != nil {
			return fmt.Errorf("%w: %v", ErrEgressUnavailable, err)
		}
	}
	return nil
}

// Start starts a created container.
func (c *Client) Start(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.ContainerStart(ctx, id, container.StartOptions{})
	if err != nil && strings.Contains(err.Error(), "unknown or invalid runtime") {
		return fmt.Errorf("%w: %v", ErrRuntimeUnavailable, err)
	}
	return classify(err, "starting container "+ShortID(id))
}

// Remove stops a container with a grace period (SIGTERM, then SIGKILL), then
// removes it and its anonymous volumes. It returns nil only once Docker
// confirms the container is gone; a container that never existed counts as
// gone.
func (c *Client) Remove(ctx context.Context, id string, grace time.Duration) error {
	c.dropStandby(id)
	if grace > 0 {
		secs := int((grace + time.Second - 1) / time.Second)
		sctx, cancel := context.WithTimeout(ctx, grace+c.callTimeout)
		err := c.docker.ContainerStop(sctx, id, container.StopOptions{Timeout: &secs})
		cancel()
		if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsNotModified(err) {
			if cerr := classify(err, ""); errors.Is(cerr, ErrUnavailable) {
				return classify(err, "stopping container "+ShortID(id))
			}
			// Anything else (already stopping, say) is settled by the
			// forced removal below.
		}
	}
	rctx, cancel := c.bounded(ctx)
	err := c.docker.ContainerRemove(rctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	cancel()
	if err != nil && !cerrdefs.IsNotFound(err) && !strings.Contains(err.Error(), "is already in progress") {
		return classify(err, "removing container "+ShortID(id))
	}
	// Removal can be asynchronous ("removal in progress"); confirm.
	deadline := time.Now().Add(c.callTimeout)
	for {
		_, err := c.Inspect(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container %s still exists after removal", ShortID(id))
		}
		select {
		case <-ctx.Done():
			return classify(ctx.Err(), "waiting for removal of "+ShortID(id))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
