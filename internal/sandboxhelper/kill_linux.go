package sandboxhelper

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"strconv"
	"syscall"
	"time"
)

// killWait bounds how long kill waits for the runs it signalled to finish
// killing their trees and exit.
const killWait = 5 * time.Second

// kill sends SIGTERM to every `run --id=id` helper of our user and waits
// until they are gone. It succeeds when there is none: the run may have
// finished already.
func kill(id string) error {
	self := os.Getpid()
	targets := findRuns(id, self)
	for _, pid := range targets {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(killWait)
	for len(targets) > 0 {
		alive := targets[:0]
		for _, pid := range targets {
			if isRun(pid, id) {
				alive = append(alive, pid)
			}
		}
		targets = alive
		if len(targets) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("run %s (pids %v) is still running %s after SIGTERM", id, targets, killWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func findRuns(id string, self int) []int {
	var out []int
	for _, pid := range listPIDs() {
		if pid != self && isRun(pid, id) {
			out = append(out, pid)
		}
	}
	return out
}

// isRun reports whether pid is a live helper `run --id=id` of our user. A
// zombie counts as gone: it has already killed its tree.
func isRun(pid int, id string) bool {
	dir := "/proc/" + strconv.Itoa(pid)
	// The owner of /proc/PID is root for a non-dumpable process (every
	// helper since it hides its frames), so the real uid comes from status.
	if uid, ok := procUID(dir); !ok || uid != os.Getuid() {
		return false
	}
	if e, ok := readStat(pid); !ok || e.state == 'Z' || e.state == 'X' {
		return false
	}
	cmdline, err := os.ReadFile(dir + "/cmdline")
	if err != nil {
		return false
	}
	args := bytes.Split(bytes.TrimSuffix(cmdline, []byte{0}), []byte{0})
	if len(args) < 3 || string(args[1]) != "run" {
		return false
	}
	if base := path.Base(string(args[0])); base != "helper" && base != "code-sandbox-helper" {
		return false
	}
	for _, arg := range args[2:] {
		if string(arg) == "--" {
			return false
		}
		if string(arg) == "--id="+id {
			return true
		}
	}
	return false
}

// procUID is the real uid of the process whose /proc directory is dir.
func procUID(dir string) (int, bool) {
	data, err := os.ReadFile(dir + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		if rest, ok := bytes.CutPrefix(line, []byte("Uid:")); ok {
			fields := bytes.Fields(rest)
			if len(fields) == 0 {
				return 0, false
			}
			uid, err := strconv.Atoi(string(fields[0]))
			return uid, err == nil
		}
	}
	return 0, false
}
