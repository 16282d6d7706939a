/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package framework holds what test/e2e (the operator's processes on this
// machine, a local control plane and Docker) and test/cluster (the operator
// deployed on a real cluster) share: running the command-line tools they
// drive the system with, waiting for Sandboxes, the manifests they apply,
// and the scenarios both run (exec, copy, delete). Both suites drive the
// system only as a user would, through kubectl, the kubectl plugin and the
// docker CLI, so the framework takes those tools, bound to a suite's
// kubeconfig, and asserts what a user sees. It imports nothing from the
// operator's runtime. (After kubernetes-sigs/agent-sandbox's
// test/e2e/framework.)
package framework

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
)

const (
	// LabelPrefix is the prefix of the labels the operator puts on the
	// containers it creates.
	LabelPrefix = "sandbox.code-sandbox.dev/"
	// NodeLabel names the node whose manager created a container.
	NodeLabel = LabelPrefix + "node"
	// UIDLabel is the UID of a container's Sandbox.
	UIDLabel = LabelPrefix + "sandbox-uid"

	// SampleImage is config/samples' image; make test-images builds it.
	SampleImage = "code-sandbox-test/python:3"

	// commandTimeout bounds one command, so that a hung CLI fails its spec
	// instead of the whole run.
	commandTimeout = 10 * time.Minute
)

// CommandError is a command that failed; it carries the command's stderr,
// which is how kubectl and docker explain themselves, and unwraps to the
// *exec.ExitError (or whatever kept the command from running).
type CommandError struct {
	Cmd    string
	Err    error
	Stderr string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%s: %v\n%s", e.Cmd, e.Err, strings.TrimSpace(e.Stderr))
}

func (e *CommandError) Unwrap() error { return e.Err }

// Run runs a command in dir (empty: the working directory) with stdin (nil:
// none) to completion and returns its stdout; a failure is a *CommandError.
// The command line goes to GinkgoWriter.
func Run(ctx context.Context, dir string, stdin io.Reader, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// Killing the process is not enough if it left children holding the
	// pipes open; stop waiting for them shortly after.
	cmd.WaitDelay = 5 * time.Second
	line := name + " " + strings.Join(args, " ")
	fmt.Fprintf(GinkgoWriter, "$ %s\n", line)
	if err := cmd.Run(); err != nil {
		return stdout.String(), &CommandError{Cmd: line, Err: err, Stderr: stderr.String()}
	}
	return stdout.String(), nil
}
