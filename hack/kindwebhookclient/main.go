/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command kindwebhookclient writes, once, kube-apiserver's client
// certificate towards admission webhooks, its CA and the admission
// configuration that presents it (package webhookclient) into a directory,
// for the kind cluster of make kind-up: hack/kind/up.sh mounts that
// directory into the control plane node at the same path and points
// kube-apiserver's --admission-control-config-file at it, and make
// kind-deploy gives the CA to the webhook (WEBHOOK_CLIENT_CA). A directory
// that already holds an admission configuration is left as it is, so a
// rerun keeps the CA the running webhook trusts.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/webhookclient"
)

// validity outlives any test cluster; make kind-down removes the directory.
const validity = 365 * 24 * time.Hour

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kindwebhookclient DIR")
		os.Exit(2)
	}
	dir, err := filepath.Abs(os.Args[1])
	if err == nil {
		err = write(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kindwebhookclient:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, webhookclient.AdmissionConfig)); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	_, err := webhookclient.Write(dir, validity)
	return err
}
