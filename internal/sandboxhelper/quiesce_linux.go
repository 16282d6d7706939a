package sandboxhelper

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// quiesceWait bounds how long a snapshot waits for the processes it
// stopped to be stopped (a process in uninterruptible sleep, D, stops only
// when its system call returns).
const quiesceWait = 5 * time.Second

// quiesce stops every process of the sandbox the helper may signal (the
// sandbox's user; PID 1, the init, excepted) with SIGSTOP and returns once
// each is stopped or gone, so that a snapshot reads files nobody is
// writing. thaw continues them; the caller must call it on every path.
//
// Why not the cgroup freezer (Client.Pause): Docker refuses an exec into a
// paused container, and the writable paths are tmpfs mounts seen only in
// the container's mount namespace, so nothing could read them while the
// container is frozen. SIGSTOP gives the same guarantee for the files: a
// stopped process is between system calls, and a write(2) to tmpfs is not
// interrupted half way by a stop.
//
// Processes that fork while being stopped are found by scanning again
// until a scan finds nobody new: a stopped process cannot fork.
func quiesce() (thaw func(), err error) {
	self := os.Getpid()
	stopped := map[int]bool{}
	thaw = func() {
		for pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	for round := 0; ; round++ {
		found := false
		for _, pid := range listPIDs() {
			if pid == self || pid == 1 || stopped[pid] {
				continue
			}
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				continue // another user's (EPERM), or gone (ESRCH)
			}
			stopped[pid], found = true, true
		}
		if !found {
			break
		}
		if round > 1000 {
			thaw()
			return nil, errors.New("quiescing the sandbox: processes keep appearing")
		}
	}
	deadline := time.Now().Add(quiesceWait)
	for pid := range stopped {
		for {
			e, ok := readStat(pid)
			if !ok || e.state == 'T' || e.state == 't' || e.state == 'Z' || e.state == 'X' {
				break
			}
			if time.Now().After(deadline) {
				thaw()
				return nil, fmt.Errorf("quiescing the sandbox: process %d did not stop within %s (state %c)", pid, quiesceWait, e.state)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return thaw, nil
}

// thawAll continues every process of the sandbox the helper may signal: the
// backstop for a snapshot that was killed while the sandbox was stopped.
// It also continues a process the sandbox stopped itself; a snapshot cut
// off is rarer than job control in a sandbox, and a sandbox left stopped
// is worse.
func thawAll() {
	self := os.Getpid()
	for _, pid := range listPIDs() {
		if pid != self && pid != 1 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
}
