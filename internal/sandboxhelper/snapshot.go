package sandboxhelper

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// snapshotFlags are the flags of snapshot.
type snapshotFlags struct {
	roots    []string
	maxBytes int64
}

func parseSnapshot(args []string) (snapshotFlags, error) {
	f := snapshotFlags{maxBytes: -1}
	for _, arg := range args {
		key, value, ok := strings.Cut(arg, "=")
		if !ok {
			return f, fmt.Errorf("snapshot: flag %q needs a value", arg)
		}
		switch key {
		case "--root":
			if !path.IsAbs(value) || path.Clean(value) != value || value == "/" {
				return f, fmt.Errorf("snapshot: --root=%q is not a clean absolute directory", value)
			}
			for _, r := range f.roots {
				if r == value || strings.HasPrefix(value, r+"/") || strings.HasPrefix(r, value+"/") {
					return f, fmt.Errorf("snapshot: --root=%q overlaps --root=%q", value, r)
				}
			}
			f.roots = append(f.roots, value)
		case "--max-bytes":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return f, fmt.Errorf("snapshot: %s is not a number: %w", arg, err)
			}
			f.maxBytes = n
		default:
			return f, fmt.Errorf("snapshot: unknown flag %q", arg)
		}
	}
	if len(f.roots) == 0 {
		return f, errors.New("snapshot needs at least one --root")
	}
	return f, nil
}

// snapshot writes one tar of every root, with the sandbox's other
// processes stopped while it reads (quiesce), so no file in it is caught
// between two writes of one system call. Each root's entries are named
// below the root's path without its leading "/" ("app/…", "var/tmp/…").
// The roots share one --max-bytes budget. The walker is writeTar's.
// snapshotChunk is the size of the snapshot's writes to stdout.
const snapshotChunk = 1 << 20

func snapshot(f snapshotFlags, w io.Writer) (err error) {
	maxBytes := f.maxBytes
	if maxBytes <= 0 {
		maxBytes = execio.DefaultDownloadLimit
	}
	// A reader that goes away must end the walk with EPIPE, not kill the
	// helper with SIGPIPE before it thaws the sandbox.
	signal.Ignore(syscall.SIGPIPE)
	thaw, err := quiesce()
	if err != nil {
		return err
	}
	defer thaw()
	// Large writes: each one wakes the shim and dockerd on their way to the
	// manager, and the sandbox is stopped until the last one.
	bw := bufio.NewWriterSize(w, snapshotChunk)
	t := &tarWalker{tw: tar.NewWriter(bw), maxBytes: maxBytes}
	for _, r := range f.roots {
		root, err := os.OpenRoot(r)
		if err != nil {
			return fmt.Errorf("opening %s: %w", r, err)
		}
		t.root = root
		info, err := root.Lstat(".")
		if err == nil {
			err = t.add(".", strings.TrimPrefix(r, "/"), info)
		}
		root.Close()
		if err != nil {
			return err
		}
	}
	if err := t.tw.Close(); err != nil {
		return fmt.Errorf("finishing the archive: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	return nil
}
