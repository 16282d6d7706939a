package execio

import (
	"fmt"
	"path"
	"strings"
	"time"
)

// Normalize checks r and returns a copy with every zero default filled in
// (TimeoutSeconds, OutputLimitBytes). Every error wraps ErrInvalidRequest and
// names the offending value, so a caller can show it as is.
func (r Request) Normalize() (Request, error) {
	invalid := func(format string, args ...any) (Request, error) {
		return Request{}, fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
	}
	switch {
	case len(r.Command) > 0 && r.Shell != "":
		return invalid("set exactly one of command and shell, not both")
	case len(r.Command) == 0 && r.Shell == "":
		return invalid("set exactly one of command and shell; both are empty")
	case len(r.Command) > 0 && r.Command[0] == "":
		return invalid("command[0] (the program) is empty")
	}
	if err := checkStrings("command", r.Command, MaxArgs, MaxArgBytes); err != nil {
		return invalid("%v", err)
	}
	if err := checkStrings("env", r.Env, MaxEnv, MaxEnvBytes); err != nil {
		return invalid("%v", err)
	}
	if len(r.Shell) > MaxArgBytes {
		return invalid("shell is %d bytes, more than the %d allowed", len(r.Shell), MaxArgBytes)
	}
	// A NUL cannot be passed through execve: the kernel would silently cut
	// the string there, so the command run would differ from the one asked.
	for i, arg := range r.Command {
		if strings.IndexByte(arg, 0) >= 0 {
			return invalid("command[%d] %q contains a NUL byte", i, arg)
		}
	}
	if strings.IndexByte(r.Shell, 0) >= 0 {
		return invalid("shell %q contains a NUL byte", r.Shell)
	}
	for i, kv := range r.Env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok {
			return invalid("env[%d] %q is not KEY=VALUE", i, kv)
		}
		if !ValidEnvName(name) {
			return invalid("env[%d] %q: %q is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", i, kv, name)
		}
		if strings.IndexByte(kv, 0) >= 0 {
			return invalid("env[%d] %q contains a NUL byte", i, kv)
		}
	}
	if r.WorkingDir != "" {
		if err := checkWorkingDir(r.WorkingDir); err != nil {
			return invalid("%v", err)
		}
	}
	switch {
	case r.TimeoutSeconds == 0:
		r.TimeoutSeconds = int64(DefaultTimeout / time.Second)
	case r.TimeoutSeconds < 0 || r.TimeoutSeconds > int64(MaxTimeout/time.Second):
		return invalid("timeoutSeconds %d is out of range (1 to %d)", r.TimeoutSeconds, int64(MaxTimeout/time.Second))
	}
	switch {
	case r.OutputLimitBytes == 0:
		r.OutputLimitBytes = DefaultOutputLimit
	case r.OutputLimitBytes < 0 || r.OutputLimitBytes > MaxOutputLimit:
		return invalid("outputLimitBytes %d is out of range (1 to %d)", r.OutputLimitBytes, MaxOutputLimit)
	}
	if int64(len(r.Stdin)) > MaxStdin {
		return invalid("stdin is %d bytes, more than the %d allowed", len(r.Stdin), MaxStdin)
	}
	return r, nil
}

// Argv is the argv to execute: Command as is, or Shell run by /bin/sh -c.
func (r Request) Argv() []string {
	if r.Shell != "" {
		return []string{"/bin/sh", "-c", r.Shell}
	}
	return r.Command
}

// Timeout is TimeoutSeconds as a duration (DefaultTimeout when zero).
func (r Request) Timeout() time.Duration {
	if r.TimeoutSeconds == 0 {
		return DefaultTimeout
	}
	return time.Duration(r.TimeoutSeconds) * time.Second
}

// ValidEnvName reports whether name is a portable environment variable name:
// letters, digits and _, not starting with a digit. Clients check it before
// sending a request; the helper checks it again.
func ValidEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// checkWorkingDir refuses working directories that would hand the command a
// file descriptor or a kernel object instead of a directory in the sandbox:
// /proc/self/fd/N is how CVE-2024-21626 leaked a host directory, and /dev/fd
// is a symlink to it. runc ≥ 1.1.12 is the actual fix; this is the cheap
// second line.
func checkWorkingDir(dir string) error {
	switch {
	case strings.IndexByte(dir, 0) >= 0:
		return fmt.Errorf("workingDir %q contains a NUL byte", dir)
	case len(dir) > MaxPathLength:
		return fmt.Errorf("workingDir is %d bytes long, more than %d", len(dir), MaxPathLength)
	case !path.IsAbs(dir) || path.Clean(dir) != dir:
		return fmt.Errorf("workingDir %q must be a clean absolute path", dir)
	}
	for _, reserved := range []string{"/proc", "/dev/fd"} {
		if dir == reserved || strings.HasPrefix(dir, reserved+"/") {
			return fmt.Errorf("workingDir %q is under %s, which is not allowed", dir, reserved)
		}
	}
	return nil
}

// checkStrings bounds a list of strings by count and by total bytes (each
// counted with its terminating NUL, as execve does).
func checkStrings(field string, list []string, maxCount, maxBytes int) error {
	if len(list) > maxCount {
		return fmt.Errorf("%s has %d entries, more than the %d allowed", field, len(list), maxCount)
	}
	total := 0
	for _, s := range list {
		total += len(s) + 1
	}
	if total > maxBytes {
		return fmt.Errorf("%s is %d bytes, more than the %d allowed", field, total, maxBytes)
	}
	return nil
}
