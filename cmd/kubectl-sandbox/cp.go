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

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

const cpExample = `  # Copy a local directory's contents into /app/src in a Sandbox
  kubectl sandbox cp ./src analysis:/app/src

  # Copy one file (relative sandbox paths are relative to its working directory)
  kubectl sandbox cp data.csv analysis:data.csv

  # Copy a result file or tree out of a Sandbox in another namespace
  kubectl sandbox cp team-a/analysis:/app/out ./out`

func newCpCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories to and from a Sandbox",
		Long: `Copy files and directories to and from a Sandbox. One side is local, the
other is [NAMESPACE/]NAME:PATH. Write a local path containing ':' as ./PATH.

Like kubectl cp: a directory's contents land in DST (created if missing); a
file becomes DST, or goes inside DST when DST is an existing local directory
or ends with '/'. In the Sandbox only its working directory, /tmp and
/var/tmp are writable and readable this way.

Only regular files and directories are copied, both ways; symlinks and
special files are skipped with a warning. Downloads never write outside DST
and never through an existing symlink.`,
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
			return copyOut(cmd.Context(), o.streams, c, ns, remote.Name, src.Path, dst.Path)
		},
	}
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
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := writeTree(pw, local, s.warn)
			pw.CloseWithError(err)
			done <- err
		}()
		_, upErr := c.Upload(ctx, ns, name, remotePath, pr)
		pr.CloseWithError(errUploadEnded)
		// A local failure (an unreadable file) explains a failed upload
		// better than the broken request it caused.
		if tarErr := <-done; tarErr != nil && !errors.Is(tarErr, errUploadEnded) {
			return tarErr
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
		_, err = c.UploadFile(ctx, ns, name, remotePath, fi.Mode().Perm(), f)
		return err
	default:
		return fmt.Errorf("cannot copy %s: it is a %s, not a regular file or directory", local, fi.Mode().Type())
	}
}

// copyOut downloads remotePath and extracts it safely at local.
func copyOut(ctx context.Context, s *streams, c *sandboxclient.Client, ns, name, remotePath, local string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := c.Download(ctx, ns, name, remotePath, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	_, exErr := extractTree(pr, local, s.warn)
	if exErr != nil {
		pr.CloseWithError(exErr)
	} else {
		// The archive's end marker may come before the end of the
		// response; the trailer that reports a late failure only arrives
		// after it.
		_, _ = io.Copy(io.Discard, pr)
	}
	dlErr := <-done
	var te *sandboxclient.TransferError
	switch {
	case exErr != nil && (dlErr == nil || errors.Is(dlErr, exErr)):
		return exErr
	case errors.As(dlErr, &te):
		return fmt.Errorf("%w; what was written to %s is incomplete", dlErr, local)
	case dlErr != nil:
		return dlErr
	}
	return nil
}
