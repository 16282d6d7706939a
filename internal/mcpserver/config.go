package mcpserver

import (
	"fmt"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Defaults for Config, also the defaults of the binary's flags.
const (
	DefaultCommandTimeout   = execio.DefaultTimeout
	DefaultMaxTimeout       = 30 * time.Minute
	DefaultOutputLimit      = execio.DefaultOutputLimit
	DefaultMaxCPU           = 4.0
	DefaultMaxMemoryBytes   = int64(4 << 30)
	DefaultMaxLifetime      = 4 * time.Hour
	DefaultMaxReadBytes     = int64(4 << 20)
	DefaultMaxFileBytes     = int64(32 << 20)
	DefaultMaxUploadBytes   = execio.DefaultUploadLimit
	DefaultMaxUploadEntries = execio.DefaultMaxEntries
	// MaxCommandsPerExec bounds one sandbox_exec call.
	MaxCommandsPerExec = 100
	// MaxCommandLength bounds one command line.
	MaxCommandLength = 128 << 10
	// MaxFileContents bounds write_file's file_contents, whatever
	// MaxFileBytes says: it travels inside one JSON-RPC message.
	MaxFileContents = 16 << 20
)

// The output budget of one sandbox_exec call (Config.ExecOutputBudget).
const (
	// DefaultExecOutputBudget bounds the output one sandbox_exec call
	// keeps for its result, across all its commands and both streams.
	DefaultExecOutputBudget = int64(2 << 20)
	// MinExecOutputBudget is the smallest budget the server accepts.
	MinExecOutputBudget = int64(4 << 10)
)

// Config is the tools' policy: defaults and limits that do not depend on the
// backend. Quotas on sandboxes (how many, for how long idle) belong to the
// backend, which owns them.
type Config struct {
	// Version is reported in the server's implementation info.
	Version string
	// PreviewBaseURL, when set, is the external base URL of the preview
	// listener (PreviewHandler), and enables expose_port/unexpose_port.
	PreviewBaseURL string
	// DefaultImage is used when sandbox_initialize names none.
	DefaultImage string
	// AllowedImages, when not empty, are path.Match patterns an image must
	// match (for example "python:*", "ghcr.io/acme/*").
	AllowedImages []string
	// AllowEgress permits network "egress"; without it only "none".
	AllowEgress bool
	// MaxNanoCPUs and MaxMemoryBytes bound what a sandbox may ask for.
	MaxNanoCPUs    int64
	MaxMemoryBytes int64
	// MaxLifetime bounds lifetime_seconds and is the default lifetime.
	MaxLifetime time.Duration
	// CommandTimeout is a command's default timeout; MaxTimeout bounds
	// timeout_seconds.
	CommandTimeout time.Duration
	MaxTimeout     time.Duration
	// OutputLimit caps each of stdout and stderr per command.
	OutputLimit int64
	// ExecOutputBudget caps the output one sandbox_exec call keeps in
	// memory and returns, across all its commands: each command keeps the
	// end of its output within its share (what is left divided by the
	// commands left).
	ExecOutputBudget int64
	// HostRoots are the host directories copy_project, copy_file and
	// copy_file_from_sandbox may touch (see NewHostRoots). Empty: none.
	HostRoots *HostRoots
	// MaxReadBytes caps read_file; MaxFileBytes caps copy_file and
	// copy_file_from_sandbox; MaxUploadBytes and MaxUploadEntries cap
	// copy_project.
	MaxReadBytes     int64
	MaxFileBytes     int64
	MaxUploadBytes   int64
	MaxUploadEntries int

	// What a sandbox gets when sandbox_initialize asks for nothing, and how
	// sandbox_stop ends it: the backend's defaults (its constants; the
	// binary fills them in), which the tool descriptions state rather than
	// repeat. Zero: the descriptions say "the server's default" or "a grace
	// period" instead of a number.
	SandboxNanoCPUs    int64
	SandboxMemoryBytes int64
	SandboxWorkingDir  string
	StopGrace          time.Duration
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.DefaultImage == "" {
		c.DefaultImage = contract.DefaultImage
	}
	if c.MaxNanoCPUs == 0 {
		c.MaxNanoCPUs = int64(DefaultMaxCPU * 1e9)
	}
	if c.MaxMemoryBytes == 0 {
		c.MaxMemoryBytes = DefaultMaxMemoryBytes
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = DefaultMaxLifetime
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = DefaultMaxTimeout
	}
	if c.OutputLimit == 0 {
		c.OutputLimit = DefaultOutputLimit
	}
	if c.ExecOutputBudget == 0 {
		c.ExecOutputBudget = DefaultExecOutputBudget
	}
	if c.HostRoots == nil {
		c.HostRoots = &HostRoots{}
	}
	if c.MaxReadBytes == 0 {
		c.MaxReadBytes = DefaultMaxReadBytes
	}
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = DefaultMaxFileBytes
	}
	if c.MaxUploadBytes == 0 {
		c.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if c.MaxUploadEntries == 0 {
		c.MaxUploadEntries = DefaultMaxUploadEntries
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.CommandTimeout < time.Second || c.CommandTimeout > c.MaxTimeout:
		return fmt.Errorf("command timeout %s must be between 1s and the maximum timeout %s", c.CommandTimeout, c.MaxTimeout)
	case c.MaxTimeout > execio.MaxTimeout:
		return fmt.Errorf("maximum timeout %s exceeds %s", c.MaxTimeout, execio.MaxTimeout)
	case c.OutputLimit < 1 || c.OutputLimit > execio.MaxOutputLimit:
		return fmt.Errorf("output limit %d must be between 1 and %d bytes", c.OutputLimit, execio.MaxOutputLimit)
	case c.ExecOutputBudget < MinExecOutputBudget || c.ExecOutputBudget > 1<<30:
		return fmt.Errorf("exec output budget %d must be between %d bytes and 1GiB", c.ExecOutputBudget, MinExecOutputBudget)
	case c.MaxLifetime < time.Minute:
		return fmt.Errorf("maximum lifetime %s is shorter than a minute", c.MaxLifetime)
	case c.MaxNanoCPUs <= 0 || c.MaxMemoryBytes < 6<<20:
		return fmt.Errorf("maximum CPU and memory must be positive (memory at least 6MiB)")
	case c.MaxReadBytes <= 0 || c.MaxFileBytes <= 0 || c.MaxUploadBytes <= 0 || c.MaxUploadEntries <= 0:
		return fmt.Errorf("file size and entry caps must be positive")
	}
	return nil
}
