package execio

import (
	"fmt"
	"path"
	"strings"
)

// AllowedRoots are the directories file transfers may touch: the sandbox's
// working directory and its two scratch tmpfs mounts. Everything else is the
// read-only image, where there is nothing to write and nothing a caller
// should read through this API.
func AllowedRoots(workingDir string) []string {
	return []string{workingDir, "/tmp", "/var/tmp"}
}

// ResolvePath turns a caller's path into a Target. A relative p is relative
// to workingDir; an absolute p must lie in one of AllowedRoots. Any ".."
// component is refused, even one that would stay inside a root: the rule is
// easy to state and leaves nothing to interpretation. "." and a root itself
// resolve to Rel "".
func ResolvePath(workingDir, p string) (Target, error) {
	roots := AllowedRoots(workingDir)
	invalid := func(reason string) (Target, error) {
		shown := p
		if len(shown) > 100 {
			shown = shown[:100] + "…"
		}
		return Target{}, fmt.Errorf("%w: %q: %s (allowed roots: %s)", ErrInvalidPath, shown, reason, strings.Join(roots, ", "))
	}
	if !path.IsAbs(workingDir) || path.Clean(workingDir) != workingDir || workingDir == "/" {
		return invalid(fmt.Sprintf("the sandbox's working directory %q is not a clean absolute path", workingDir))
	}
	if err := checkPathSyntax(p); err != nil {
		return invalid(err.Error())
	}
	abs := p
	if !path.IsAbs(p) {
		abs = path.Join(workingDir, p)
	}
	abs = path.Clean(abs)
	// The longest matching root wins, so a working directory nested in
	// /tmp (say /tmp/work) is its own root.
	best := ""
	for _, root := range roots {
		if (abs == root || strings.HasPrefix(abs, root+"/")) && len(root) > len(best) {
			best = root
		}
	}
	if best == "" {
		return invalid("outside the sandbox's writable directories")
	}
	return Target{Root: best, Rel: strings.TrimPrefix(strings.TrimPrefix(abs, best), "/")}, nil
}

// checkPathSyntax applies the rules shared by caller paths and archive entry
// names: not empty, no NUL, bounded length, no ".." component.
func checkPathSyntax(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("the path is empty")
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("the path contains a NUL byte")
	case len(p) > MaxPathLength:
		return fmt.Errorf("the path is %d bytes long, more than %d", len(p), MaxPathLength)
	}
	for _, comp := range strings.Split(p, "/") {
		if comp == ".." {
			return fmt.Errorf(`the path has a ".." component, which is never allowed`)
		}
		if len(comp) > MaxNameLength {
			return fmt.Errorf("a path component is %d bytes long, more than %d", len(comp), MaxNameLength)
		}
	}
	return nil
}

// CleanArchiveName validates the name of an entry in an uploaded archive and
// returns it cleaned and relative ("a/./b/" → "a/b"). It returns "" for the
// archive's root itself ("." or "./"). Absolute names, ".." components, NUL
// bytes and over-long names are refused with ErrInvalidPath. The server-side
// sanitiser and the in-sandbox helper both use it, so they agree.
func CleanArchiveName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: archive entry %q has an absolute name", ErrInvalidPath, name)
	}
	if err := checkPathSyntax(name); err != nil {
		return "", fmt.Errorf("%w: archive entry %q: %v", ErrInvalidPath, name, err)
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	return clean, nil
}

// CheckTarget validates a Target built by someone other than ResolvePath
// (for example received over the wire): Root absolute and clean, Rel clean
// and relative without "..".
func CheckTarget(t Target) error {
	if !path.IsAbs(t.Root) || path.Clean(t.Root) != t.Root || t.Root == "/" {
		return fmt.Errorf("%w: root %q is not a clean absolute directory", ErrInvalidPath, t.Root)
	}
	if t.Rel == "" {
		return nil
	}
	clean, err := CleanArchiveName(t.Rel)
	if err != nil {
		return err
	}
	if clean != t.Rel {
		return fmt.Errorf("%w: %q is not a clean relative path", ErrInvalidPath, t.Rel)
	}
	return nil
}
