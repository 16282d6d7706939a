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
	switch s.Network {
	case NetworkEgress:
		if err := c.EnsureEgressNetwork(ctx); err != nil {
			return Container{}, err
		}
	case NetworkEgressPolicy:
		if err := c.EnsureEgressPolicyNetwork(ctx); err != nil {
			return Container{}, err
		}
	}
	name := ContainerName(s.Owner.UID)
	mid, midVolume, err := c.machineIDMount(ctx)
	if err != nil {
		return Container{}, err
	}
	hostCfg.Mounts = append(hostCfg.Mounts, mid)
	cctx, cancel := c.bounded(ctx)
	created, err := c.docker.ContainerCreate(cctx, cfg, hostCfg, nil, nil, name)
	cancel()
	if err != nil {
		// Not created, or a container of that name exists with a
		// machine-id of its own.
		_ = c.removeMachineID(context.WithoutCancel(ctx), midVolume)
	}
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

// EnsureEgressPolicyNetwork is EnsureEgressNetwork for the network of the
// sandboxes with an egress policy (NetworkEgressPolicy).
func (c *Client) EnsureEgressPolicyNetwork(ctx context.Context) error {
	if c.egressReady != nil {
		if err := c.egressReady(ctx); err != nil {
			return fmt.Errorf("%w: %v", ErrEgressUnavailable, err)
		}
	}
	c.negotiate(ctx)
	nctx, cancel := c.bounded(ctx)
	defer cancel()
	if _, err := egress.EnsurePolicyNetwork(nctx, c.docker); err != nil {
		if errors.Is(err, egress.ErrNetworkMisconfigured) {
			return fmt.Errorf("%w: %v", ErrEgressUnavailable, err)
		}
		return classify(err, "preparing the egress policy network")
	}
	// Unlike EnsureEgressNetwork, always: a bridge the firewall's rules
	// cannot see would leave a policy sandbox unrestricted.
	if err := egress.BridgeVisible(egress.PolicyBridgeName); err != nil {
		return fmt.Errorf("%w: %v", ErrEgressUnavailable, err)
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
	// The container's machine-id volume (machineid.go) is removed once
	// the container is gone.
	var midVolume string
	ictx, icancel := c.bounded(ctx)
	if info, err := c.docker.ContainerInspect(ictx, id); err == nil {
		for _, m := range info.Mounts {
			if v := MachineIDVolumeOf(m.Destination, m.Source); v != "" {
				midVolume = v
			}
		}
	}
	icancel()
	if grace > 0 {
		// The stop must not race the resident helper's exec start
		// (prestart.go): containerd's shim holds back the container's exit
		// event while an exec is starting.
		c.awaitPrestart(ctx, id)
	}
	c.dropStandby(id)
	if grace > 0 {
		secs := int((grace + time.Second - 1) / time.Second)
		sctx, cancel := context.WithTimeout(ctx, grace+c.callTimeout)
		stopped := make(chan struct{})
		resent := make(chan struct{})
		go func() {
			defer close(resent)
			c.resendEarlyStop(sctx, id, stopped)
		}()
		err := c.docker.ContainerStop(sctx, id, container.StopOptions{Timeout: &secs})
		close(stopped)
		<-resent
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
		// Docker's record itself: Inspect's wait for an OOM flag
		// (awaitOOMFlag) is no use to a removal.
		ictx, icancel := c.bounded(ctx)
		_, err := c.docker.ContainerInspect(ictx, id)
		icancel()
		err = classify(err, "inspecting container "+id)
		if errors.Is(err, ErrNotFound) {
			return c.removeMachineID(ctx, midVolume)
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

const (
	// initSettle is how young a container must be for its stop signal to
	// have possibly come before its init was ready for it.
	initSettle = 2 * time.Second
	// stopResends is how many times, a second apart, the stop signal is
	// sent again to such a container while it has not stopped.
	stopResends = 3
)

// resendEarlyStop sends a young container's stop signal again, a second
// and more after Docker's stop sent it, while the container runs, until
// stopped is closed. A sandbox's PID 1 is Docker's init (tini), which blocks
// the signals it forwards a moment after runc has exec'd it; a signal that
// comes before that finds PID 1 of a PID namespace with no handler, and
// the kernel drops it. On a loaded host that moment can be long enough for
// a Remove right after CreateAndStart to hit it, and the stop then waited
// out the whole grace period for nothing. Only a container started within
// initSettle is concerned: once its init has set up its signals, one
// signal is all it gets, as from docker stop.
func (c *Client) resendEarlyStop(ctx context.Context, id string, stopped <-chan struct{}) {
	ct, err := c.docker.ContainerInspect(ctx, id)
	if err != nil || ct.ContainerJSONBase == nil || ct.State == nil || !ct.State.Running || ct.State.Paused {
		return
	}
	started, err := time.Parse(time.RFC3339Nano, ct.State.StartedAt)
	if err != nil || time.Since(started) > initSettle {
		return
	}
	signal := "TERM"
	if ct.Config != nil && ct.Config.StopSignal != "" {
		signal = ct.Config.StopSignal
	}
	for range stopResends {
		select {
		case <-stopped:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		cur, err := c.docker.ContainerInspect(ctx, id)
		if err != nil || cur.State == nil || !cur.State.Running || cur.State.Paused {
			return
		}
		_ = c.docker.ContainerKill(ctx, id, signal)
	}
}
