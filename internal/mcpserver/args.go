package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/docker/go-units"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// errArgs marks an argument the caller got wrong; tools report it as is.
var errArgs = errors.New("invalid arguments")

func argError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errArgs, fmt.Sprintf(format, args...))
}

// bindArgs decodes a tool's arguments strictly: unknown names and wrong
// types are errors that name the argument, so a model can correct its call.
func bindArgs(raw []byte, target any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(target)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			return argError("arguments must be one JSON object")
		}
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return argError("arguments must be a JSON object, not %s", typeErr.Value)
	case errors.As(err, &typeErr):
		return argError("argument %q must be %s, not %s", typeErr.Field, jsonTypeName(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return argError("arguments are not valid JSON: %v", err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return argError("unknown argument %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return argError("%v", err)
}

func jsonTypeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	case "bool":
		return "a boolean"
	case "float64", "float32":
		return "a number"
	default:
		return "an integer"
	}
}

// idPattern is what a container_id may look like: the IDs backends hand
// out are short and plain, so anything else is refused before it reaches
// a backend (or a log line).
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func checkContainerID(id string) error {
	if id == "" {
		return argError(`"container_id" is required: pass the container_id that sandbox_initialize returned (list_sandboxes shows yours)`)
	}
	if !idPattern.MatchString(id) {
		return argError("container_id %q is not a sandbox ID (letters, digits, '.', '_' or '-'; sandbox_initialize returns one)", Truncate(id, 80))
	}
	return nil
}

// checkSandboxPath applies the syntax rules the backend applies again, so
// that an obviously bad path fails before any work.
func checkSandboxPath(name, p string, required bool) error {
	switch {
	case p == "" && required:
		return argError("%q is required", name)
	case strings.IndexByte(p, 0) >= 0:
		return argError("%q contains a NUL byte", name)
	case len(p) > execio.MaxPathLength:
		return argError("%q is %d bytes long; the limit is %d", name, len(p), execio.MaxPathLength)
	}
	for _, comp := range strings.Split(p, "/") {
		if comp == ".." {
			return argError(`%q %q has a ".." component; use a path inside the sandbox's working directory, /tmp or /var/tmp`, name, Truncate(p, 200))
		}
	}
	return nil
}

// Truncate cuts s to at most n bytes at a rune boundary and marks the cut
// with an ellipsis; the tools and the transports quote input through it.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

type initializeArgs struct {
	Image           string   `json:"image"`
	CPU             *float64 `json:"cpu"`
	Memory          string   `json:"memory"`
	Network         string   `json:"network"`
	LifetimeSeconds *int64   `json:"lifetime_seconds"`
	EgressAllow     []string `json:"egress_allow"`
}

// createRequest validates sandbox_initialize's arguments against the
// policy and turns them into a CreateRequest.
func (a initializeArgs) createRequest(cfg Config) (contract.CreateRequest, error) {
	req := contract.CreateRequest{Image: strings.TrimSpace(a.Image), Network: contract.NetworkNone, Lifetime: cfg.MaxLifetime}
	if req.Image == "" {
		req.Image = cfg.DefaultImage
	}
	if len(req.Image) > 512 || strings.ContainsAny(req.Image, " \t\n\x00") {
		return contract.CreateRequest{}, argError("image %q is not an image reference", Truncate(req.Image, 100))
	}
	if !imageAllowed(cfg.AllowedImages, req.Image) {
		return contract.CreateRequest{}, argError("image %q is not allowed by this server; allowed: %s", req.Image, strings.Join(cfg.AllowedImages, ", "))
	}
	if a.CPU != nil {
		cpu := *a.CPU
		maxCPU := float64(cfg.MaxNanoCPUs) / 1e9
		if math.IsNaN(cpu) || cpu < 0.01 || cpu > maxCPU {
			return contract.CreateRequest{}, argError("cpu %v is out of range: 0.01 to %g cores", cpu, maxCPU)
		}
		req.NanoCPUs = int64(math.Round(cpu * 1e9))
	}
	if a.Memory != "" {
		mem, err := parseMemory(a.Memory)
		if err != nil {
			return contract.CreateRequest{}, err
		}
		if mem < 6<<20 || mem > cfg.MaxMemoryBytes {
			return contract.CreateRequest{}, argError("memory %q is out of range: 6Mi to %s", a.Memory, units.BytesSize(float64(cfg.MaxMemoryBytes)))
		}
		req.MemoryBytes = mem
	}
	switch a.Network {
	case "", contract.NetworkNone:
	case contract.NetworkEgress:
		if !cfg.AllowEgress {
			return contract.CreateRequest{}, argError(`network "egress" is disabled on this server (it was started without --allow-egress); use "none"`)
		}
		req.Network = contract.NetworkEgress
	default:
		return contract.CreateRequest{}, argError(`network %q is not one of "none" or "egress"`, Truncate(a.Network, 40))
	}
	if a.EgressAllow != nil {
		if !cfg.AllowEgress {
			return contract.CreateRequest{}, argError(`egress_allow needs network "egress", which is disabled on this server (it was started without --allow-egress)`)
		}
		if a.Network == contract.NetworkNone {
			return contract.CreateRequest{}, argError(`egress_allow needs network "egress"; network is "none"`)
		}
		if len(a.EgressAllow) == 0 {
			return contract.CreateRequest{}, argError(`egress_allow is empty; leave it out for unrestricted egress, or name the hosts the sandbox may reach`)
		}
		if len(a.EgressAllow) > contract.MaxEgressAllow {
			return contract.CreateRequest{}, argError("egress_allow names %d hosts; at most %d", len(a.EgressAllow), contract.MaxEgressAllow)
		}
		seen := make(map[string]bool, len(a.EgressAllow))
		for _, h := range a.EgressAllow {
			if err := contract.ValidateEgressHost(h); err != nil {
				return contract.CreateRequest{}, argError("egress_allow: %s", Truncate(err.Error(), 300))
			}
			if seen[h] {
				return contract.CreateRequest{}, argError("egress_allow names %q twice", h)
			}
			seen[h] = true
		}
		req.Network = contract.NetworkEgress
		req.EgressAllow = a.EgressAllow
	}
	if a.LifetimeSeconds != nil {
		secs := *a.LifetimeSeconds
		maxSecs := int64(cfg.MaxLifetime / time.Second)
		if secs < 1 || secs > maxSecs {
			return contract.CreateRequest{}, argError("lifetime_seconds %d is out of range: 1 to %d", secs, maxSecs)
		}
		req.Lifetime = time.Duration(secs) * time.Second
	}
	return req, nil
}

func imageAllowed(patterns []string, image string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, image); ok {
			return true
		}
	}
	return false
}

// parseMemory accepts Docker's ("512m", "1g", "1.5GB") and Kubernetes'
// ("512Mi", "1Gi") spellings, and plain bytes; both are binary multiples.
func parseMemory(s string) (int64, error) {
	v := strings.TrimSpace(s)
	for _, suffix := range []string{"Ki", "Mi", "Gi", "Ti"} {
		if strings.HasSuffix(v, suffix) {
			v = strings.TrimSuffix(v, "i")
			break
		}
	}
	n, err := units.RAMInBytes(v)
	if err != nil || n <= 0 {
		return 0, argError(`memory %q is not a size such as "512Mi", "512m" or "1g"`, Truncate(s, 40))
	}
	return n, nil
}

type execArgs struct {
	ContainerID    string            `json:"container_id"`
	Commands       []string          `json:"commands"`
	TimeoutSeconds *int64            `json:"timeout_seconds"`
	Workdir        string            `json:"workdir"`
	Env            map[string]string `json:"env"`
	// Background and YieldAfterSeconds: see process_tools.go.
	Background        bool   `json:"background"`
	YieldAfterSeconds *int64 `json:"yield_after_seconds"`
}

// yieldAfter is how long a foreground command may run before sandbox_exec
// hands back its handle; 0 means never. It applies when asked for, and by
// default (DefaultYieldAfter) when timeout_seconds asks for longer than
// that: a command with the default timeout stays on the quick foreground
// path.
func (a execArgs) yieldAfter(cfg Config) (time.Duration, error) {
	if a.YieldAfterSeconds != nil {
		secs := *a.YieldAfterSeconds
		if secs < 0 || secs > int64(cfg.MaxTimeout/time.Second) {
			return 0, argError("yield_after_seconds %d is out of range: 0 (never) to %d", secs, int64(cfg.MaxTimeout/time.Second))
		}
		return time.Duration(secs) * time.Second, nil
	}
	// By default a command yields when it may outlive a 60 s client cap:
	// one given a timeout above the yield, or any command when the
	// server's --command-timeout is above the shipped 60 s. A command with
	// the shipped default ends by 60 s and keeps the quick foreground path
	// (yielding costs a start and a wait through the helper, about 2 round
	// trips, on every command).
	switch {
	case a.TimeoutSeconds != nil && time.Duration(*a.TimeoutSeconds)*time.Second > DefaultYieldAfter:
		return DefaultYieldAfter, nil
	case a.TimeoutSeconds == nil && cfg.CommandTimeout > DefaultCommandTimeout:
		return DefaultYieldAfter, nil
	}
	return 0, nil
}

// requests validates sandbox_exec's arguments and returns one request per
// command, in order.
func (a execArgs) requests(cfg Config) ([]execio.Request, error) {
	if err := checkContainerID(a.ContainerID); err != nil {
		return nil, err
	}
	if len(a.Commands) == 0 {
		return nil, argError(`"commands" is required: a non-empty array of shell command lines, for example ["python3 -V"]`)
	}
	if len(a.Commands) > MaxCommandsPerExec {
		return nil, argError("%d commands in one call; the limit is %d", len(a.Commands), MaxCommandsPerExec)
	}
	timeout := cfg.CommandTimeout
	if a.TimeoutSeconds != nil {
		secs := *a.TimeoutSeconds
		maxSecs := int64(cfg.MaxTimeout / time.Second)
		if secs < 1 || secs > maxSecs {
			return nil, argError("timeout_seconds %d is out of range: 1 to %d", secs, maxSecs)
		}
		timeout = time.Duration(secs) * time.Second
	}
	if a.Workdir != "" {
		if err := checkSandboxPath("workdir", a.Workdir, false); err != nil {
			return nil, err
		}
		if !path.IsAbs(a.Workdir) {
			return nil, argError("workdir %q must be an absolute path in the sandbox, for example /app", Truncate(a.Workdir, 100))
		}
	}
	env := make([]string, 0, len(a.Env))
	for k, v := range a.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	reqs := make([]execio.Request, 0, len(a.Commands))
	for i, c := range a.Commands {
		if strings.TrimSpace(c) == "" {
			return nil, argError("commands[%d] is empty", i)
		}
		if len(c) > MaxCommandLength {
			return nil, argError("commands[%d] is %d bytes long; the limit is %d", i, len(c), MaxCommandLength)
		}
		req, err := execio.Request{
			Shell:            c,
			WorkingDir:       a.Workdir,
			Env:              env,
			TimeoutSeconds:   int64(timeout / time.Second),
			OutputLimitBytes: cfg.OutputLimit,
		}.Normalize()
		if err != nil {
			return nil, argError("commands[%d]: %v", i, err)
		}
		reqs = append(reqs, req)
	}
	return reqs, nil
}

type containerArgs struct {
	ContainerID string `json:"container_id"`
}

type copyProjectArgs struct {
	ContainerID string `json:"container_id"`
	LocalSrcDir string `json:"local_src_dir"`
	DestDir     string `json:"dest_dir"`
}

type copyFileArgs struct {
	ContainerID  string `json:"container_id"`
	LocalSrcFile string `json:"local_src_file"`
	DestPath     string `json:"dest_path"`
}

type writeFileArgs struct {
	ContainerID  string  `json:"container_id"`
	FileName     string  `json:"file_name"`
	FileContents *string `json:"file_contents"`
	DestDir      string  `json:"dest_dir"`
}

type copyFromSandboxArgs struct {
	ContainerID      string `json:"container_id"`
	ContainerSrcPath string `json:"container_src_path"`
	LocalDestPath    string `json:"local_dest_path"`
	// Overwrite and KeepExecBits are optional (default false): see
	// hostfs.Options.
	Overwrite    bool `json:"overwrite"`
	KeepExecBits bool `json:"keep_exec_bits"`
}

type readFileArgs struct {
	ContainerID string `json:"container_id"`
	Path        string `json:"path"`
}

// sandboxFilePath splits a sandbox file path into the directory to upload
// into and the entry name, refusing paths that name no file.
func sandboxFilePath(name, p string) (dir, base string, err error) {
	if err := checkSandboxPath(name, p, true); err != nil {
		return "", "", err
	}
	clean := path.Clean(p)
	base = path.Base(clean)
	if strings.HasSuffix(p, "/") || base == "." || base == "/" {
		return "", "", argError("%q %q must name a file, not a directory", name, Truncate(p, 200))
	}
	return path.Dir(clean), base, nil
}

// containerID makes the arguments of the tools that act on one sandbox
// sandboxArgs, so that typedTool checks the ID before the tool runs.
func (a execArgs) containerID() string            { return a.ContainerID }
func (a containerArgs) containerID() string       { return a.ContainerID }
func (a copyProjectArgs) containerID() string     { return a.ContainerID }
func (a copyFileArgs) containerID() string        { return a.ContainerID }
func (a writeFileArgs) containerID() string       { return a.ContainerID }
func (a copyFromSandboxArgs) containerID() string { return a.ContainerID }
func (a readFileArgs) containerID() string        { return a.ContainerID }
