//go:build !linux

package dockerbackend

import (
	"os"
	"syscall"
)

// Without /proc there is no boot ID or start time to record; a PID that no
// longer exists is still proof of death, and a PID that exists is assumed
// to be the server (the safe direction: its containers stay).
func bootID() string { return "0" }

func processStart(int) (uint64, error) { return 0, nil }

func processLiveness(pid int, _ uint64) Liveness {
	p, err := os.FindProcess(pid)
	if err != nil {
		return Dead
	}
	if err := p.Signal(syscall.Signal(0)); err != nil {
		if err == os.ErrProcessDone {
			return Dead
		}
		return Unknown
	}
	return Alive
}
