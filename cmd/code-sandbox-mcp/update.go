/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/mcpmain"
	"github.com/code-sandbox/code-sandbox-operator/internal/release"
	"github.com/code-sandbox/code-sandbox-operator/internal/selfupdate"
	"github.com/code-sandbox/code-sandbox-operator/internal/version"
)

const binaryName = "code-sandbox-mcp"

// updateFlags are the flags of the update check, shared by the server
// (--check-updates), `version` and `update`.
type updateFlags struct {
	check          bool
	indexURL       string
	allowContainer bool
}

// register defines the flags on fs; indexFlag names the index URL's flag
// (--update-index-url beside the server's flags, --index-url for update).
func (u *updateFlags) register(fs *flag.FlagSet, indexFlag string) {
	if indexFlag != "index-url" {
		fs.BoolVar(&u.check, "check-updates", false, "check once a day (at most) whether a newer signed release exists, and say so on stderr (and in `version`); off in containers and in Kubernetes. Run `code-sandbox-mcp update` to install it")
	}
	fs.StringVar(&u.indexURL, indexFlag, selfupdate.DefaultIndexURL, "release index for update checks and `update` (the GitHub releases API's shape; https, or http to loopback)")
	fs.BoolVar(&u.allowContainer, "allow-update-in-container", false, "allow update checks and `update` in a container that is not one of this project's images nor a Kubernetes pod (a dev container, say)")
}

func (u updateFlags) refusal() error {
	return selfupdate.Refusal(os.Getenv, selfupdate.FileExists, u.allowContainer)
}

// options are selfupdate's Options for this binary.
func (u updateFlags) options() (selfupdate.Options, error) {
	key, err := release.TrustedKey()
	if err != nil {
		return selfupdate.Options{}, err
	}
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return selfupdate.Options{}, fmt.Errorf("cannot find this binary: %w", err)
	}
	return selfupdate.Options{
		IndexURL:       u.indexURL,
		CurrentVersion: version.Version,
		Key:            key,
		Binary:         binaryName,
		GOOS:           runtime.GOOS,
		GOARCH:         runtime.GOARCH,
		Executable:     exe,
	}, nil
}

// updateNotice is the daily check's notice ("" for none); errors go to
// stderr.
func updateNotice(u updateFlags, stderr io.Writer) string {
	o, err := u.options()
	if err != nil {
		fmt.Fprintln(stderr, "update check:", err)
		return ""
	}
	state, err := selfupdate.StatePath(binaryName)
	if err != nil {
		fmt.Fprintln(stderr, "update check:", err)
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	notice, err := selfupdate.Notice(ctx, o, state, time.Now())
	if err != nil {
		fmt.Fprintln(stderr, "update check:", err)
	}
	return notice
}

// printVersion prints the version and the release key this binary trusts,
// and with --check-updates whether a newer release exists.
func printVersion(u updateFlags, stdout, stderr io.Writer) int {
	fmt.Fprintln(stdout, binaryName, version.Version)
	if key, err := release.TrustedKey(); err == nil {
		fmt.Fprintln(stdout, "release key:", release.KeyID(key))
	}
	if u.check {
		if err := u.refusal(); err != nil {
			fmt.Fprintln(stderr, "--check-updates:", err)
			return mcpmain.ExitUsage
		}
		if notice := updateNotice(u, stderr); notice != "" {
			fmt.Fprintln(stdout, notice)
		}
	}
	return 0
}

// runVersion is `code-sandbox-mcp version [--check-updates]`.
func runVersion(args []string, stdout, stderr io.Writer) int {
	var u updateFlags
	fs := flag.NewFlagSet(binaryName+" version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	u.register(fs, "update-index-url")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return mcpmain.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "version: unexpected arguments %q\n", fs.Args())
		return mcpmain.ExitUsage
	}
	return printVersion(u, stdout, stderr)
}

// runUpdate is `code-sandbox-mcp update`. It writes nothing to stdout: a
// client may have this binary's stdout as its protocol stream.
func runUpdate(args []string, stderr io.Writer) int {
	var u updateFlags
	var check, rollback, allowDowngrade bool
	fs := flag.NewFlagSet(binaryName+" update", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&check, "check", false, "only say whether a newer signed release exists")
	fs.BoolVar(&rollback, "rollback", false, "put back the binary the last update replaced (it is kept beside this one, with .old appended)")
	fs.BoolVar(&allowDowngrade, "allow-downgrade", false, "install the newest release even when it is older than this binary (or this binary is no release)")
	u.register(fs, "index-url")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s update [--check] [--rollback] [--allow-downgrade] [--index-url URL]\n\n"+
			"Replaces this binary with the newest release whose checksums.txt is signed with the pinned key (docs/mcp.md#updates).\n\n", binaryName)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return mcpmain.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "update: unexpected arguments %q\n", fs.Args())
		return mcpmain.ExitUsage
	}
	if check && rollback {
		fmt.Fprintln(stderr, "update: --check and --rollback do not go together")
		return mcpmain.ExitUsage
	}
	if err := u.refusal(); err != nil {
		fmt.Fprintln(stderr, "update:", err)
		return mcpmain.ExitUsage
	}
	o, err := u.options()
	if err != nil {
		fmt.Fprintln(stderr, "update:", err)
		return 1
	}
	o.AllowDowngrade = allowDowngrade
	if rollback {
		if err := selfupdate.Rollback(o.Executable); err != nil {
			fmt.Fprintln(stderr, "update --rollback:", err)
			return 1
		}
		fmt.Fprintf(stderr, "rolled %s back; the binary it replaced is now %s\n", o.Executable, selfupdate.OldPath(o.Executable))
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if check {
		st, _, err := selfupdate.Check(ctx, o)
		if err != nil {
			fmt.Fprintln(stderr, "update --check:", err)
			return 1
		}
		if st.Newer {
			fmt.Fprintf(stderr, "%s %s is available (this is %s): run `%s update`\n", binaryName, st.Latest, st.Current, binaryName)
		} else {
			fmt.Fprintf(stderr, "%s %s: the newest signed release is %s\n", binaryName, st.Current, st.Latest)
		}
		return 0
	}
	if _, _, err := selfupdate.Update(ctx, o, stderr); err != nil {
		fmt.Fprintln(stderr, "update:", err)
		return 1
	}
	return 0
}
