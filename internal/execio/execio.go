// Package execio holds what every way of running code in a sandbox shares:
// the command request and result, the output cap, the path rules that keep
// file transfers inside a sandbox, and the upload sanitiser. The manager's
// node API, its Go client and the MCP server all speak these types, so a
// limit or a path rule is enforced the same way everywhere.
package execio

import (
	"errors"
	"time"
)

// Errors callers branch on (the node API maps them to HTTP status codes, the
// MCP server to tool errors). They are always wrapped with a message that
// names the offending value.
var (
	// ErrInvalidRequest: a malformed command request (empty argv, NUL bytes,
	// bad env name, bad timeout…). HTTP 400.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrInvalidPath: a path that is empty, too long, contains NUL or "..",
	// or lies outside the sandbox's allowed roots. HTTP 400.
	ErrInvalidPath = errors.New("invalid path")
	// ErrPathNotFound: the path does not exist inside the sandbox. HTTP 404.
	ErrPathNotFound = errors.New("path not found")
	// ErrTooLarge: an upload or download exceeds its size cap. HTTP 413.
	ErrTooLarge = errors.New("too large")
	// ErrUnsupportedEntry: an upload contains a symlink, hard link, device
	// or other entry that is not a regular file or a directory. HTTP 400.
	ErrUnsupportedEntry = errors.New("unsupported archive entry")
	// ErrProcessNotFound: no background process has that handle in the
	// sandbox (it never existed, belongs to another sandbox, or was
	// removed). HTTP 404.
	ErrProcessNotFound = errors.New("no such background process")
	// ErrTooManyProcesses: the sandbox already runs its limit of background
	// processes. HTTP 429.
	ErrTooManyProcesses = errors.New("too many background processes")
	// ErrProcessExited: the operation needs a running process (a write to
	// its stdin). HTTP 409.
	ErrProcessExited = errors.New("background process has exited")
)

// Defaults and hard ceilings for commands.
const (
	DefaultTimeout = 60 * time.Second
	MaxTimeout     = 24 * time.Hour
	// DefaultOutputLimit is the per-stream cap (stdout and stderr each).
	DefaultOutputLimit int64 = 1 << 20
	// MaxOutputLimit is the largest per-stream cap a request may ask for.
	MaxOutputLimit int64 = 64 << 20
	// MaxStdin bounds the stdin a request may carry.
	MaxStdin int64 = 16 << 20
	// MaxArgs and MaxArgBytes bound argv (Command), MaxEnv and MaxEnvBytes
	// the environment. Linux refuses an execve over ARG_MAX (2 MiB on most
	// kernels) anyway, so nothing runnable is lost; without a bound, about
	// 8.8 M empty arguments in a 25 MiB body decode to over 250 MB of string
	// headers in whatever process decodes them first (the manager).
	MaxArgs     = 4096
	MaxArgBytes = 1 << 20
	MaxEnv      = 1024
	MaxEnvBytes = 256 << 10
	// MaxPathLength and MaxNameLength bound paths (as Linux does).
	MaxPathLength = 4096
	MaxNameLength = 255
	// DefaultUploadLimit and DefaultDownloadLimit cap file transfers.
	DefaultUploadLimit   int64 = 100 << 20
	DefaultDownloadLimit int64 = 100 << 20
	// DefaultMaxEntries caps the number of entries in one upload.
	DefaultMaxEntries = 10000
)

// Request is one command to run in a sandbox. Exactly one of Command (argv,
// run without a shell) and Shell (run by /bin/sh -c) is set.
type Request struct {
	// Command is the argv. Nothing interprets it; "; rm -rf /" is one
	// argument.
	Command []string `json:"command,omitempty"`
	// Shell is a shell command line run with /bin/sh -c.
	Shell string `json:"shell,omitempty"`
	// WorkingDir is an absolute directory in the sandbox; empty means the
	// sandbox's working directory.
	WorkingDir string `json:"workingDir,omitempty"`
	// Env adds KEY=VALUE variables.
	Env []string `json:"env,omitempty"`
	// Stdin is fed to the command, then closed. Nil means no stdin.
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutSeconds kills the command's whole process tree when it runs
	// longer. Zero means DefaultTimeout.
	TimeoutSeconds int64 `json:"timeoutSeconds,omitempty"`
	// OutputLimitBytes caps each of stdout and stderr. Zero means
	// DefaultOutputLimit.
	OutputLimitBytes int64 `json:"outputLimitBytes,omitempty"`
}

// Result is how a command ended.
type Result struct {
	ExitCode int `json:"exitCode"`
	// DurationMillis is the wall time from start to exit.
	DurationMillis int64 `json:"durationMillis"`
	// TimedOut: the timeout fired and the process tree was killed.
	TimedOut bool `json:"timedOut,omitempty"`
	// StdoutTruncated and StderrTruncated: the stream hit its cap; what
	// followed was discarded after a truncation marker.
	StdoutTruncated bool `json:"stdoutTruncated,omitempty"`
	StderrTruncated bool `json:"stderrTruncated,omitempty"`
	// StdoutBytes and StderrBytes count everything the command wrote,
	// including what was discarded.
	StdoutBytes int64 `json:"stdoutBytes"`
	StderrBytes int64 `json:"stderrBytes"`
}

// Truncated reports whether either stream was cut.
func (r Result) Truncated() bool { return r.StdoutTruncated || r.StderrTruncated }

// Duration is DurationMillis as a time.Duration.
func (r Result) Duration() time.Duration { return time.Duration(r.DurationMillis) * time.Millisecond }

// Target is a validated location inside a sandbox: an allowed root (such as
// /app or /tmp) and a clean relative path below it ("" is the root itself).
// The in-sandbox helper opens Rel beneath Root without ever leaving Root,
// whatever symlinks the sandbox has planted.
type Target struct {
	Root string `json:"root"`
	Rel  string `json:"rel"`
}

// TransferStats describe a completed upload or download.
type TransferStats struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Bytes int64 `json:"bytes"`
	// Links counts symbolic links, restored only with UploadLimits.Symlinks.
	Links int `json:"links,omitempty"`
}

// UploadLimits bound one upload.
type UploadLimits struct {
	// MaxBytes caps the total size of file contents. Zero means
	// DefaultUploadLimit.
	MaxBytes int64
	// MaxEntries caps the number of entries. Zero means DefaultMaxEntries.
	MaxEntries int
	// Symlinks lets symbolic links through, for a snapshot's restore. A
	// link's target is data (it may name anything, "/etc" included) and is
	// never followed: the helper creates every link after every file and
	// directory, and never below a link (see the helper's untar). Uploads
	// from users leave it false, as before: links are refused.
	Symlinks bool
}
