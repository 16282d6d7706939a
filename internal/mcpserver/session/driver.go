// Package session is the MCP server's backend-neutral sandbox bookkeeping.
// A Manager implements contract.Backend on top of a Driver: it keeps the
// registry of the sandboxes this server instance created and who owns them
// (only the creating identity finds a sandbox), holds each identity to
// MaxSandboxes (counting creates in flight), marks sandboxes busy while an
// operation runs in them, removes idle and expired ones by its clock, and
// removes everything at Close. With Options.Stateless (the Kubernetes
// driver, whose sandboxes any replica serves) it keeps none of that in the
// process and leaves it to the driver. A Driver (the Docker or the Kubernetes
// backend) only runs sandboxes: create, exec, transfer, logs, remove, list.
package session

import (
	"context"
	"errors"
	"io"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Op is what a caller is about to do, for drivers that authorize each
// operation (Authorizer).
type Op string

// The operations of contract.Backend.
const (
	OpCreate   Op = "create"
	OpGet      Op = "get"
	OpList     Op = "list"
	OpExec     Op = "exec"
	OpUpload   Op = "upload"
	OpDownload Op = "download"
	OpLogs     Op = "logs"
	OpStop     Op = "stop"
)

// Handle names one sandbox for a Driver call.
type Handle struct {
	// ID is the sandbox's ID as callers see it (container_id).
	ID string
	// Caller is who acts: the owner, when the Manager holds the sandbox.
	Caller contract.Caller
	// Ref is what the driver's Create returned for the sandbox, or "" for
	// a sandbox the Manager does not hold (a SharedDriver's, made by
	// another server instance).
	Ref string
	// Sandbox is what Create returned, as the Manager recorded it (zero
	// when the Manager does not hold the sandbox). LastUsedAt is the
	// Manager's and overrides what a driver reports.
	Sandbox contract.Sandbox
}

// Removal says why a driver removes a sandbox.
type Removal int

const (
	// RemoveStop is sandbox_stop: a graceful stop (SIGTERM, grace period,
	// SIGKILL) that the caller waits for. On failure the sandbox stays
	// usable and the error is the caller's.
	RemoveStop Removal = iota
	// RemoveReap is the reaper's (idle, lifetime over): forced and best
	// effort. The Manager forgets the sandbox whatever Remove returns and
	// only logs a failure; Close's RemoveAll catches what is left.
	RemoveReap
)

// Driver runs sandboxes and keeps no bookkeeping of its own: the Manager
// decides who may use which sandbox, how many there may be, and when they
// go. Methods taking a Handle are called only for a sandbox the caller
// owns, or, for a SharedDriver, one the Manager does not hold (Ref ""),
// which the driver must then check itself. Failures are mapped onto
// mcpserver's Err* kinds; wrap an error with Gone when the sandbox turned
// out not to exist any more, so that the Manager forgets it.
type Driver interface {
	// Create makes and starts a sandbox and returns once commands can run
	// in it, with the driver's reference to it. On failure, or when ctx
	// ends, it leaves nothing behind. A zero CreatedAt or ExpiresAt in the
	// returned Sandbox is the Manager's to fill (its clock, the lifetime).
	Create(ctx context.Context, caller contract.Caller, req contract.CreateRequest) (ref string, sb contract.Sandbox, err error)
	// Get returns the sandbox's current state.
	Get(ctx context.Context, h Handle) (contract.Sandbox, error)
	// List returns the caller's sandboxes; mine are those the Manager
	// holds for it. A SharedDriver lists the caller's sandboxes wherever
	// they come from, and the Manager forgets its own that are missing.
	List(ctx context.Context, caller contract.Caller, mine []Handle) ([]contract.Sandbox, error)
	// Exec runs one normalized command (contract.Backend.Exec).
	Exec(ctx context.Context, h Handle, req execio.Request, out contract.OutputFunc) (execio.Result, error)
	// Upload extracts archive into destDir (contract.Backend.Upload).
	Upload(ctx context.Context, h Handle, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error)
	// Download writes a tar of src to w (contract.Backend.Download).
	Download(ctx context.Context, h Handle, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error)
	// Logs returns output and exec history (contract.Backend.Logs).
	Logs(ctx context.Context, h Handle, opts contract.LogsOptions) (contract.Logs, error)
	// Remove removes one sandbox (see Removal).
	Remove(ctx context.Context, h Handle, how Removal) error
	// RemoveAll removes every sandbox of this server instance, including
	// any the Manager does not hold (a create that finished while the
	// server was closing, a reap whose removal failed).
	RemoveAll(ctx context.Context) error
	// Sweep runs after every reaper pass, for what only the driver can
	// find: the leftovers of dead server runs, expired sandboxes of other
	// instances.
	Sweep(ctx context.Context)
	// Ready reports whether the driver can serve (for /readyz).
	Ready(ctx context.Context) error
	// Close releases the driver's resources, after RemoveAll.
	Close(ctx context.Context) error
}

// Authorizer is a Driver that checks every operation for the caller before
// the Manager looks anything up (the Kubernetes backend's access reviews).
// id is "" for OpCreate and OpList.
type Authorizer interface {
	Authorize(ctx context.Context, caller contract.Caller, op Op, id string) error
}

// SharedDriver is a Driver whose sandboxes outlive this server instance
// and are shared with its other instances (Kubernetes: Sandbox objects
// labelled with their owner). A caller finds its sandboxes made by other
// instances too (the Manager hands them to the driver with Ref ""), and they
// count against MaxSandboxes.
type SharedDriver interface {
	Driver
	// CountOthers counts the caller's live sandboxes that other server
	// instances made.
	CountOthers(ctx context.Context, caller contract.Caller) (int, error)
}

// Pauser is a Driver that can freeze a sandbox and thaw it again with its
// processes and files intact (Docker's cgroup freezer; a Sandbox's
// spec.paused). The Manager pauses sandboxes idle for Options.IdlePause
// and resumes one before the next operation that needs it to run.
type Pauser interface {
	// Pause freezes the sandbox; pausing a paused one is not an error.
	Pause(ctx context.Context, h Handle) error
	// Resume thaws it and returns once commands can run in it again.
	Resume(ctx context.Context, h Handle) error
}

// Starter is a Driver with work to do before serving (an orphan sweep, a
// firewall); Manager.Start calls it before it starts the reaper.
type Starter interface {
	Start(ctx context.Context)
}

// ErrGone marks an error that says the sandbox no longer exists (its
// container or object was removed outside this server).
var ErrGone = errors.New("sandbox gone")

type goneError struct{ error }

func (e goneError) Unwrap() error        { return e.error }
func (e goneError) Is(target error) bool { return target == ErrGone }

// Gone marks err (unchanged in text and kinds) as meaning that the sandbox
// no longer exists, so that the Manager forgets it.
func Gone(err error) error {
	if err == nil {
		return nil
	}
	return goneError{err}
}

// ProcessDriver is a Driver that runs background processes
// (contract.ProcessBackend); the Manager checks the caller and the sandbox
// first, as for Exec.
type ProcessDriver interface {
	Processes(ctx context.Context, h Handle, call contract.ProcessCall) (execio.ProcessResponse, error)
}
