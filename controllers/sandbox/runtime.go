/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"io"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// Runtime is what the Sandbox reconciler, its Docker event watcher and its
// orphan collector need from the node's Docker Engine: no more, so that the
// reconcile logic can be tested against a fake (the unit tier) as well as
// against a real Docker Engine (the integration tier). Errors carry
// dockerruntime's sentinels (ErrNotFound, ErrUnavailable, …), which the
// reconciler maps to conditions. *dockerruntime.Client implements it.
type Runtime interface {
	// Ping checks that the Docker Engine answers.
	Ping(ctx context.Context) error
	// Find returns the one container of the Sandbox with this UID, or
	// ErrNotFound, or ErrMultipleContainers.
	Find(ctx context.Context, uid string) (dockerruntime.Container, error)
	// CreateAndStart creates the container for spec (adopting one that a
	// retried create collides with) and starts it.
	CreateAndStart(ctx context.Context, spec dockerruntime.Spec) (dockerruntime.Container, error)
	// AwaitHelper waits, within ctx, for the resident helper start that
	// CreateAndStart began in the background (dockerruntime/prestart.go),
	// so that a Sandbox reported Ready answers its first command as fast
	// as a repeated one. It returns at once when no start is under way;
	// a start that failed leaves the first command to start a helper.
	AwaitHelper(ctx context.Context, id string)
	// ListProcesses lists the background processes of running container
	// id (execio.ProcessStatus), for the idle clock (idle.go).
	ListProcesses(ctx context.Context, id string) ([]execio.ProcessStatus, error)
	// Start starts a created container.
	Start(ctx context.Context, id string) error
	// Pause freezes a running container; Unpause thaws it. Both are
	// idempotent.
	Pause(ctx context.Context, id string) error
	Unpause(ctx context.Context, id string) error
	// BeginUnpause starts thawing a container and returns at once; the
	// node API's operations on it wait for the thaw, and so does wait.
	BeginUnpause(id string) (wait func(context.Context) error)
	// CheckHealth runs a warm pool member's health check in a running
	// container; it leaves no process behind. ErrUnavailable and
	// ErrNotFound when Docker cannot run it, another error when the check
	// ran and failed.
	CheckHealth(ctx context.Context, id string) error
	// Remove stops (SIGTERM, grace, SIGKILL) and removes a container.
	Remove(ctx context.Context, id string, grace time.Duration) error
	// ListManaged lists this operator's containers that match the filter.
	ListManaged(ctx context.Context, f dockerruntime.ListFilter) ([]dockerruntime.Container, error)
	// Snapshot writes a tar of the roots of running container id to w
	// while the sandbox's processes are stopped (dockerruntime.Client's),
	// at most maxBytes of file content; Restore writes one into a
	// container through the sanitising upload path.
	Snapshot(ctx context.Context, id string, roots []string, w io.Writer, maxBytes int64) (execio.TransferStats, error)
	Restore(ctx context.Context, id string, roots []string, open func() (io.ReadCloser, error), limits execio.UploadLimits) (execio.TransferStats, error)
	// InstallEgressCA writes the node egress proxy's CA (and a bundle of
	// the image's roots with it) into a running container through the
	// helper, at dockerruntime.EgressCABundle; the image is unchanged.
	InstallEgressCA(ctx context.Context, id string, caPEM []byte) error
	// WatchEvents streams the container events of node until ctx ends or
	// the stream breaks.
	WatchEvents(ctx context.Context, node string, handle func(dockerruntime.Event)) error
}

var _ Runtime = (*dockerruntime.Client)(nil)
