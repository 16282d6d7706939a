/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package warmpool_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// TestMatches: a member made by Member matches its template; any change to
// what reaches the container does not, whatever the labels say.
func TestMatches(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxWarmPool{Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Template: sandboxv1alpha1.SandboxTemplate{
		Image: "python:3.12-slim-bookworm", ImagePullPolicy: sandboxv1alpha1.ImagePullPolicy("IfNotPresent"),
		WorkingDir: "/app", User: "65534:65534", Runtime: sandboxv1alpha1.RuntimeClass("runc"),
		Resources: sandboxv1alpha1.SandboxResources{CPU: ptr.To(resource.MustParse("500m")), Memory: ptr.To(resource.MustParse("256Mi"))},
	}}}
	member := warmpool.Member(pool)
	if !warmpool.Matches(&member.Spec, pool.Spec.Template) {
		t.Fatal("a member made from the template does not match it")
	}
	// The same values, spelled differently, and what does not shape the
	// container.
	same := member.Spec.DeepCopy()
	same.Resources.CPU = ptr.To(resource.MustParse("0.5"))
	same.Command = []string{}
	same.NodeName, same.ActiveDeadlineSeconds, same.Paused = "node-a", ptr.To[int64](60), false
	if !warmpool.Matches(same, pool.Spec.Template) {
		t.Error("equal quantities, an empty command, nodeName, the lifetime or paused made it differ")
	}
	for name, change := range map[string]func(s *sandboxv1alpha1.SandboxSpec){
		"image":       func(s *sandboxv1alpha1.SandboxSpec) { s.Image = "attacker/image:1" },
		"pull policy": func(s *sandboxv1alpha1.SandboxSpec) { s.ImagePullPolicy = "Always" },
		"command":     func(s *sandboxv1alpha1.SandboxSpec) { s.Command = []string{"/bin/sh", "-c", "evil"} },
		"workingDir":  func(s *sandboxv1alpha1.SandboxSpec) { s.WorkingDir = "/work" },
		"user":        func(s *sandboxv1alpha1.SandboxSpec) { s.User = "1000" },
		"cpu":         func(s *sandboxv1alpha1.SandboxSpec) { s.Resources.CPU = ptr.To(resource.MustParse("2")) },
		"memory":      func(s *sandboxv1alpha1.SandboxSpec) { s.Resources.Memory = ptr.To(resource.MustParse("2Gi")) },
		"pids":        func(s *sandboxv1alpha1.SandboxSpec) { s.Resources.Pids = ptr.To[int64](100000) },
		"disk":        func(s *sandboxv1alpha1.SandboxSpec) { s.Resources.Disk = ptr.To(resource.MustParse("10Gi")) },
		"network":     func(s *sandboxv1alpha1.SandboxSpec) { s.Network.Mode = "Egress" },
		"runtime":     func(s *sandboxv1alpha1.SandboxSpec) { s.Runtime = "gvisor" },
		"env": func(s *sandboxv1alpha1.SandboxSpec) {
			s.Env = []sandboxv1alpha1.EnvVar{{Name: "LD_PRELOAD", Value: "/tmp/x.so"}}
		},
		"warmPoolRef": func(s *sandboxv1alpha1.SandboxSpec) {
			s.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: "other"}
		},
	} {
		spec := member.Spec.DeepCopy()
		change(spec)
		if warmpool.Matches(spec, pool.Spec.Template) {
			t.Errorf("a member with another %s matches the template", name)
		}
	}
}

// TestMatchesStripped: a member read from a cache that dropped command and
// env (sandbox.StripForeign in controllers/sandbox) still matches a template with a command,
// and still does not match a template of another shape.
func TestMatchesStripped(t *testing.T) {
	tmpl := sandboxv1alpha1.SandboxTemplate{Image: "busybox:1", Command: []string{"sleep", "infinity"}}
	spec := sandboxv1alpha1.SandboxSpec{}
	warmpool.ApplyTemplate(&spec, tmpl)
	if !warmpool.Matches(&spec, tmpl) {
		t.Fatal("the whole member does not match its template")
	}
	stripped := spec.DeepCopy()
	stripped.Command = nil
	if warmpool.Matches(stripped, tmpl) {
		t.Error("Matches ignores the command")
	}
	if !warmpool.MatchesStripped(stripped, tmpl) {
		t.Error("a stripped member does not match its template")
	}
	other := stripped.DeepCopy()
	other.Image = "busybox:2"
	if warmpool.MatchesStripped(other, tmpl) {
		t.Error("a stripped member of another image matches")
	}
}
