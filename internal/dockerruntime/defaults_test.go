/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime_test

import (
	"testing"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

// The runtime knows no Kubernetes types, so it keeps its own defaults for a
// Spec's zero fields; they must be the Sandbox's (api/v1alpha1/defaults.go),
// or the MCP server's Docker backend and the operator would build different
// containers.
func TestRuntimeDefaultsAreTheSandboxDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"NanoCPUs", dockerruntime.DefaultNanoCPUs, sandboxv1alpha1.DefaultNanoCPUs},
		{"MemoryBytes", dockerruntime.DefaultMemoryBytes, sandboxv1alpha1.DefaultMemoryBytes},
		{"DiskBytes", dockerruntime.DefaultDiskBytes, sandboxv1alpha1.DefaultDiskBytes},
		{"Pids", dockerruntime.DefaultPids, sandboxv1alpha1.DefaultPids},
		{"WorkingDir", dockerruntime.DefaultWorkingDir, sandboxv1alpha1.DefaultWorkingDir},
		{"User", dockerruntime.DefaultUser, sandboxv1alpha1.DefaultUser},
		{"PullPolicy", string(dockerruntime.PullIfNotPresent), string(sandboxv1alpha1.DefaultImagePullPolicy)},
		{"Runtime", dockerruntime.RuntimeRunc, string(sandboxv1alpha1.DefaultRuntime)},
		{"StopGracePeriod", dockerruntime.DefaultStopGracePeriod, sandboxv1alpha1.DefaultStopGracePeriod},
	} {
		if c.got != c.want {
			t.Errorf("dockerruntime.Default%s is %v, the Sandbox default is %v", c.name, c.got, c.want)
		}
	}
}
