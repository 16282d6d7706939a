package dockerruntime

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// A snapshot is one tar of a sandbox's writable paths (SnapshotRoots), taken
// by the in-sandbox helper's `snapshot` (its one tar walker, with its limits
// and path rules) while the sandbox's processes are stopped, so that it
// never holds a file caught between two writes of one system call. Entries
// are named below each root's path without its leading "/". Processes and
// memory are not part of it.

// SnapshotRoots are the writable paths of a sandbox whose working directory
// is workingDir: what a snapshot holds and a restore writes.
func SnapshotRoots(workingDir string) []string {
	if workingDir == "" {
		workingDir = DefaultWorkingDir
	}
	return []string{workingDir, "/tmp", "/var/tmp"}
}

// snapshotThawGrace bounds the backstop thaw run after a failed snapshot.
const snapshotThawGrace = 10 * time.Second

// Snapshot writes a snapshot of the roots of sandbox id to w, stopping with
// execio.ErrTooLarge once maxBytes of file content have been written (zero
// means execio.DefaultDownloadLimit). The stream is recounted and bounded on
// this side (execio.ForwardTar): the helper's stdout is writable from inside
// the sandbox.
func (c *Client) Snapshot(ctx context.Context, id string, roots []string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	if len(roots) == 0 {
		return execio.TransferStats{}, fmt.Errorf("%w: a snapshot needs at least one path", execio.ErrInvalidRequest)
	}
	for _, r := range roots {
		if err := execio.CheckTarget(execio.Target{Root: r}); err != nil {
			return execio.TransferStats{}, err
		}
	}
	if maxBytes < 0 {
		return execio.TransferStats{}, fmt.Errorf("%w: maxBytes %d is negative", execio.ErrInvalidRequest, maxBytes)
	}
	if maxBytes == 0 {
		maxBytes = execio.DefaultDownloadLimit
	}
	if err := c.awaitThaw(ctx, id); err != nil {
		return execio.TransferStats{}, err
	}
	argv := []string{HelperPath, "snapshot", fmt.Sprintf("--max-bytes=%d", maxBytes)}
	for _, r := range roots {
		argv = append(argv, "--root="+r)
	}
	// An exec of its own, not the resident helper: the snapshot stops every
	// process of the sandbox's user, the resident helper included.
	stats, err := forwardTarOut(ctx, w, maxBytes, "taking a snapshot of sandbox "+ShortID(id), func(out, stderr io.Writer) (ExecResult, error) {
		return c.Exec(ctx, id, ExecOptions{Cmd: argv}, out, stderr)
	})
	if err != nil {
		// The helper thaws on every path it survives; this covers one that
		// was killed or cut off while the sandbox was stopped.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotThawGrace)
		defer cancel()
		_, _ = c.Exec(tctx, id, ExecOptions{Cmd: []string{HelperPath, "thaw"}}, io.Discard, io.Discard)
		return stats, err
	}
	return stats, nil
}

// Restore writes a snapshot into sandbox id: each root's entries into that
// root, through CopyIn (the sanitiser and the helper's untar, with limits).
// open is called once per root and must return the snapshot from its start.
// Entries outside roots are refused. Symbolic links are restored as links
// (limits.Symlinks is set here): a link's target is data and may name
// anything, but the helper creates links only after every file and
// directory, and never below a link, so nothing is written through one.
func (c *Client) Restore(ctx context.Context, id string, roots []string, open func() (io.ReadCloser, error), limits execio.UploadLimits) (stats execio.TransferStats, err error) {
	for _, r := range roots {
		if err := execio.CheckTarget(execio.Target{Root: r}); err != nil {
			return stats, err
		}
	}
	used, err := checkSnapshotNames(roots, open)
	if err != nil {
		return stats, err
	}
	limits.Symlinks = true
	for _, r := range roots {
		if !used[r] {
			// Nothing below it (an empty /tmp): one helper round trip
			// less per child of a fork.
			continue
		}
		src, err := open()
		if err != nil {
			return stats, fmt.Errorf("opening the snapshot: %w", err)
		}
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(filterRoot(src, pw, strings.TrimPrefix(r, "/")))
		}()
		st, err := c.CopyIn(ctx, id, execio.Target{Root: r}, pr, limits)
		pr.CloseWithError(errors.New("restore ended"))
		src.Close()
		stats.Files += st.Files
		stats.Dirs += st.Dirs
		stats.Bytes += st.Bytes
		stats.Links += st.Links
		if err != nil {
			return stats, fmt.Errorf("restoring %s into sandbox %s: %w", r, ShortID(id), err)
		}
	}
	return stats, nil
}

// checkSnapshotNames refuses a snapshot with an entry outside roots before
// anything is written, and returns the roots with entries below them.
func checkSnapshotNames(roots []string, open func() (io.ReadCloser, error)) (map[string]bool, error) {
	src, err := open()
	if err != nil {
		return nil, fmt.Errorf("opening the snapshot: %w", err)
	}
	defer src.Close()
	used := map[string]bool{}
	tr := tar.NewReader(src)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return used, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading the snapshot: %v", execio.ErrInvalidRequest, err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		ok := false
		for _, r := range roots {
			p := strings.TrimPrefix(r, "/")
			if name == p || strings.HasPrefix(name, p+"/") {
				ok = true
				used[r] = used[r] || name != p
				break
			}
		}
		if !ok {
			return nil, fmt.Errorf("%w: snapshot entry %q is outside the writable paths %v", execio.ErrInvalidPath, h.Name, roots)
		}
	}
}

// filterRoot copies the entries of src below prefix to w, renamed relative
// to it; the prefix's own directory entry is left out. What may pass is
// decided after it, by CopyIn's sanitiser and the helper.
func filterRoot(src io.Reader, w io.Writer, prefix string) error {
	tr := tar.NewReader(src)
	tw := tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return fmt.Errorf("%w: reading the snapshot: %v", execio.ErrInvalidRequest, err)
		}
		rest, ok := strings.CutPrefix(h.Name, prefix+"/")
		if !ok || rest == "" {
			continue
		}
		h.Name = rest
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}
