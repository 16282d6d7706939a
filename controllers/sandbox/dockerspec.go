/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"fmt"

	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// dockerSpecFor translates a Sandbox into the runtime's container spec. Zero
// quantities fall back to the runtime's defaults, which equal the CRD's.
func dockerSpecFor(sbx *sandboxv1alpha1.Sandbox, opts Options) (dockerruntime.Spec, error) {
	effective, ok := warmpool.Effective(sbx)
	if !ok {
		return dockerruntime.Spec{}, fmt.Errorf("sandbox claims from warm pool %s but no template was recorded at the claim", sbx.Spec.WarmPoolRef.Name)
	}
	sbx = sbx.DeepCopy()
	sbx.Spec = effective
	res := sbx.Spec.Resources
	spec := dockerruntime.Spec{
		Owner: dockerruntime.Owner{
			UID:       string(sbx.UID),
			Namespace: sbx.Namespace,
			Name:      sbx.Name,
			Node:      opts.NodeName,
		},
		Image:           sbx.Spec.Image,
		PullPolicy:      dockerruntime.PullPolicy(sbx.Spec.ImagePullPolicy),
		Command:         sbx.Spec.Command,
		WorkingDir:      sbx.Spec.WorkingDir,
		User:            sbx.Spec.User,
		Pids:            ptr.Deref(res.Pids, 0),
		StopGracePeriod: opts.StopGracePeriod,
	}
	// Unset quantities stay zero and take the runtime's defaults, which equal
	// the CRD's.
	if res.CPU != nil {
		spec.NanoCPUs = res.CPU.MilliValue() * 1_000_000
	}
	if res.Memory != nil {
		spec.MemoryBytes = res.Memory.Value()
	}
	if res.Disk != nil {
		spec.DiskBytes = res.Disk.Value()
	}
	for _, env := range sbx.Spec.Env {
		spec.Env = append(spec.Env, env.Name+"="+env.Value)
	}
	switch sbx.Spec.Network.Mode {
	case "", sandboxv1alpha1.NetworkNone:
		spec.Network = dockerruntime.NetworkNone
	case sandboxv1alpha1.NetworkEgress:
		spec.Network = dockerruntime.NetworkEgress
		if egressPolicyOf(sbx) != nil {
			// The policy network: the firewall sends everything to the
			// proxy from the first packet, before applyEgress has set
			// the policy (until then the proxy refuses the source).
			spec.Network = dockerruntime.NetworkEgressPolicy
		}
	default:
		return spec, fmt.Errorf("unknown network mode %q", sbx.Spec.Network.Mode)
	}
	switch sbx.Spec.Runtime {
	case "", sandboxv1alpha1.RuntimeRunc:
		spec.Runtime = dockerruntime.RuntimeRunc
	case sandboxv1alpha1.RuntimeGVisor:
		spec.Runtime = dockerruntime.RuntimeRunsc
	default:
		return spec, fmt.Errorf("unknown runtime %q", sbx.Spec.Runtime)
	}
	return spec, nil
}
