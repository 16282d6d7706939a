package main

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// sandboxRef names a Sandbox as the user wrote it; Namespace is empty when
// the current namespace applies.
type sandboxRef struct {
	Namespace, Name string
}

// resourcePrefixes are accepted in front of a Sandbox's name, as kubectl
// accepts "pod/NAME".
var resourcePrefixes = []string{"sandbox/", "sandboxes/", "sbx/",
	"sandbox.sandbox.code-sandbox.dev/", "sandboxes.sandbox.code-sandbox.dev/"}

// parseSandboxName reads NAME or sandbox/NAME (also sbx/NAME).
func parseSandboxName(s string) (string, error) {
	for _, p := range resourcePrefixes {
		if rest, ok := strings.CutPrefix(s, p); ok {
			s = rest
			break
		}
	}
	if s == "" {
		return "", errors.New("a sandbox name is required")
	}
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		return "", fmt.Errorf("invalid sandbox name %q: %s", s, strings.Join(errs, "; "))
	}
	return s, nil
}

// copySpec is one side of `cp`: a local path, or a path in a Sandbox.
type copySpec struct {
	Sandbox *sandboxRef // nil for a local path
	Path    string
}

func (c copySpec) String() string {
	if c.Sandbox == nil {
		return c.Path
	}
	if c.Sandbox.Namespace != "" {
		return c.Sandbox.Namespace + "/" + c.Sandbox.Name + ":" + c.Path
	}
	return c.Sandbox.Name + ":" + c.Path
}

// parseCopySpec reads `[NAMESPACE/]NAME:PATH` (a Sandbox) or a local path,
// as kubectl cp does: an argument is remote when what precedes its first
// colon is a valid [namespace/]name. A local path that would look remote
// can be written as ./PATH.
func parseCopySpec(arg string) (copySpec, error) {
	if arg == "" {
		return copySpec{}, errors.New("an empty path was given")
	}
	prefix, path, found := strings.Cut(arg, ":")
	if !found || prefix == "" || strings.HasPrefix(prefix, ".") {
		return copySpec{Path: arg}, nil
	}
	ref := &sandboxRef{}
	switch parts := strings.Split(prefix, "/"); len(parts) {
	case 1:
		ref.Name = parts[0]
	case 2:
		ref.Namespace, ref.Name = parts[0], parts[1]
		if len(validation.IsDNS1123Label(ref.Namespace)) > 0 {
			return copySpec{Path: arg}, nil
		}
	default:
		return copySpec{Path: arg}, nil
	}
	if len(validation.IsDNS1123Subdomain(ref.Name)) > 0 {
		return copySpec{Path: arg}, nil
	}
	if path == "" {
		return copySpec{}, fmt.Errorf("%q names no path in sandbox %s; write %s:PATH", arg, ref.Name, prefix)
	}
	return copySpec{Sandbox: ref, Path: path}, nil
}

// parseEnv checks -e KEY=VALUE arguments.
func parseEnv(vars []string) ([]string, error) {
	for _, v := range vars {
		key, _, ok := strings.Cut(v, "=")
		if !ok {
			return nil, fmt.Errorf("invalid --env %q: want KEY=VALUE", v)
		}
		if !execio.ValidEnvName(key) {
			return nil, fmt.Errorf("invalid --env %q: %q is not a variable name (letters, digits and _, not starting with a digit)", v, key)
		}
	}
	return vars, nil
}
