package dockerbackend

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// An instance ID names one run of the MCP server and is recorded on every
// container it creates (the node label). It encodes what another server
// needs to decide, without asking anyone, whether that run is still alive:
// the host, the boot, the process ID and the process's start time. A new
// server removes the containers of runs that are provably dead (same host
// and boot, and that PID is gone or now belongs to a process that started
// at another time) and leaves everything else alone, including a live
// concurrent server's containers and those of servers on other hosts or in
// other PID namespaces, which it cannot check.
const instancePrefix = "mcp:"

// Instance is a parsed instance ID.
type Instance struct {
	Host  string
	Boot  string
	PID   int
	Start uint64
}

// String is the instance ID.
func (i Instance) String() string {
	return fmt.Sprintf("%s%s:%s:%d:%d", instancePrefix, i.Host, i.Boot, i.PID, i.Start)
}

// ParseInstance parses an instance ID; ok is false for anything else.
func ParseInstance(s string) (Instance, bool) {
	if !strings.HasPrefix(s, instancePrefix) {
		return Instance{}, false
	}
	parts := strings.Split(strings.TrimPrefix(s, instancePrefix), ":")
	if len(parts) < 4 {
		return Instance{}, false
	}
	n := len(parts)
	pid, err1 := strconv.Atoi(parts[n-2])
	start, err2 := strconv.ParseUint(parts[n-1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return Instance{}, false
	}
	return Instance{Host: strings.Join(parts[:n-3], ":"), Boot: parts[n-3], PID: pid, Start: start}, true
}

// CurrentInstance describes this process.
func CurrentInstance() (Instance, error) {
	host, err := os.Hostname()
	if err != nil {
		return Instance{}, fmt.Errorf("reading the hostname: %w", err)
	}
	start, err := processStart(os.Getpid())
	if err != nil {
		return Instance{}, fmt.Errorf("reading this process's start time: %w", err)
	}
	return Instance{Host: host, Boot: bootID(), PID: os.Getpid(), Start: start}, nil
}

// Liveness is what a server can tell about another instance.
type Liveness int

const (
	// Unknown: another host, boot or PID namespace; leave it alone.
	Unknown Liveness = iota
	// Alive: the process is running.
	Alive
	// Dead: provably gone; its containers are orphans.
	Dead
)

// Check decides other's liveness as seen from i (this process).
func (i Instance) Check(other Instance) Liveness {
	if other.Host != i.Host || other.Boot != i.Boot {
		return Unknown
	}
	if other.PID == i.PID {
		if other.Start == i.Start {
			return Alive
		}
		return Dead
	}
	return processLiveness(other.PID, other.Start)
}
