package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/code-sandbox/code-sandbox-operator/internal/hostfs"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

const cpExample = `  # Copy a local directory's contents into /app/src in a Sandbox
  kubectl sandbox cp ./src analysis:/app/src

  # Copy one file (relative sandbox paths are relative to its working directory)
  kubectl sandbox cp data.csv analysis:data.csv

  # Copy a result file out of a Sandbox in another namespace (into ./)
  kubectl sandbox cp team-a/analysis:/app/out/report.txt .

  # Copy a directory out: the trailing / asks for a directory (lands as ./out)
  kubectl sandbox cp analysis:/app/out/ .

  # Replace a file downloaded before, keeping its exec bit
  kubectl sandbox cp analysis:/app/build/tool ./tool --overwrite --preserve-exec`

func newCpCommand(o *options) *cobra.Command {
	var dl hostfs.Options
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories to and from a Sandbox",
		Long: `Copy files and directories to and from a Sandbox. One side is local, the
other is [NAMESPACE/]NAME:PATH. Write a local path containing ':' as ./PATH.

Uploads: a local directory's contents land in DST (created if missing); a
file becomes DST, or goes inside DST when DST ends with '/'. In the Sandbox
only its working directory, /tmp and /var/tmp are writable and readable
this way. Only regular files and directories are sent; symlinks and special
files are skipped with a warning.

Downloads: what you ask for is what you get, whatever the Sandbox holds.
  NAME:PATH     asks for one regular file. It lands as DST, or as
                DST/<name> when DST is a directory or ends with '/'.
  NAME:PATH/    asks for a directory. It lands as a new DST/<name> when DST
                is an existing directory or ends with '/', else as DST.
  NAME:PATH/.   asks for a directory whose contents become DST, which must
                not exist.
If the Sandbox has something else at PATH (a directory where you asked for
a file, a symlink, more than one entry), the copy fails and nothing is
written. Nothing existing is replaced: a directory never merges into an
existing one, and an existing file is replaced only with --overwrite. Only
regular files and directories are created (a symlink, hard link or device
in the download fails it), never outside DST, and files are created
without group/world write and without exec bits unless --preserve-exec,
minus your umask. A failed download leaves nothing behind.`,
		Example: cpExample,
		Args:    exactArgs(2, "cp needs a source and a destination"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseCopySpec(args[0])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			dst, err := parseCopySpec(args[1])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			remote := dst.Sandbox
			switch {
			case src.Sandbox != nil && dst.Sandbox != nil:
				return &usageError{cmd: cmd.CommandPath(), err: errors.New("copying between two sandboxes is not supported; copy through a local directory")}
			case src.Sandbox == nil && dst.Sandbox == nil:
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("neither %q nor %q is a sandbox path; write one as NAME:PATH", args[0], args[1])}
			case src.Sandbox != nil:
				remote = src.Sandbox
			}
			if dst.Sandbox != nil && (dl.Overwrite || dl.KeepExec) {
				return &usageError{cmd: cmd.CommandPath(), err: errors.New("--overwrite and --preserve-exec apply to downloads (SRC in the sandbox) only")}
			}
			ns, err := o.namespace(remote.Namespace)
			if err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			defer c.Close()
			if dst.Sandbox != nil {
				return copyIn(cmd.Context(), o.streams, c, ns, remote.Name, src.Path, dst.Path)
			}
			return copyOut(cmd.Context(), c, ns, remote.Name, src.Path, dst.Path, dl)
		},
	}
	cmd.Flags().BoolVar(&dl.Overwrite, "overwrite", false, "Downloads: replace an existing local file (never a directory: trees are never merged)")
	cmd.Flags().BoolVar(&dl.KeepExec, "preserve-exec", false, "Downloads: keep the files' exec bits (by default no downloaded file is executable)")
	return cmd
}

// errUploadEnded stops the archiver once the upload is over, for whatever
// reason.
var errUploadEnded = errors.New("upload ended")

// copyIn uploads a local file or directory to remotePath.
func copyIn(ctx context.Context, s *streams, c *sandboxclient.Client, ns, name, local, remotePath string) error {
	// Stat, not Lstat: a symlink the user names on the command line is what
	// they mean to copy; symlinks found inside a tree are skipped.
	fi, err := os.Stat(local)
	if err != nil {
		return fmt.Errorf("cannot copy %s: %w", local, err)
	}
	switch {
	case fi.IsDir():
		root, err := os.OpenRoot(local)
		if err != nil {
			return fmt.Errorf("cannot copy %s: %w", local, err)
		}
		defer root.Close()
		pr, pw := io.Pipe()
		type archived struct {
			st  hostfs.TreeStats
			err error
		}
		done := make(chan archived, 1)
		go func() {
			st, err := hostfs.WriteTree(pw, root, ".", hostfs.TreeLimits{})
			pw.CloseWithError(err)
			done <- archived{st, err}
		}()
		_, upErr := c.Upload(ctx, sandboxclient.Named(ns, name), remotePath, pr)
		pr.CloseWithError(errUploadEnded)
		a := <-done
		for _, p := range a.st.Skipped {
			s.warn(fmt.Sprintf("skipping %s: only regular files and directories are copied; symlinks are never followed", filepath.Join(local, filepath.FromSlash(p))))
		}
		// A local failure (an unreadable file) explains a failed upload
		// better than the broken request it caused.
		if a.err != nil && !errors.Is(a.err, errUploadEnded) {
			return fmt.Errorf("cannot copy %s: %w", local, a.err)
		}
		return upErr
	case fi.Mode().IsRegular():
		if strings.HasSuffix(remotePath, "/") {
			remotePath = path.Join(remotePath, filepath.Base(local))
		}
		f, err := os.Open(local)
		if err != nil {
			return fmt.Errorf("cannot copy %s: %w", local, err)
		}
		defer f.Close()
		_, err = c.UploadFile(ctx, sandboxclient.Named(ns, name), remotePath, fi.Mode().Perm(), f)
		return err
	default:
		return fmt.Errorf("cannot copy %s: it is a %s, not a regular file or directory", local, fi.Mode().Type())
	}
}

// copyOut downloads remotePath to local with the strict rules of
// internal/hostfs: the source as written decides between a file and a
// directory (see ParseSource), and nothing lands unless the whole download
// arrived and matched.
func copyOut(ctx context.Context, c *sandboxclient.Client, ns, name, remotePath, local string, opts hostfs.Options) error {
	root, rel, destIsDir, err := openLocalDest(local)
	if err != nil {
		return err
	}
	defer root.Close()
	opts.DestIsDir = destIsDir
	_, err = hostfs.Download(root, rel, hostfs.ParseSource(remotePath), opts, func(w io.Writer) error {
		return c.Download(ctx, sandboxclient.Named(ns, name), remotePath, w)
	})
	var te *sandboxclient.TransferError
	if errors.As(err, &te) {
		return fmt.Errorf("%w; nothing was written to %s", err, local)
	}
	return err
}
