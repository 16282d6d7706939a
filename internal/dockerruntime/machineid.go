package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"path"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// Every sandbox gets a /etc/machine-id of its own (random, 32 hex digits),
// so that two sandboxes, a fork's children among them, never share one.
// The root filesystem is read-only, and Docker 20.10 can neither mount a
// tmpfs on a file (it makes a directory of an image's missing
// /etc/machine-id, and refuses a file) nor copy into a read-only root, and
// the sandbox user may not mount anything. So the file lives in a small
// volume of the sandbox's own, code-sandbox-id-<container name>, written
// through a never-started filler container (as the tools volume is), and
// is bind-mounted read-only from the volume's directory on the Engine's
// host onto /etc/machine-id. The volume itself is not mounted into the
// sandbox. Remove deletes it with the container.
const (
	machineIDPath         = "/etc/machine-id"
	machineIDVolumePrefix = "code-sandbox-id-"
)

// MachineIDVolume names the machine-id volume of the container named
// containerName (with or without Docker's leading "/").
func MachineIDVolume(containerName string) string {
	return machineIDVolumePrefix + strings.TrimPrefix(containerName, "/")
}

// machineIDMount creates (or finds) the machine-id volume for the
// container to be named containerName, writes a fresh machine-id into it,
// and returns the bind mount of that file.
func (c *Client) machineIDMount(ctx context.Context, containerName string) (mount.Mount, error) {
	name := MachineIDVolume(containerName)
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	vol, err := c.docker.VolumeCreate(ctx, volume.CreateOptions{
		Name:   name,
		Labels: map[string]string{LabelManagedBy: ManagedByValue + "-machine-id"},
	})
	if err != nil {
		return mount.Mount{}, classify(err, "creating machine-id volume "+name)
	}
	if vol.Mountpoint == "" || !path.IsAbs(vol.Mountpoint) {
		return mount.Mount{}, fmt.Errorf("machine-id volume %s has no local mount point (driver %q)", name, vol.Driver)
	}
	c.toolsMu.Lock()
	fillerImage, err := c.ensureFillerImage(ctx)
	c.toolsMu.Unlock()
	if err != nil {
		return mount.Mount{}, err
	}
	filler, err := c.docker.ContainerCreate(ctx,
		&container.Config{Image: fillerImage, Entrypoint: []string{fillerEntrypoint}, Cmd: []string{}, Labels: map[string]string{LabelManagedBy: ManagedByValue + "-tools"}},
		&container.HostConfig{
			NetworkMode: NetworkNone,
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: name, Target: "/id", VolumeOptions: &mount.VolumeOptions{NoCopy: true}}},
		}, nil, nil, "")
	if err != nil {
		return mount.Mount{}, classify(err, "creating machine-id filler container")
	}
	defer func() {
		rctx, rcancel := c.bounded(context.WithoutCancel(ctx))
		defer rcancel()
		_ = c.docker.ContainerRemove(rctx, filler.ID, container.RemoveOptions{Force: true})
	}()
	id := randid.Hex(16) + "\n"
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "machine-id", Mode: 0o444, Size: int64(len(id)), Typeflag: tar.TypeReg}); err != nil {
		return mount.Mount{}, err
	}
	_, _ = tw.Write([]byte(id))
	if err := tw.Close(); err != nil {
		return mount.Mount{}, err
	}
	if err := c.docker.CopyToContainer(ctx, filler.ID, "/id", &buf, container.CopyToContainerOptions{}); err != nil {
		return mount.Mount{}, classify(err, "writing the machine-id")
	}
	return mount.Mount{
		Type:     mount.TypeBind,
		Source:   path.Join(vol.Mountpoint, "machine-id"),
		Target:   machineIDPath,
		ReadOnly: true,
	}, nil
}

// removeMachineID removes the machine-id volume of the container named
// containerName, once the container is gone.
func (c *Client) removeMachineID(ctx context.Context, containerName string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.VolumeRemove(ctx, MachineIDVolume(containerName), true)
	if err != nil && !cerrdefs.IsNotFound(err) {
		return classify(err, "removing machine-id volume "+MachineIDVolume(containerName))
	}
	return nil
}
