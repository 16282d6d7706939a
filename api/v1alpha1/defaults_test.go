/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package v1alpha1

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// crdDefaults reads a generated CRD and returns every default: it declares,
// keyed by the field's dotted path below the schema (for example
// "spec.resources.memory"), rendered with fmt.Sprint.
func crdDefaults(t *testing.T, file string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", file))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != GroupVersion.Version {
		t.Fatalf("%s: want the one version %s", file, GroupVersion.Version)
	}
	found := map[string]string{}
	var walk func(path string, schema map[string]any)
	walk = func(path string, schema map[string]any) {
		if d, ok := schema["default"]; ok {
			found[path] = fmt.Sprint(d)
		}
		props, _ := schema["properties"].(map[string]any)
		for name, sub := range props {
			if s, ok := sub.(map[string]any); ok {
				walk(strings.TrimPrefix(path+"."+name, "."), s)
			}
		}
		if items, ok := schema["items"].(map[string]any); ok {
			walk(path+"[]", items)
		}
	}
	walk("", crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
	return found
}

// sameDefaults fails unless got declares exactly the defaults of want: a
// marker that drifts from its constant, or a new default without one, fails.
func sameDefaults(t *testing.T, file string, want map[string]string) {
	t.Helper()
	got := crdDefaults(t, file)
	var paths []string
	for p := range got {
		paths = append(paths, p)
	}
	for p := range want {
		if _, ok := got[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		g, inCRD := got[p]
		w, inGo := want[p]
		switch {
		case !inGo:
			t.Errorf("%s: %s has default %q in the CRD but no constant in api/v1alpha1/defaults.go", file, p, g)
		case !inCRD:
			t.Errorf("%s: %s has no default in the CRD, want %q", file, p, w)
		case g != w:
			t.Errorf("%s: %s defaults to %q in the CRD but to %q in api/v1alpha1/defaults.go", file, p, g, w)
		}
	}
}

// templateDefaults are the defaults a Sandbox's spec and a warm pool's
// template share, below prefix.
func templateDefaults(prefix string) map[string]string {
	return map[string]string{
		prefix + ".imagePullPolicy":  string(DefaultImagePullPolicy),
		prefix + ".workingDir":       DefaultWorkingDir,
		prefix + ".user":             DefaultUser,
		prefix + ".runtime":          string(DefaultRuntime),
		prefix + ".network":          "map[]",
		prefix + ".network.mode":     string(DefaultNetworkMode),
		prefix + ".resources":        "map[]",
		prefix + ".resources.cpu":    DefaultCPU,
		prefix + ".resources.memory": DefaultMemory,
		prefix + ".resources.disk":   DefaultDisk,
		prefix + ".resources.pids":   fmt.Sprint(DefaultPids),
	}
}

func TestSandboxCRDDefaultsAreTheConstants(t *testing.T) {
	want := templateDefaults("spec")
	// Not a template field: a pool member never idles out.
	want["spec.lifecycle.shutdownPolicy"] = string(DefaultShutdownPolicy)
	// The pool template recorded at a claim carries the template's markers.
	for p, v := range templateDefaults("status.warmPool.template") {
		want[p] = v
	}
	sameDefaults(t, "sandbox.code-sandbox.dev_sandboxes.yaml", want)
}

func TestWarmPoolCRDDefaultsAreTheConstants(t *testing.T) {
	want := templateDefaults("spec.template")
	want["spec.replicas"] = fmt.Sprint(DefaultWarmPoolReplicas)
	sameDefaults(t, "sandbox.code-sandbox.dev_sandboxwarmpools.yaml", want)
}

func TestQuotaCRDDefaults(t *testing.T) {
	// SandboxQuota's defaults are not Sandbox defaults; this pins the set
	// so a new Sandbox-related default there is noticed.
	got := crdDefaults(t, "sandbox.code-sandbox.dev_sandboxquotas.yaml")
	want := map[string]string{"spec.allowEgress": "false", "spec.egress.requirePolicy": "false"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("SandboxQuota CRD defaults changed: %v, want %v", got, want)
	}
}

// The runtime's units are the same quantities.
func TestDefaultQuantitiesInRuntimeUnits(t *testing.T) {
	cpu, memory, disk := resource.MustParse(DefaultCPU), resource.MustParse(DefaultMemory), resource.MustParse(DefaultDisk)
	if got := cpu.MilliValue() * 1_000_000; got != DefaultNanoCPUs {
		t.Errorf("DefaultCPU %s is %d nano-CPUs, DefaultNanoCPUs is %d", DefaultCPU, got, DefaultNanoCPUs)
	}
	if got := memory.Value(); got != DefaultMemoryBytes {
		t.Errorf("DefaultMemory %s is %d bytes, DefaultMemoryBytes is %d", DefaultMemory, got, DefaultMemoryBytes)
	}
	if got := disk.Value(); got != DefaultDiskBytes {
		t.Errorf("DefaultDisk %s is %d bytes, DefaultDiskBytes is %d", DefaultDisk, got, DefaultDiskBytes)
	}
}

func TestSnapshotCRDDefaultsAreTheConstants(t *testing.T) {
	// The recorded source shape carries the template's markers; the
	// snapshot itself has no default of its own.
	sameDefaults(t, "sandbox.code-sandbox.dev_sandboxsnapshots.yaml", templateDefaults("status.source"))
}
