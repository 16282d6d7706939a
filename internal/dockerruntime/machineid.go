package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// Every sandbox gets a /etc/machine-id of its own (random, 32 hex digits),
// so that two sandboxes, a fork's children among them, never share one.
// The root filesystem is read-only, Docker 20.10 can neither mount a tmpfs
// on a file (it makes a directory of an image's missing /etc/machine-id,
// and refuses a file) nor copy into a read-only root, and the sandbox user
// may not mount anything. So the file lives in a small volume of the
// sandbox's own (code-sandbox-id-<random>), written through a never-started
// filler container as the tools volume is, and is bind-mounted read-only
// from the volume's directory on the Engine's host onto /etc/machine-id.
// The volume itself is not mounted into the sandbox. Remove deletes it with
// the container (found from the container's mounts).
//
// Writing one costs a volume, a filler container and a copy: about 150 ms
// on a loaded two-core machine, a quarter of a create. So a client keeps a
// few ready (machineIDPoolSize), written in batches by one filler in the
// background, and a create takes one; only a create that finds none
// writes its own. Close (and ReleaseMachineIDs) removes the ready ones;
// a process killed before that leaves at most machineIDPoolSize, which the
// next client's sweep removes once they are an hour old and no container
// mounts them (sweepMachineIDs). `docker volume prune` counts these volumes unused (Docker does
// not count a bind of a file inside a volume) and removes them: a running
// sandbox then sees its image's /etc/machine-id again.
const (
	machineIDPath         = "/etc/machine-id"
	machineIDVolumePrefix = "code-sandbox-id-"
	machineIDPoolSize     = 8
	machineIDLowWater     = 4
	// machineIDMaxAge: a ready machine-id older than this is not used (and
	// removed), so one a prune removed since is not handed out.
	machineIDMaxAge = 10 * time.Minute
	// machineIDOrphanAge: an unmounted machine-id volume this old is no
	// client's ready one (those are used or dropped within
	// machineIDMaxAge), so the sweep may remove it.
	machineIDOrphanAge = time.Hour
	machineIDLabel     = ManagedByValue + "-machine-id"
)

type preparedID struct {
	volume, source string
	at             time.Time
}

type machineIDPool struct {
	mu      sync.Mutex
	ready   []preparedID
	filling bool
	closed  bool
	// lastSweep is when sweepMachineIDs last ran (machineIDSweepEvery).
	lastSweep time.Time
	// background counts the refills and removals running on their own,
	// so that Close waits for them: a process that exits while a refill's
	// never-started filler container exists leaves it on the Engine.
	background sync.WaitGroup
}

// machineIDCloseWait bounds how long Close waits for a background refill
// (a few Docker calls; the client's own call timeout bounds each).
const machineIDCloseWait = 30 * time.Second

func (p preparedID) mount() mount.Mount {
	return mount.Mount{Type: mount.TypeBind, Source: p.source, Target: machineIDPath, ReadOnly: true}
}

// MachineIDVolumeOf returns the machine-id volume of a container from one
// of its mounts' destination and source, or "" when it is not that mount.
func MachineIDVolumeOf(destination, source string) string {
	if destination != machineIDPath || path.Base(source) != "machine-id" {
		return ""
	}
	// <volumes>/<name>/_data/machine-id
	name := path.Base(path.Dir(path.Dir(source)))
	if !strings.HasPrefix(name, machineIDVolumePrefix) || path.Base(path.Dir(source)) != "_data" {
		return ""
	}
	return name
}

// machineIDMount returns the bind mount of a fresh machine-id for a
// container about to be created.
func (c *Client) machineIDMount(ctx context.Context) (mount.Mount, string, error) {
	p := &c.machineIDs
	p.mu.Lock()
	var got *preparedID
	var stale []preparedID
	for len(p.ready) > 0 && got == nil {
		id := p.ready[0]
		p.ready = p.ready[1:]
		if time.Since(id.at) < machineIDMaxAge {
			got = &id
		} else {
			stale = append(stale, id)
		}
	}
	if now := time.Now(); now.Sub(p.lastSweep) > machineIDSweepEvery {
		// Not only once: what a process on this Engine killed later left
		// (a filler, its volumes) is found by the next sweep.
		p.lastSweep = now
		go c.sweepMachineIDs(context.WithoutCancel(ctx), machineIDOrphanAge)
	}
	refill := !p.filling && !p.closed && len(p.ready) < machineIDLowWater
	n := machineIDPoolSize - len(p.ready)
	if refill {
		p.filling = true
	}
	// Added under the lock, and never once closed, so that Close's Wait
	// sees every background run.
	background := (refill || len(stale) > 0) && !p.closed
	if background {
		p.background.Add(1)
	}
	p.mu.Unlock()
	if background {
		go func() {
			defer p.background.Done()
			bctx := context.WithoutCancel(ctx)
			for _, s := range stale {
				_ = c.removeMachineID(bctx, s.volume)
			}
			if !refill {
				return
			}
			ids, _ := c.prepareMachineIDs(bctx, n)
			p.mu.Lock()
			p.filling = false
			if p.closed {
				p.mu.Unlock()
				for _, id := range ids {
					_ = c.removeMachineID(bctx, id.volume)
				}
				return
			}
			p.ready = append(p.ready, ids...)
			p.mu.Unlock()
		}()
	}
	if got != nil {
		return got.mount(), got.volume, nil
	}
	ids, err := c.prepareMachineIDs(ctx, 1)
	if err != nil {
		return mount.Mount{}, "", err
	}
	return ids[0].mount(), ids[0].volume, nil
}

// prepareMachineIDs makes n volumes, each holding a fresh machine-id,
// through one filler container.
func (c *Client) prepareMachineIDs(ctx context.Context, n int) ([]preparedID, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var ids []preparedID
	fail := func(err error) ([]preparedID, error) {
		for _, id := range ids {
			_ = c.removeMachineID(context.WithoutCancel(ctx), id.volume)
		}
		return nil, err
	}
	mounts := make([]mount.Mount, 0, n)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := range n {
		name := machineIDVolumePrefix + randid.Hex(12)
		vol, err := c.docker.VolumeCreate(ctx, volume.CreateOptions{
			Name:   name,
			Labels: map[string]string{LabelManagedBy: machineIDLabel},
		})
		if err != nil {
			return fail(classify(err, "creating machine-id volume "+name))
		}
		ids = append(ids, preparedID{volume: name, source: path.Join(vol.Mountpoint, "machine-id"), at: time.Now()})
		if vol.Mountpoint == "" || !path.IsAbs(vol.Mountpoint) {
			return fail(fmt.Errorf("machine-id volume %s has no local mount point (driver %q)", name, vol.Driver))
		}
		dir := fmt.Sprintf("id%d", i)
		mounts = append(mounts, mount.Mount{Type: mount.TypeVolume, Source: name, Target: "/" + dir, VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
		content := randid.Hex(16) + "\n"
		if err := tw.WriteHeader(&tar.Header{Name: dir + "/machine-id", Mode: 0o444, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			return fail(err)
		}
		_, _ = tw.Write([]byte(content))
	}
	if err := tw.Close(); err != nil {
		return fail(err)
	}
	c.toolsMu.Lock()
	fillerImage, err := c.ensureFillerImage(ctx)
	c.toolsMu.Unlock()
	if err != nil {
		return fail(err)
	}
	filler, err := c.docker.ContainerCreate(ctx,
		&container.Config{Image: fillerImage, Entrypoint: []string{fillerEntrypoint}, Cmd: []string{}, Labels: map[string]string{LabelManagedBy: ManagedByValue + "-tools"}},
		&container.HostConfig{NetworkMode: NetworkNone, Mounts: mounts}, nil, nil, "")
	if err != nil {
		return fail(classify(err, "creating machine-id filler container"))
	}
	defer func() {
		rctx, rcancel := c.bounded(context.WithoutCancel(ctx))
		defer rcancel()
		_ = c.docker.ContainerRemove(rctx, filler.ID, container.RemoveOptions{Force: true})
	}()
	if err := c.docker.CopyToContainer(ctx, filler.ID, "/", &buf, container.CopyToContainerOptions{}); err != nil {
		return fail(classify(err, "writing machine-ids"))
	}
	return ids, nil
}

// removeMachineID removes a machine-id volume (nothing if name is "").
func (c *Client) removeMachineID(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.VolumeRemove(ctx, name, true)
	if err != nil && !cerrdefs.IsNotFound(err) {
		return classify(err, "removing machine-id volume "+name)
	}
	return nil
}

// closeMachineIDs removes the ready machine-ids nobody took, for good.
func (c *Client) closeMachineIDs() {
	c.machineIDs.mu.Lock()
	c.machineIDs.closed = true
	c.machineIDs.mu.Unlock()
	done := make(chan struct{})
	go func() { c.machineIDs.background.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(machineIDCloseWait):
	}
	c.ReleaseMachineIDs(context.Background())
}

// ReleaseMachineIDs removes the machine-ids written ahead that nobody took
// (for an owner of the client that stops creating sandboxes, such as the
// MCP server's Docker backend at exit). Later creates write new ones.
func (c *Client) ReleaseMachineIDs(ctx context.Context) {
	p := &c.machineIDs
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, id := range ready {
		_ = c.removeMachineID(context.WithoutCancel(ctx), id.volume)
	}
}

// fillerOrphanAge: a never-started filler container (tools.go,
// prepareMachineIDs) older than this was left by a process that died while
// it existed; live ones last a few Docker calls.
const fillerOrphanAge = 2 * time.Minute

// machineIDSweepEvery: creates run the sweep at most this often.
const machineIDSweepEvery = 5 * time.Minute

// orphanFiller reports whether a container is a filler left behind.
func orphanFiller(labels map[string]string, state string, created time.Time) bool {
	return labels[LabelManagedBy] == ManagedByValue+"-tools" && state == "created" && time.Since(created) > fillerOrphanAge
}

// sweepMachineIDs removes filler containers killed processes left
// (orphanFiller) and machine-id volumes that no container mounts and
// that are older than minAge (machineIDOrphanAge): what killed processes
// left.
func (c *Client) sweepMachineIDs(ctx context.Context, minAge time.Duration) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	vols, err := c.docker.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelManagedBy+"="+machineIDLabel))})
	if err != nil {
		return
	}
	cts, err := c.docker.ContainerList(ctx, container.ListOptions{All: true})
	if err != nil {
		return
	}
	used := map[string]bool{}
	for _, ct := range cts {
		if orphanFiller(ct.Labels, ct.State, time.Unix(ct.Created, 0)) {
			// A filler is never started and lives for a few calls; one this
			// old was left by a process killed mid-refill. Its volumes are
			// then unused too.
			_ = c.docker.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true})
			continue
		}
		for _, m := range ct.Mounts {
			if v := MachineIDVolumeOf(m.Destination, m.Source); v != "" {
				used[v] = true
			}
			used[m.Name] = true // a filler's volume mount
		}
	}
	for _, v := range vols.Volumes {
		created, err := time.Parse(time.RFC3339, v.CreatedAt)
		if err != nil || time.Since(created) < minAge || used[v.Name] || !strings.HasPrefix(v.Name, machineIDVolumePrefix) {
			continue
		}
		_ = c.removeMachineID(ctx, v.Name)
	}
}
