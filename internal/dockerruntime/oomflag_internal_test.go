/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"testing"

	"github.com/docker/docker/api/types/container"
)

// TestOOMFlagPending: only a SIGKILLed exit under a memory limit, not yet
// recorded as the OOM killer's, makes Inspect wait for Docker's OOM event.
func TestOOMFlagPending(t *testing.T) {
	resp := func(status container.ContainerState, code int, oom bool, memory int64) container.InspectResponse {
		return container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{
			State:      &container.State{Status: status, ExitCode: code, OOMKilled: oom},
			HostConfig: &container.HostConfig{Resources: container.Resources{Memory: memory}},
		}}
	}
	for _, tc := range []struct {
		name string
		resp container.InspectResponse
		want bool
	}{
		{"exited 137 under a limit", resp(container.StateExited, 137, false, 64<<20), true},
		{"dead 137 under a limit", resp(container.StateDead, 137, false, 64<<20), true},
		{"already flagged", resp(container.StateExited, 137, true, 64<<20), false},
		{"other exit code", resp(container.StateExited, 1, false, 64<<20), false},
		{"no memory limit", resp(container.StateExited, 137, false, 0), false},
		{"running", resp(container.StateRunning, 0, false, 64<<20), false},
		{"no state", container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{}}, false},
		{"nothing", container.InspectResponse{}, false},
	} {
		if got := oomFlagPending(tc.resp); got != tc.want {
			t.Errorf("%s: oomFlagPending = %v, want %v", tc.name, got, tc.want)
		}
	}
}
