// Package dockerruntime is the one place that talks to the Docker Engine. It
// builds hardened container specs, creates, adopts, inspects and removes
// sandbox containers, streams Docker events, runs commands and reads logs.
// The operator's controller and the MCP server's Docker backend both use it,
// so their sandboxes are identical.
package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

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

// Options configure a Client.
type Options struct {
	// Host is the Docker endpoint, for example unix:///var/run/docker.sock.
	// Empty means the one the Docker CLI would use (FindEndpoint):
	// DOCKER_HOST, the current context, else the platform's default.
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
	endpoint    Endpoint
	managedBy   string
	negotiated  atomic.Bool
	negotiateMu sync.Mutex
	callTimeout time.Duration
	pullTimeout time.Duration
	egressReady func(context.Context) error
	imagePolicy *imagepolicy.Policy

	standby standbys
	thaws   thaws
	// gates keep a pause and exec starts apart (gate.go).
	gates execGates

	toolsMu sync.Mutex
	// toolsCreatedAt identifies the tools volume this client verified ("" if
	// none yet), so a volume removed and re-created since (empty) is noticed.
	toolsCreatedAt string
	// fillerID is the tools filler image's ID (a content address) once
	// imported or verified; guarded by toolsMu.
	fillerID string

	// machineIDs are written ahead for the next creates (machineid.go).
	machineIDs machineIDPool
}

// New connects lazily to Docker: it never fails because the daemon is down,
// so a manager can start first and report DockerUnavailable.
func New(opts Options) (*Client, error) {
	ep, err := FindEndpoint(opts.Host)
	if err != nil {
		return nil, fmt.Errorf("finding the Docker Engine: %w", err)
	}
	clientOpts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if ep.Source != "DOCKER_HOST" {
		clientOpts = append(clientOpts, client.WithHost(ep.Host))
	}
	if ep.CAFile != "" || ep.CertFile != "" {
		clientOpts = append(clientOpts, client.WithTLSClientConfig(ep.CAFile, ep.CertFile, ep.KeyFile))
	}
	docker, err := client.NewClientWithOpts(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating Docker client for %s: %w", ep, err)
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
	return &Client{docker: docker, endpoint: ep, managedBy: opts.ManagedBy, callTimeout: opts.CallTimeout, pullTimeout: opts.PullTimeout, imagePolicy: opts.ImagePolicy, egressReady: opts.EgressReady}, nil
}

// Docker exposes the underlying client for tests and benchmarks that need raw
// Docker as a baseline.
func (c *Client) Docker() *client.Client { return c.docker }

// Close releases the client's connections.
func (c *Client) Close() error {
	c.closeStandbys()
	c.closeMachineIDs()
	return c.docker.Close()
}

// Host is the Docker endpoint in use.
func (c *Client) Host() string { return c.docker.DaemonHost() }

// Endpoint is the Docker endpoint in use and where it came from.
func (c *Client) Endpoint() Endpoint { return c.endpoint }

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
	return classify(err, "pinging the Docker Engine at "+c.endpoint.String())
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
