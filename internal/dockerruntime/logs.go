package dockerruntime

import (
	"context"
	"fmt"
	"io"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

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
