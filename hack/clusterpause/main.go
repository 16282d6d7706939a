//go:build linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Command clusterpause is the pause process of the kind nodes' pod
// sandboxes (hack/kind/node-image.sh builds it into an image FROM scratch
// under the name kubeadm asks for and imports it into the node image's
// containerd, so that no pod pulls registry.k8s.io/pause). Like Kubernetes' pause it holds the pod's
// namespaces open, exits on SIGINT or SIGTERM and reaps the zombies it
// inherits when the pod shares its process namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("warning: pause should be the first process\n")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
