package dockerbackend

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// bootID distinguishes boots, so that a PID and start time recorded before
// a reboot are never mistaken for a process of this boot.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "0"
	}
	id := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
	if len(id) > 12 {
		id = id[:12]
	}
	return id
}

// processStart is the process's start time in clock ticks after boot
// (field 22 of /proc/PID/stat), which with the PID identifies a process.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces and parentheses; the
	// fields after it follow the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func processLiveness(pid int, start uint64) Liveness {
	got, err := processStart(pid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Dead
	case err != nil:
		return Unknown
	case got != start:
		return Dead
	}
	return Alive
}
