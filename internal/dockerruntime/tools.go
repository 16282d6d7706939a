package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"runtime"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
)

// ensureTools creates and fills the read-only tools volume (idle process and
// helper) once per process, and re-checks it on every create. It uses a
// never-started container of the trusted filler image (never a tenant's) as
// the copy target, because Docker only copies into volumes through a
// container.
func (c *Client) ensureTools(ctx context.Context) error {
	c.toolsMu.Lock()
	defer c.toolsMu.Unlock()
	elf, err := idleELF(runtime.GOARCH)
	if err != nil {
		return err
	}
	helper, err := helperBinary(runtime.GOARCH)
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{{"idle", elf}, {"helper", helper}}
	name := toolsVolumeName()
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	if c.toolsCreatedAt != "" {
		// `docker volume prune` can remove the volume under a running
		// manager; a sandbox's mount would then re-create it empty and the
		// sandbox would die with "exec /.code-sandbox/idle failed". So check
		// that it is still the volume we verified.
		vol, err := c.docker.VolumeInspect(ctx, name)
		if err == nil && vol.CreatedAt == c.toolsCreatedAt {
			return nil
		}
		if err != nil && !cerrdefs.IsNotFound(err) {
			return classify(err, "inspecting tools volume")
		}
		c.toolsCreatedAt = ""
	}
	vol, err := c.docker.VolumeCreate(ctx, volume.CreateOptions{
		Name:   name,
		Labels: map[string]string{LabelManagedBy: ManagedByValue},
	})
	if err != nil {
		return classify(err, "creating tools volume")
	}
	fillerImage, err := c.ensureFillerImage(ctx)
	if err != nil {
		return err
	}
	filler, err := c.docker.ContainerCreate(ctx,
		&container.Config{Image: fillerImage, Entrypoint: []string{fillerEntrypoint}, Cmd: []string{}, Labels: map[string]string{LabelManagedBy: ManagedByValue + "-tools"}},
		&container.HostConfig{
			NetworkMode: NetworkNone,
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: name, Target: toolsMountPath, VolumeOptions: &mount.VolumeOptions{NoCopy: true}}},
		}, nil, nil, "")
	if err != nil {
		return classify(err, "creating tools filler container")
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTimeout)
		defer rcancel()
		_ = c.docker.ContainerRemove(rctx, filler.ID, container.RemoveOptions{Force: true})
	}()
	filled := true
	for _, f := range files {
		stat, err := c.docker.ContainerStatPath(ctx, filler.ID, toolsMountPath+"/"+f.name)
		if err != nil || stat.Size != int64(len(f.data)) {
			filled = false
		}
	}
	if filled {
		c.toolsCreatedAt = vol.CreatedAt
		return nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o555, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("packing %s for the tools volume: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("packing %s for the tools volume: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("packing the tools volume: %w", err)
	}
	if err := c.docker.CopyToContainer(ctx, filler.ID, toolsMountPath, &buf, container.CopyToContainerOptions{}); err != nil {
		return classify(err, "filling tools volume")
	}
	c.toolsCreatedAt = vol.CreatedAt
	return nil
}
