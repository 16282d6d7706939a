// Package dockerruntime is the one place that talks to the Docker Engine. It
// builds hardened container specs, creates, adopts, inspects and removes
// sandbox containers, streams Docker events, runs commands and reads logs.
// The operator's controller and the MCP server's Docker backend both use it,
// so their sandboxes are identical.
package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/go-logr/logr"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
)

// Errors callers branch on. They are wrapped with Docker's message, so
// errors.Is works and the text still says what happened.
var (
	// ErrUnavailable: the Docker Engine did not answer (not running, socket
	// missing, or a call timed out).
	ErrUnavailable = errors.New("docker engine unavailable")
	// ErrNotFound: no such container.
	ErrNotFound = errors.New("container not found")
	// ErrMultipleContainers: more than one container claims one owner UID,
	// or a foreign container holds the deterministic name. Fail closed.
	ErrMultipleContainers = errors.New("conflicting containers for one sandbox")
	// ErrImageNotFound: the image is absent and could not (or may not) be
	// pulled.
	ErrImageNotFound = errors.New("image not found")
	// ErrRuntimeUnavailable: the requested OCI runtime is not configured in
	// the Docker Engine.
	ErrRuntimeUnavailable = errors.New("container runtime unavailable")
	// ErrEgressUnavailable: an egress sandbox cannot be created because the
	// egress network or its firewall is not in place. Fail closed.
	ErrEgressUnavailable = errors.New("egress network unavailable")
	// ErrImageNotAllowed: the image's registry is refused by the client's
	// image policy (Options.ImagePolicy). Nothing was pulled.
	ErrImageNotAllowed = imagepolicy.ErrNotAllowed
	// ErrImagePullFailed: a pull was attempted and failed. Such errors are
	// *PullError (which also matches ErrImageNotFound).
	ErrImagePullFailed = errors.New("ImagePullFailed")
	// ErrPaused: the container is frozen (paused); Docker refuses to exec
	// in it until it is unpaused.
	ErrPaused = errors.New("container is paused")
)

// PullFailure names the class of a failed pull. The class, never the
// daemon's text, is what callers may show to tenants: the daemon's error
// can carry fragments of the registry's response body.
type PullFailure string

const (
	PullImageNotFound       PullFailure = "image not found"
	PullUnauthorized        PullFailure = "unauthorized"
	PullRegistryUnreachable PullFailure = "registry unreachable"
	PullRegistryRefused     PullFailure = "registry refused"
	PullTimedOut            PullFailure = "timed out"
	PullFailed              PullFailure = "pull failed"
)

// PullError is a failed image pull. Its message is "ImagePullFailed:
// CLASS (pulling REF)" and nothing else.
type PullError struct {
	Ref   string
	Class PullFailure
	// Detail is the daemon's own error. It may contain registry response
	// bodies: log it for the operator, never show it to a tenant. It is
	// neither in Error() nor reachable through errors.Unwrap.
	Detail error
}

func (e *PullError) Error() string {
	return fmt.Sprintf("%s: %s (pulling %s)", ErrImagePullFailed, e.Class, e.Ref)
}

// Unwrap makes a PullError match ErrImagePullFailed and ErrImageNotFound.
func (e *PullError) Unwrap() []error { return []error{ErrImagePullFailed, ErrImageNotFound} }

// classifyPull maps the daemon's pull error to a PullFailure. The
// reference is cut out of the text first, so that its port or name cannot
// look like a status code.
func classifyPull(err error, ref string, timedOut bool) PullFailure {
	msg := strings.ToLower(err.Error())
	if ref = strings.ToLower(ref); ref != "" {
		msg = strings.ReplaceAll(msg, ref, "")
	}
	if registry, _ := imagepolicy.Registry(ref); registry != "" {
		msg = strings.ReplaceAll(msg, registry, "")
	}
	has := func(subs ...string) bool {
		for _, sub := range subs {
			if strings.Contains(msg, sub) {
				return true
			}
		}
		return false
	}
	switch {
	case timedOut:
		return PullTimedOut
	case cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err),
		has("unauthorized", "authentication required", "denied", "forbidden", "status: 401", "status: 403"):
		return PullUnauthorized
	case has("manifest unknown", "name unknown", "not found", "status: 404", "no matching manifest"):
		return PullImageNotFound
	case has("connection refused", "no such host", "network is unreachable", "host is unreachable",
		"i/o timeout", "connection reset", "eof", "tls", "x509", "certificate", "http response to https client",
		"dial tcp", "lookup ", "timeout"):
		return PullRegistryUnreachable
	case has("status", "response", "unexpected http", "error parsing http"):
		return PullRegistryRefused
	}
	return PullFailed
}

// Options configure a Client.
type Options struct {
	// Host is the Docker endpoint, for example unix:///var/run/docker.sock.
	// Empty means DOCKER_HOST or the default socket.
	Host string
	// CallTimeout bounds every short Docker call (inspect, create, list…).
	CallTimeout time.Duration
	// PullTimeout bounds an image pull.
	PullTimeout time.Duration
	// ManagedBy is the LabelManagedBy value this client creates, lists and
	// adopts; empty means ManagedByValue (the operator). Each owner sees
	// only its own containers.
	ManagedBy string
	// ImagePolicy decides which registries images may name; nil means
	// imagepolicy.Default() (public registries only). It applies to every
	// image, present on the node or not.
	ImagePolicy *imagepolicy.Policy
	// EgressReady, if set, must return nil before an egress sandbox is
	// created (the egress firewall is installed); otherwise the create
	// fails with ErrEgressUnavailable.
	EgressReady func(context.Context) error
}

// Client wraps the Docker API client with bounded calls and this project's
// ownership rules.
type Client struct {
	docker      *client.Client
	managedBy   string
	negotiated  atomic.Bool
	negotiateMu sync.Mutex
	callTimeout time.Duration
	pullTimeout time.Duration
	egressReady func(context.Context) error
	imagePolicy *imagepolicy.Policy

	standby standbys
	thaws   thaws

	toolsMu sync.Mutex
	// toolsCreatedAt identifies the tools volume this client verified ("" if
	// none yet), so a volume removed and re-created since (empty) is noticed.
	toolsCreatedAt string
	// fillerID is the tools filler image's ID (a content address) once
	// imported or verified; guarded by toolsMu.
	fillerID string
}

// New connects lazily to Docker: it never fails because the daemon is down,
// so a manager can start first and report DockerUnavailable.
func New(opts Options) (*Client, error) {
	clientOpts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if opts.Host != "" {
		clientOpts = append(clientOpts, client.WithHost(opts.Host))
	}
	docker, err := client.NewClientWithOpts(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating Docker client for %q: %w", opts.Host, err)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	if opts.PullTimeout <= 0 {
		opts.PullTimeout = 5 * time.Minute
	}
	if opts.ManagedBy == "" {
		opts.ManagedBy = ManagedByValue
	}
	if opts.ImagePolicy == nil {
		opts.ImagePolicy = imagepolicy.Default()
	}
	return &Client{docker: docker, managedBy: opts.ManagedBy, callTimeout: opts.CallTimeout, pullTimeout: opts.PullTimeout, imagePolicy: opts.ImagePolicy, egressReady: opts.EgressReady}, nil
}

// Docker exposes the underlying client for tests and benchmarks that need raw
// Docker as a baseline.
func (c *Client) Docker() *client.Client { return c.docker }

// Close releases the client's connections.
func (c *Client) Close() error {
	c.closeStandbys()
	return c.docker.Close()
}

// Host is the Docker endpoint in use.
func (c *Client) Host() string { return c.docker.DaemonHost() }

func (c *Client) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	c.negotiate(ctx)
	return ctx, cancel
}

// negotiate settles the API version before concurrent use. The Docker
// client negotiates lazily on its first request, but some of its methods
// read the version without its lock, so concurrent first requests race.
// Until a negotiation succeeds, each call retries it (the daemon may come
// up later); afterwards this is one atomic load.
func (c *Client) negotiate(ctx context.Context) {
	if c.negotiated.Load() {
		return
	}
	c.negotiateMu.Lock()
	defer c.negotiateMu.Unlock()
	if c.negotiated.Load() {
		return
	}
	ping, err := c.docker.Ping(ctx)
	if err != nil {
		return
	}
	c.docker.NegotiateAPIVersionPing(ping)
	c.negotiated.Store(true)
}

// classify maps transport failures to ErrUnavailable and Docker's typed
// errors to ours, keeping the original text.
func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	// Only failures to reach the daemon count as unavailable: an error the
	// daemon itself returns (say, a registry refusing a pull) does not.
	var netErr net.Error
	switch {
	case client.IsErrConnectionFailed(err),
		errors.Is(err, context.DeadlineExceeded),
		cerrdefs.IsUnavailable(err),
		errors.As(err, &netErr):
		return fmt.Errorf("%s: %w: %v", what, ErrUnavailable, err)
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s: %w: %v", what, ErrNotFound, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Ping checks that the daemon answers.
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.docker.Ping(ctx)
	return classify(err, "pinging Docker")
}

// HasRuntime reports whether the daemon has an OCI runtime registered.
func (c *Client) HasRuntime(ctx context.Context, name string) (bool, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	info, err := c.docker.Info(ctx)
	if err != nil {
		return false, classify(err, "reading Docker info")
	}
	_, ok := info.Runtimes[name]
	return ok, nil
}

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

// EnsureImage makes the image present according to the pull policy. The
// image policy is checked first, whether the image is present or not, so a
// refused registry is never contacted. A failed pull is a *PullError, whose
// message names the failure class only; the daemon's text is logged (to
// ctx's logr logger) and kept in PullError.Detail.
func (c *Client) EnsureImage(ctx context.Context, ref string, policy PullPolicy) error {
	if err := c.imagePolicy.Check(ref); err != nil {
		return err
	}
	present := func() (bool, error) {
		ictx, cancel := c.bounded(ctx)
		defer cancel()
		_, err := c.docker.ImageInspect(ictx, ref)
		if err == nil {
			return true, nil
		}
		if cerrdefs.IsNotFound(err) {
			return false, nil
		}
		return false, classify(err, "inspecting image "+ref)
	}
	if policy != PullAlways {
		ok, err := present()
		if err != nil || ok {
			return err
		}
		if policy == PullNever {
			return fmt.Errorf("%w: %s is not present on the node and imagePullPolicy is Never", ErrImageNotFound, ref)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, c.pullTimeout)
	defer cancel()
	rc, err := c.docker.ImagePull(pctx, ref, image.PullOptions{})
	if err == nil {
		err = drainPull(rc)
	}
	if err != nil {
		// Only a failure to reach the daemon itself means Docker is
		// unavailable. The daemon's own pull errors (a registry refusing
		// the connection, even a 503) mean the image cannot be had.
		var netErr net.Error
		if client.IsErrConnectionFailed(err) || (errors.As(err, &netErr) && !errors.Is(err, context.DeadlineExceeded)) {
			return classify(err, "pulling image "+ref)
		}
		// An Always policy may still run a cached image when the registry
		// is unreachable, as kubelet does not; we stay strict and report.
		// The daemon's text may quote the registry's response: it goes to
		// the operator's log only.
		timedOut := errors.Is(err, context.DeadlineExceeded) || (pctx.Err() != nil && ctx.Err() == nil)
		pe := &PullError{Ref: ref, Class: classifyPull(err, ref, timedOut), Detail: err}
		logr.FromContextOrDiscard(ctx).Info("image pull failed", "image", ref, "class", string(pe.Class), "error", err.Error())
		return pe
	}
	return nil
}

// drainPull reads the pull progress stream to its end; errors arrive inside
// the stream as JSON messages.
func drainPull(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return err
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if i := bytes.Index(line, []byte(`"error":`)); i >= 0 {
			return errors.New(strings.TrimSpace(string(line)))
		}
	}
	return nil
}

// ensureFillerImage makes the trusted tools filler image present and
// returns its image ID, never its tag: the tag is a public name, and a
// tenant's `imagePullPolicy: Always` pull of
// code-sandbox-operator/tools-filler:<hash> re-points it on the node to
// whatever a registry serves. The ID is a content address (the digest of
// the image's configuration, which lists its layers' digests), so the image
// is verified once by content (fillerImageOK) and then used by ID: the ID
// this client imported or verified, re-checked on every use. A tag that
// names anything else is imported over (the tag is only a convenience for
// finding the image again after a restart).
func (c *Client) ensureFillerImage(ctx context.Context) (string, error) {
	if c.fillerID != "" {
		img, err := c.docker.ImageInspect(ctx, c.fillerID)
		if err == nil && fillerImageOK(img) {
			return c.fillerID, nil
		}
		if err != nil && !cerrdefs.IsNotFound(err) {
			return "", classify(err, "inspecting the tools filler image")
		}
		c.fillerID = "" // removed (docker image prune): import it again
	}
	ref := ToolsFillerImage()
	img, err := c.docker.ImageInspect(ctx, ref)
	switch {
	case err == nil && fillerImageOK(img):
		c.fillerID = img.ID
		return img.ID, nil
	case err == nil:
		logr.FromContextOrDiscard(ctx).Info("the tools filler tag names an image that is not the filler; importing the filler again", "tag", ref, "image", img.ID)
	case !cerrdefs.IsNotFound(err):
		return "", classify(err, "inspecting the tools filler image")
	}
	rc, err := c.docker.ImageImport(ctx, image.ImportSource{Source: bytes.NewReader(fillerRootfs()), SourceName: "-"}, ref,
		image.ImportOptions{Changes: fillerImportChanges, Message: "code-sandbox-operator tools volume filler"})
	var id string
	if err == nil {
		id, err = drainImport(rc)
	}
	if err != nil {
		return "", classify(err, "importing the tools filler image")
	}
	// Verified by the ID the import reported, never by the tag, which a
	// concurrent pull may already have re-pointed.
	if img, err = c.docker.ImageInspect(ctx, id); err != nil {
		return "", classify(err, "inspecting the imported tools filler image")
	}
	if !fillerImageOK(img) {
		return "", fmt.Errorf("the imported tools filler image %s does not have the filler's content", id)
	}
	c.fillerID = img.ID
	return img.ID, nil
}

// drainImport reads an image import's progress stream to its end and
// returns the image ID it reports ({"status":"sha256:…"}).
func drainImport(rc io.ReadCloser) (string, error) {
	defer rc.Close()
	var id string
	dec := json.NewDecoder(io.LimitReader(rc, 1<<20))
	for {
		var m struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", fmt.Errorf("reading the import's response: %w", err)
		}
		if m.Error != "" {
			return "", errors.New(m.Error)
		}
		if strings.HasPrefix(m.Status, "sha256:") {
			id = strings.TrimSpace(m.Status)
		}
	}
	if id == "" {
		return "", errors.New("the image import reported no image ID")
	}
	return id, nil
}

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

// DefaultPathEnv is the PATH a container gets when neither its image nor
// its spec sets one: containerd's (and runc's) standard default.
const DefaultPathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// defaultPath adds PATH=DefaultPathEnv to cfg's environment when the image
// configuration has no PATH (images made with `docker import` or
// debootstrap) and the spec sets none, so that the helper finds commands by
// name ("sh") whatever the engine adds on its own. A PATH in the spec, or in
// an exec's environment, still wins.
func (c *Client) defaultPath(ctx context.Context, ref string, cfg *container.Config) error {
	for _, kv := range cfg.Env {
		if strings.HasPrefix(kv, "PATH=") {
			return nil
		}
	}
	ictx, cancel := c.bounded(ctx)
	defer cancel()
	img, err := c.docker.ImageInspect(ictx, ref)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("%w: %s is not present on the node", ErrImageNotFound, ref)
		}
		return classify(err, "inspecting image "+ref)
	}
	if img.Config != nil {
		for _, kv := range img.Config.Env {
			if strings.HasPrefix(kv, "PATH=") {
				return nil
			}
		}
	}
	cfg.Env = append(cfg.Env, "PATH="+DefaultPathEnv)
	return nil
}

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
	return c.Inspect(ctx, id)
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

// Pause freezes a running container with the cgroup freezer: its processes
// get no CPU time and keep their memory. Pausing a paused container is not
// an error.
func (c *Client) Pause(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.ContainerPause(ctx, id)
	if err != nil && strings.Contains(err.Error(), "already paused") {
		return nil
	}
	return classify(err, "pausing container "+ShortID(id))
}

// Unpause thaws a paused container. Unpausing a running container that is
// not paused is not an error.
func (c *Client) Unpause(ctx context.Context, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	err := c.docker.ContainerUnpause(ctx, id)
	if err != nil && strings.Contains(err.Error(), "is not paused") {
		return nil
	}
	return classify(err, "unpausing container "+ShortID(id))
}

// thaws are the unpauses BeginUnpause started that have not ended.
type thaws struct {
	mu       sync.Mutex
	inflight map[string]*thaw
}

type thaw struct {
	done chan struct{}
	err  error
}

// BeginUnpause starts thawing container id and returns at once; wait says
// how the thaw ended. Until it ends, RunCommand, CopyIn and CopyOut on id
// wait for it, so the caller may declare the container usable (a warm
// claim's Ready) while Docker is still thawing it.
func (c *Client) BeginUnpause(id string) (wait func(context.Context) error) {
	t := &thaw{done: make(chan struct{})}
	c.thaws.mu.Lock()
	if c.thaws.inflight == nil {
		c.thaws.inflight = map[string]*thaw{}
	}
	c.thaws.inflight[id] = t
	c.thaws.mu.Unlock()
	go func() {
		t.err = c.Unpause(context.Background(), id)
		c.thaws.mu.Lock()
		if c.thaws.inflight[id] == t {
			delete(c.thaws.inflight, id)
		}
		c.thaws.mu.Unlock()
		close(t.done)
	}()
	return func(ctx context.Context) error {
		select {
		case <-t.done:
			return t.err
		case <-ctx.Done():
			return classify(ctx.Err(), "waiting for container "+ShortID(id)+" to thaw")
		}
	}
}

// awaitThaw waits for a thaw of id that BeginUnpause started. If it
// failed, the operation that waited finds the container paused itself.
func (c *Client) awaitThaw(ctx context.Context, id string) error {
	c.thaws.mu.Lock()
	t := c.thaws.inflight[id]
	c.thaws.mu.Unlock()
	if t == nil {
		return nil
	}
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return classify(ctx.Err(), "waiting for container "+ShortID(id)+" to thaw")
	}
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

// ExecOptions describe one command run in a sandbox.
type ExecOptions struct {
	Cmd        []string
	WorkingDir string
	Env        []string
	Stdin      io.Reader
	// openStdin attaches stdin for the caller to write to the attachment
	// (a serve helper's requests), instead of copying Stdin.
	openStdin bool
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int
	Duration time.Duration
}

// Exec runs a command in a running sandbox as the sandbox's user and streams
// its output to stdout and stderr as it arrives. The command is passed as
// argv; nothing is interpreted by a shell on the host. Unlike RunCommand it
// has no timeout of its own and cannot kill what it started: ending ctx only
// stops waiting.
func (c *Client) Exec(ctx context.Context, id string, opts ExecOptions, stdout, stderr io.Writer) (ExecResult, error) {
	start := time.Now()
	execID, attach, err := c.startExec(ctx, id, opts)
	if err != nil {
		return ExecResult{}, err
	}
	defer attach.Close()
	copyDone := make(chan error, 1)
	go func() { copyDone <- copyExecOutput(attach.Reader, stdout, stderr) }()
	select {
	case <-ctx.Done():
		attach.Close()
		// The caller's deadline or cancellation, not a Docker failure.
		return ExecResult{Duration: time.Since(start)}, fmt.Errorf("running exec in %s: %w", ShortID(id), ctx.Err())
	case err := <-copyDone:
		if err != nil {
			return ExecResult{Duration: time.Since(start)}, classify(err, "reading exec output")
		}
	}
	code, err := c.execExitCode(ctx, execID)
	return ExecResult{ExitCode: code, Duration: time.Since(start)}, err
}

// startExec creates and attaches an exec, and starts feeding opts.Stdin (then
// closing the exec's stdin) in the background.
func (c *Client) startExec(ctx context.Context, id string, opts ExecOptions) (string, types.HijackedResponse, error) {
	if len(opts.Cmd) == 0 {
		return "", types.HijackedResponse{}, fmt.Errorf("%w: exec needs a command", ErrInvalidSpec)
	}
	cctx, cancel := c.bounded(ctx)
	created, err := c.docker.ContainerExecCreate(cctx, id, container.ExecOptions{
		Cmd:          opts.Cmd,
		WorkingDir:   opts.WorkingDir,
		Env:          opts.Env,
		AttachStdin:  opts.Stdin != nil || opts.openStdin,
		AttachStdout: true,
		AttachStderr: true,
	})
	cancel()
	if err != nil {
		if cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "is paused") {
			return "", types.HijackedResponse{}, fmt.Errorf("creating exec in %s: %w: %v", ShortID(id), ErrPaused, err)
		}
		return "", types.HijackedResponse{}, classify(err, "creating exec in "+ShortID(id))
	}
	attach, err := c.docker.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", types.HijackedResponse{}, classify(err, "attaching to exec in "+ShortID(id))
	}
	if opts.Stdin != nil {
		go func() {
			_, _ = io.Copy(attach.Conn, opts.Stdin)
			_ = attach.CloseWrite()
		}()
	}
	return created.ID, attach, nil
}

// copyExecOutput demultiplexes an exec's stream. stdcopy's buffer grows only
// to the largest frame, and the daemon's frames are at most 32 KiB.
func copyExecOutput(r io.Reader, stdout, stderr io.Writer) error {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	_, err := stdcopy.StdCopy(stdout, stderr, r)
	return err
}

// execExitCode reads an exec's exit code. The output stream can end a moment
// before the daemon records the exit, so a still-running exec is polled
// briefly.
func (c *Client) execExitCode(ctx context.Context, execID string) (int, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	for {
		inspect, err := c.docker.ContainerExecInspect(ctx, execID)
		if err != nil {
			return 0, classify(err, "inspecting exec")
		}
		if !inspect.Running {
			return inspect.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, classify(ctx.Err(), "waiting for the exit code of exec "+ShortID(execID))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// LogsOptions select container output.
type LogsOptions struct {
	// Tail is the number of lines from the end; 0 means all.
	Tail   int
	Follow bool
}

// Logs copies the container's stdout and stderr to the writers; with Follow
// it keeps streaming until ctx ends or the container stops.
func (c *Client) Logs(ctx context.Context, id string, opts LogsOptions, stdout, stderr io.Writer) error {
	tail := "all"
	if opts.Tail > 0 {
		tail = fmt.Sprint(opts.Tail)
	}
	c.negotiate(ctx)
	rc, err := c.docker.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: tail, Follow: opts.Follow})
	if err != nil {
		return classify(err, "reading logs of "+ShortID(id))
	}
	defer rc.Close()
	if _, err := stdcopy.StdCopy(stdout, stderr, rc); err != nil && ctx.Err() == nil {
		return classify(err, "reading logs of "+ShortID(id))
	}
	return nil
}
