// Package contract is what the MCP server and its backends agree on: the
// Caller a request acts for, the Backend interface, its request and result
// types and the error kinds a backend wraps. It imports no protocol library,
// so that the session core (internal/mcpserver/session) and the drivers
// (dockerbackend, kubebackend) stay protocol-free; a test in this package
// checks that none of them links mcp-go, even indirectly.
package contract

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
)

// Caller is the authenticated identity a request acts for. Every Backend
// call takes one, and a Backend shows a caller only the sandboxes that
// caller created: anything else is ErrNotFound, never "forbidden", so that
// sandbox IDs do not leak across identities.
type Caller struct {
	// ID is the stable identity: "local" over stdio, the token's identity
	// over HTTP (for Kubernetes, "kube:<username>").
	ID string
	// Username, UID, Groups and Extra are the Kubernetes user info when
	// the authenticator is a TokenReview; Username is empty otherwise. A
	// Kubernetes backend asks SubjectAccessReviews for exactly this user,
	// so RBAC decides what the caller may do.
	Username string
	UID      string
	Groups   []string
	Extra    map[string][]string
	// Namespace, when set, is the namespace the authenticator mapped the
	// caller to (--auth oidc's claim mapping, which only the server's
	// configuration decides); a Kubernetes backend keeps the caller's
	// Sandboxes there. Empty: the backend's own choice.
	Namespace string
	// Session is the MCP session the request arrived on, for logs; empty
	// when the transport has none.
	Session string
}

// DefaultImage is the image of a sandbox whose request names none, unless
// the server is configured with another: the tools' default and the Docker
// backend's warm pool agree on it.
const DefaultImage = "python:3.12-slim-bookworm"

// Network modes a caller may ask for.
const (
	NetworkNone   = "none"
	NetworkEgress = "egress"
)

// CreateRequest describes a new sandbox. Zero values mean the backend's
// defaults.
type CreateRequest struct {
	Image string
	// NanoCPUs is CPU in billionths of a core.
	NanoCPUs    int64
	MemoryBytes int64
	// Network is NetworkNone or NetworkEgress.
	Network string
	// Lifetime bounds how long the sandbox may exist.
	Lifetime time.Duration
	// EgressAllow, with Network NetworkEgress, are the only host names the
	// sandbox may reach (ValidateEgressHost; at most MaxEgressAllow);
	// empty keeps unrestricted egress. Backends that cannot enforce it
	// refuse the request (ErrInvalid) rather than ignore it.
	EgressAllow []string
}

// Sandbox is what a caller may know about one of its sandboxes.
type Sandbox struct {
	// ID is the handle tools call container_id.
	ID          string    `json:"container_id"`
	Image       string    `json:"image"`
	Status      string    `json:"status"`
	Network     string    `json:"network"`
	WorkingDir  string    `json:"working_dir"`
	NanoCPUs    int64     `json:"nano_cpus"`
	MemoryBytes int64     `json:"memory_bytes"`
	CreatedAt   time.Time `json:"created_at"`
	LastUsedAt  time.Time `json:"last_used_at"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// OutputFunc receives a command's output while it runs. stream is
// "stdout" or "stderr". It is called from the backend's copy goroutines,
// possibly concurrently for the two streams, and must not keep p.
type OutputFunc func(stream string, p []byte)

// Writer adapts f to the io.Writer that runtimes and clients stream one
// stream's output to. A nil f discards.
func (f OutputFunc) Writer(stream string) io.Writer { return outputWriter{stream, f} }

type outputWriter struct {
	stream string
	out    OutputFunc
}

func (w outputWriter) Write(p []byte) (int, error) {
	if w.out != nil {
		w.out(w.stream, p)
	}
	return len(p), nil
}

// LogsOptions bound a Logs call.
type LogsOptions struct {
	// TailLines is how many lines of container output to return; 0 means
	// all (still capped by MaxBytes).
	TailLines int
	// MaxBytes caps the container output returned; the start is dropped.
	MaxBytes int64
	// HistoryRecords is how many exec records to return; 0 means all kept.
	HistoryRecords int
}

// Logs is a sandbox's own output and the commands run in it.
type Logs struct {
	Output    string
	Truncated bool
	History   []history.Record
}

// Backend runs sandboxes. Implementations must be safe for concurrent use,
// enforce ownership (a sandbox is visible only to the Caller.ID that
// created it) and their own quotas, and map failures onto the errors below
// (wrapped, with a message a user can act on). The server's backends are a
// session.Manager (registry, ownership, limits, reaping) on a Docker or
// Kubernetes driver.
type Backend interface {
	// Create starts a sandbox and returns once commands can run in it.
	Create(ctx context.Context, caller Caller, req CreateRequest) (Sandbox, error)
	// Get returns one of the caller's sandboxes.
	Get(ctx context.Context, caller Caller, id string) (Sandbox, error)
	// List returns the caller's sandboxes.
	List(ctx context.Context, caller Caller) ([]Sandbox, error)
	// Exec runs one command and streams its output to out while it runs.
	// req is validated and defaulted by the backend (execio.Request
	// Normalize). A timeout is reported in the Result with the process
	// tree killed; a cancelled ctx is an error.
	Exec(ctx context.Context, caller Caller, id string, req execio.Request, out OutputFunc) (execio.Result, error)
	// Upload extracts an uncompressed tar stream into directory destDir
	// (absolute, or relative to the sandbox's working directory).
	Upload(ctx context.Context, caller Caller, id, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error)
	// Download writes a tar of the file or tree at src to w, its entries
	// named below src's base name, failing with execio.ErrTooLarge past
	// maxBytes of content.
	Download(ctx context.Context, caller Caller, id, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error)
	// Logs returns the sandbox's output and exec history.
	Logs(ctx context.Context, caller Caller, id string, opts LogsOptions) (Logs, error)
	// Stop stops the sandbox (SIGTERM, a grace period, SIGKILL) and removes
	// it with its volumes.
	Stop(ctx context.Context, caller Caller, id string) error
	// Ready reports whether the backend can serve (for /readyz).
	Ready(ctx context.Context) error
	// Close removes every sandbox this server instance created and releases
	// the backend's resources.
	Close(ctx context.Context) error
}

// Errors a Backend wraps so that tools can explain what to do. Anything
// else is reported as an internal failure with its text.
var (
	// ErrNotFound: no such sandbox for this caller (never existed, belongs
	// to someone else, or already removed).
	ErrNotFound = errors.New("sandbox not found")
	// ErrQuota: the caller has too many sandboxes, or a quota on where
	// they run (a SandboxQuota or ResourceQuota) has no room for this one.
	// A quota's rules (images, runtimes, network, lifetime) are ErrInvalid.
	ErrQuota = errors.New("sandbox quota exceeded")
	// ErrInvalid: the request is malformed or not allowed by the server's
	// policy (image not allowed, egress disabled…).
	ErrInvalid = errors.New("invalid request")
	// ErrImageNotFound: the image is absent and may not or could not be
	// pulled.
	ErrImageNotFound = errors.New("image not available")
	// ErrUnavailable: the backend's infrastructure (Docker Engine, API
	// server) does not answer; retrying later may work.
	ErrUnavailable = errors.New("sandbox backend unavailable")
	// ErrNotRunning: the sandbox exists but is not running (it exited,
	// was OOM-killed, or is being removed).
	ErrNotRunning = errors.New("sandbox not running")
)
