package dockerruntime

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/go-units"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
)

// PullPolicy says when an image is pulled.
type PullPolicy string

const (
	PullIfNotPresent PullPolicy = "IfNotPresent"
	PullAlways       PullPolicy = "Always"
	PullNever        PullPolicy = "Never"
)

// Network modes a sandbox may ask for. There is deliberately no "host", and
// egress sandboxes do not use Docker's default bridge: they get the
// dedicated network of internal/egress (no inter-container traffic, and a
// firewall that lets them reach public addresses only).
const (
	NetworkNone   = "none"
	NetworkEgress = egress.NetworkName
	// NetworkEgressPolicy is the network of the sandboxes with an egress
	// policy: the firewall sends everything on it to the node's egress
	// proxy (or drops it) from the container's first packet, so that the
	// sandbox is never unrestricted before its policy is set.
	NetworkEgressPolicy = egress.PolicyNetworkName
)

// isEgress reports whether network mode n reaches the egress bridges.
func isEgress(n string) bool { return n == NetworkEgress || n == NetworkEgressPolicy }

// Docker runtime names.
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc"
)

// Defaults that apply when a Spec leaves a limit at zero. They are the
// Sandbox's defaults (api/v1alpha1/defaults.go, which this package may not
// import; defaults_test.go holds them equal) so that the MCP server's Docker
// backend and the operator produce identical containers.
const (
	DefaultNanoCPUs    int64 = 1_000_000_000
	DefaultMemoryBytes int64 = 512 << 20
	DefaultPids        int64 = 256
	DefaultDiskBytes   int64 = 256 << 20
	DefaultWorkingDir        = "/app"
	DefaultUser              = "65534:65534"
	// DefaultStopGracePeriod is sandboxv1alpha1.DefaultStopGracePeriod.
	DefaultStopGracePeriod = 10 * time.Second
	// DefaultNoFile bounds open file descriptors.
	DefaultNoFile int64 = 1024
	// LogMaxSize caps the json-file log so a chatty sandbox cannot fill the
	// node's disk through its own stdout.
	LogMaxSize = "10m"
)

// Owner identifies what a container belongs to. For the operator it is the
// Sandbox; the UID is the ownership key.
type Owner struct {
	// ManagedBy is the value of LabelManagedBy; empty means the client's
	// (ManagedByValue unless the client was built for another owner).
	ManagedBy string
	UID       string
	Namespace string
	Name      string
	Node      string
}

// Spec is everything needed to create a hardened sandbox container. It is
// deliberately narrow: there is no way to express privileges, binds, devices,
// host namespaces or extra capabilities.
type Spec struct {
	Owner      Owner
	Image      string
	PullPolicy PullPolicy
	// Command replaces the image's entrypoint and command. Empty means "stay
	// up": the manager's idle process runs instead.
	Command    []string
	Env        []string
	WorkingDir string
	User       string

	NanoCPUs    int64
	MemoryBytes int64
	Pids        int64
	DiskBytes   int64

	// Network is NetworkNone or NetworkEgress.
	Network string
	// Runtime is RuntimeRunc or RuntimeRunsc.
	Runtime string
	// StopGracePeriod is how long Docker waits after SIGTERM before SIGKILL;
	// zero means DefaultStopGracePeriod.
	StopGracePeriod time.Duration
}

// withDefaults returns a copy of s with every zero limit set to its default.
func (s Spec) withDefaults() Spec {
	if s.PullPolicy == "" {
		s.PullPolicy = PullIfNotPresent
	}
	if s.WorkingDir == "" {
		s.WorkingDir = DefaultWorkingDir
	}
	if s.User == "" {
		s.User = DefaultUser
	}
	if s.NanoCPUs == 0 {
		s.NanoCPUs = DefaultNanoCPUs
	}
	if s.MemoryBytes == 0 {
		s.MemoryBytes = DefaultMemoryBytes
	}
	if s.Pids == 0 {
		s.Pids = DefaultPids
	}
	if s.DiskBytes == 0 {
		s.DiskBytes = DefaultDiskBytes
	}
	if s.Network == "" {
		s.Network = NetworkNone
	}
	if s.Runtime == "" {
		s.Runtime = RuntimeRunc
	}
	if s.StopGracePeriod == 0 {
		s.StopGracePeriod = DefaultStopGracePeriod
	}
	return s
}

// ErrInvalidSpec wraps every validation failure of a Spec.
var ErrInvalidSpec = errors.New("invalid sandbox spec")

// reservedPaths may not be the working directory: they are either the
// sandbox's other writable mounts or kernel interfaces.
var reservedPaths = []string{"/", "/proc", "/sys", "/dev", "/etc", "/tmp", "/var/tmp", "/dev/shm", toolsMountPath}

func (s Spec) validate() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))
	}
	if s.Owner.UID == "" {
		return invalid("owner UID is empty")
	}
	if strings.TrimSpace(s.Image) == "" {
		return invalid("image is empty")
	}
	switch s.PullPolicy {
	case PullIfNotPresent, PullAlways, PullNever:
	default:
		return invalid("unknown pull policy %q", s.PullPolicy)
	}
	if !path.IsAbs(s.WorkingDir) || path.Clean(s.WorkingDir) != s.WorkingDir {
		return invalid("workingDir %q must be a clean absolute path", s.WorkingDir)
	}
	for _, reserved := range reservedPaths {
		if s.WorkingDir == reserved {
			return invalid("workingDir %q is reserved", s.WorkingDir)
		}
	}
	for _, prefix := range []string{"/proc/", "/sys/", "/dev/", toolsMountPath + "/"} {
		if strings.HasPrefix(s.WorkingDir, prefix) {
			return invalid("workingDir %q is under reserved %s", s.WorkingDir, prefix)
		}
	}
	uid, _, err := parseUser(s.User)
	if err != nil {
		return invalid("%v", err)
	}
	if uid == 0 {
		return invalid("user %q is root; sandboxes never run as root", s.User)
	}
	if s.NanoCPUs < 0 || s.MemoryBytes < 0 || s.Pids < 0 || s.DiskBytes < 0 {
		return invalid("resource limits must not be negative")
	}
	if s.MemoryBytes < 6<<20 {
		return invalid("memory %d is below Docker's 6MiB minimum", s.MemoryBytes)
	}
	switch s.Network {
	case NetworkNone, NetworkEgress, NetworkEgressPolicy:
	default:
		return invalid("network mode %q is not allowed (%s, %s or %s)", s.Network, NetworkNone, NetworkEgress, NetworkEgressPolicy)
	}
	switch s.Runtime {
	case RuntimeRunc, RuntimeRunsc:
	default:
		return invalid("runtime %q is not allowed (runc or runsc)", s.Runtime)
	}
	for _, kv := range s.Env {
		if !strings.Contains(kv, "=") || strings.HasPrefix(kv, "=") {
			return invalid("environment entry %q is not NAME=value", kv)
		}
	}
	return nil
}

// parseUser parses "uid" or "uid:gid". Names are refused because they would
// be resolved inside an untrusted image.
func parseUser(user string) (uid, gid uint32, err error) {
	uidPart, gidPart, hasGID := strings.Cut(user, ":")
	u, err := strconv.ParseUint(uidPart, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q must be a numeric uid[:gid]", user)
	}
	g := u
	if hasGID {
		g, err = strconv.ParseUint(gidPart, 10, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("user %q must be a numeric uid[:gid]", user)
		}
	}
	return uint32(u), uint32(g), nil
}

// Labels returns the ownership labels for a container.
func (o Owner) Labels() map[string]string {
	managedBy := o.ManagedBy
	if managedBy == "" {
		managedBy = ManagedByValue
	}
	return map[string]string{
		LabelManagedBy:  managedBy,
		LabelSandboxUID: o.UID,
		LabelNamespace:  o.Namespace,
		LabelName:       o.Name,
		LabelNode:       o.Node,
	}
}

// Hostname is the hostname of a sandbox container: its owner's name when
// that is a DNS label (RFC 1123, at most 63 characters), else the name made
// into one (lower case, anything else turned into "-", cut at 63), else
// "sandbox-" and the first 12 characters of its UID. Every sandbox had the
// hostname "sandbox" before; a fork's children, and any two sandboxes, now
// tell themselves apart as their names do. Only the name is used, never
// the namespace, which the sandbox has no need to learn.
func Hostname(o Owner) string {
	if h := dnsLabel(o.Name); h != "" {
		return h
	}
	uid := o.UID
	if len(uid) > 12 {
		uid = uid[:12]
	}
	return dnsLabel("sandbox-" + uid)
}

// dnsLabel makes s into an RFC 1123 label, or "" if nothing is left.
func dnsLabel(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	h := b.String()
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.Trim(h, "-")
}

// BuildContainerConfig turns a Spec into Docker's create request. It is pure
// so that the hardening can be unit tested field by field; the integration
// tests inspect real containers for the same fields.
func BuildContainerConfig(spec Spec) (*container.Config, *container.HostConfig, error) {
	s := spec.withDefaults()
	if err := s.validate(); err != nil {
		return nil, nil, err
	}
	uid, gid, _ := parseUser(s.User)

	env := make([]string, 0, len(s.Env)+1)
	hasHome := false
	for _, kv := range s.Env {
		if strings.HasPrefix(kv, "HOME=") {
			hasHome = true
		}
		env = append(env, kv)
	}
	if !hasHome {
		// The default user's home (/nonexistent) is not writable; tools such
		// as pip need a writable HOME.
		env = append(env, "HOME="+s.WorkingDir)
	}

	stopTimeout := int(s.StopGracePeriod.Round(time.Second) / time.Second)
	cfg := &container.Config{
		Image:       s.Image,
		User:        s.User,
		Env:         env,
		WorkingDir:  s.WorkingDir,
		Labels:      s.Owner.Labels(),
		Hostname:    Hostname(s.Owner),
		StopTimeout: &stopTimeout,
	}
	// The tools volume is always mounted: the helper in it runs every
	// command and file transfer, whatever the entrypoint.
	mounts := []mount.Mount{toolsMount()}
	if len(s.Command) > 0 {
		cfg.Entrypoint = s.Command[:1]
		cfg.Cmd = s.Command[1:]
		if len(cfg.Cmd) == 0 {
			// An empty (non-nil) Cmd stops Docker from appending the
			// image's CMD to our entrypoint.
			cfg.Cmd = []string{}
		}
	} else {
		cfg.Entrypoint = []string{IdleProcessPath}
		cfg.Cmd = []string{}
	}

	diskBytes := s.DiskBytes
	tmpfsOptions := func(mode string, owner bool) string {
		// Docker mounts tmpfs noexec unless told otherwise; sandboxes compile
		// and run programs in their scratch space.
		opts := fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=%s", diskBytes, mode)
		if owner {
			opts += fmt.Sprintf(",uid=%d,gid=%d", uid, gid)
		}
		return opts
	}
	pids := s.Pids
	init := true
	var sysctls map[string]string
	if isEgress(s.Network) {
		sysctls = egress.SandboxSysctls()
	}
	hostCfg := &container.HostConfig{
		Sysctls:        sysctls,
		Privileged:     false,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		ReadonlyRootfs: true,
		Tmpfs: map[string]string{
			s.WorkingDir: tmpfsOptions("0755", true),
			"/tmp":       tmpfsOptions("1777", false),
			"/var/tmp":   tmpfsOptions("1777", false),
		},
		ShmSize:       diskBytes,
		NetworkMode:   container.NetworkMode(s.Network),
		IpcMode:       "private",
		CgroupnsMode:  container.CgroupnsModePrivate,
		Init:          &init,
		Runtime:       s.Runtime,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		AutoRemove:    false,
		Mounts:        mounts,
		LogConfig: container.LogConfig{
			Type:   "json-file",
			Config: map[string]string{"max-size": LogMaxSize, "max-file": "1"},
		},
		Resources: container.Resources{
			NanoCPUs:   s.NanoCPUs,
			Memory:     s.MemoryBytes,
			MemorySwap: s.MemoryBytes,
			PidsLimit:  &pids,
			Ulimits: []*container.Ulimit{
				{Name: "nofile", Soft: DefaultNoFile, Hard: DefaultNoFile},
				{Name: "core", Soft: 0, Hard: 0},
				// One file may not outgrow the disk budget; a little headroom
				// makes a full tmpfs answer ENOSPC rather than SIGXFSZ.
				{Name: "fsize", Soft: diskBytes + 1<<20, Hard: diskBytes + 1<<20},
			},
		},
	}
	return cfg, hostCfg, nil
}

// FormatBytes renders a byte count for messages.
func FormatBytes(n int64) string { return units.BytesSize(float64(n)) }
