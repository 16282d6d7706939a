package sandboxhelper

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

const (
	prSetChildSubreaper = 36
	// drainGrace is how long run keeps copying output after its command
	// exited once nothing moves: no byte copied and no write blocked on a
	// slow reader for that long. Background children that still hold the
	// pipes after that are abandoned: the helper exits, they are
	// re-parented to the container's init, keep running, and get EPIPE (or
	// SIGPIPE) when they next write. While output still flows (the command's
	// last writes, behind a slow exec reader) draining goes on, up to
	// drainCap, so what the command wrote before it exited is not lost.
	drainGrace = 150 * time.Millisecond
	// drainCap bounds the drain when a background child writes without
	// pause.
	drainCap = 5 * time.Second
	// killBudget bounds the kill loop; only an unkillable (D-state) process
	// can exhaust it.
	killBudget = 10 * time.Second
)

// run executes opts.argv as the leader of its own process group, copying its
// output, until it exits (its exit code), a termination signal arrives or
// the backstop deadline passes (the whole tree is killed, exit 137).
func run(opts runOptions, stdout, stderr io.Writer) int {
	// Orphans of the command re-parent to us instead of the container's
	// init, so the whole tree stays visible below our PID and can be
	// killed, however it daemonised. Some gVisor releases refuse the
	// prctl (EINVAL); orphans then go to the container's init, which reaps
	// them, and the kill finds them by the helperproto.RunIDEnv marker instead.
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	// A caught SIGPIPE turns a vanished reader into EPIPE instead of killing
	// the helper (which would orphan the tree). Unlike an ignored signal, a
	// caught one is reset to the default for the command on exec.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	prog, err := exec.LookPath(opts.argv[0])
	if err != nil {
		return execFailure(stderr, opts.argv[0], err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return report(stderr, fmt.Errorf("creating the stdout pipe: %w", err))
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return report(stderr, fmt.Errorf("creating the stderr pipe: %w", err))
	}
	proc, err := os.StartProcess(prog, opts.argv, &os.ProcAttr{
		Env:   markedEnv(opts.id),
		Files: []*os.File{os.Stdin, outW, errW},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	outW.Close()
	errW.Close()
	if err != nil {
		return execFailure(stderr, opts.argv[0], err)
	}
	child := proc.Pid

	copied := make(chan struct{}, 2)
	var flow copyProgress
	go copyStream(outR, stdout, &flow, copied)
	go copyStream(errR, stderr, &flow, copied)

	var backstop <-chan time.Time
	if opts.backstop > 0 {
		backstop = time.After(time.Duration(opts.backstop) * time.Second)
	}
	var (
		status   syscall.WaitStatus
		exited   bool
		drain    <-chan time.Time
		draining = 2
		exitedAt time.Time
		seen     int64
	)
	for {
		select {
		case <-sigchld:
			if reap(child, &status) && !exited {
				exited = true
				if draining == 0 {
					return exitCode(status)
				}
				exitedAt, seen = time.Now(), flow.bytes.Load()
				drain = time.After(drainGrace)
			}
		case <-copied:
			if draining--; draining == 0 && exited {
				return exitCode(status)
			}
		case <-drain:
			if now := flow.bytes.Load(); (now != seen || flow.writing.Load() > 0) && time.Since(exitedAt) < drainCap {
				seen = now
				drain = time.After(drainGrace)
				continue
			}
			return exitCode(status)
		case <-term:
			killTree(child, opts.id)
			return helperproto.ExitKilled
		case <-backstop:
			killTree(child, opts.id)
			_, _ = io.WriteString(stderr, "\ncode-sandbox-helper: the backstop deadline of "+strconv.FormatInt(opts.backstop, 10)+"s passed; the process tree was killed\n")
			return helperproto.ExitKilled
		}
	}
}

// copyProgress tells the drain whether output still moves.
type copyProgress struct {
	bytes   atomic.Int64 // copied so far, both streams
	writing atomic.Int32 // writes under way (possibly blocked on a slow reader)
}

// copyStream copies a command's pipe to ours. When our side fails (the
// exec's reader went away) it keeps reading and discarding, so the command
// never blocks on a full pipe.
func copyStream(src *os.File, dst io.Writer, flow *copyProgress, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	buf := make([]byte, 32<<10)
	broken := false
	for {
		n, err := src.Read(buf)
		if n > 0 && !broken {
			flow.writing.Add(1)
			_, werr := dst.Write(buf[:n])
			flow.writing.Add(-1)
			flow.bytes.Add(int64(n))
			if werr != nil {
				broken = true
			}
		}
		if err != nil {
			return
		}
	}
}

// reap collects every exited child (orphans included, so none stays a
// zombie) and reports whether main was among them.
func reap(main int, status *syscall.WaitStatus) bool {
	found := false
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return found
		}
		if pid == main {
			*status, found = ws, true
		}
	}
}

// markedEnv is our environment for the command, with helperproto.RunIDEnv set to id.
// Every descendant inherits it unless it scrubs its environment, which is
// how the tree is found where there is no subreaper.
func markedEnv(id string) []string {
	env := []string{helperproto.RunIDEnv + "=" + id}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, helperproto.RunIDEnv+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// killTree SIGKILLs the command's tree until none of it is left: every
// descendant of ours, and every process carrying our helperproto.RunIDEnv marker.
// Killing a parent re-parents its children to us (or, without a subreaper,
// to init, where the marker still finds them), so a process forked between
// a scan and the kill is found by the next scan. It ends when a scan finds
// nothing alive and we have no child left to reap.
func killTree(child int, id string) {
	_ = syscall.Kill(-child, syscall.SIGKILL) // the command's group, at once
	self := os.Getpid()
	deadline := time.Now().Add(killBudget)
	for pause := time.Millisecond; time.Now().Before(deadline); {
		victims := 0
		for _, p := range treeMembers(self, id) {
			if p.state != 'Z' && p.state != 'X' {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				victims++
			}
		}
		childless := false
		var ws syscall.WaitStatus
		for {
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			childless = errors.Is(err, syscall.ECHILD)
			if err != nil || pid <= 0 {
				break
			}
		}
		if victims == 0 && childless {
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// execFailure reports a command that could not be started, with the shell's
// exit codes: 127 when it does not exist, 126 when it cannot be executed.
func execFailure(stderr io.Writer, name string, err error) int {
	code := helperproto.ExitCannotExecute
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		code = helperproto.ExitCommandNotFound
	}
	report(stderr, fmt.Errorf("cannot execute %q: %w", name, err))
	return code
}
