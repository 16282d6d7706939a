package sandboxhelper

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// Background processes: see helperproto/proc.go for the layout and the
// limits. A handle's directory holds
//
//	meta    the command and its start (ProcMeta), written by `proc start`
//	pid     the supervisor's PID, written by the supervisor when it is up
//	stdout  the stdout ring, stderr the stderr ring (helperproto.RingHeader)
//	stdin   a fifo the supervisor reads stdin frames from
//	exit    the exit (ProcExit), written by the supervisor, by rename
//	killed  present once `proc kill` was asked to kill it while it ran
//
// The supervisor (`proc supervise`) runs the command under `helper run
// --id=bg-HANDLE`, in a session of its own and detached from the exec that
// started it, so nothing the manager does to its exec streams reaches it;
// `proc kill` reuses `helper kill` on that run, which kills the whole tree.

const (
	// procStartWait bounds how long start waits for its supervisor to
	// come up.
	procStartWait = 10 * time.Second
	// procKillWait bounds how long kill waits for the exit to be recorded
	// after the tree is gone.
	procKillWait = 5 * time.Second
	// maxProcMeta bounds the meta file read back (argv is bounded by
	// execio.MaxArgBytes upstream).
	maxProcMeta = 4 << 20
	// maxProcEntries bounds how many directories list looks at (the
	// sandbox may plant more).
	maxProcEntries = 4 * helperproto.MaxProcs
)

type procFlags struct {
	dir          string
	id           string
	stdoutOffset int64
	stderrOffset int64
	maxBytes     int64
	timeout      time.Duration
	eof          bool
	backstop     int64 // seconds; 0 means none
	argv         []string
}

func parseProc(sub string, args []string) (procFlags, error) {
	f := procFlags{dir: helperproto.ProcDir, maxBytes: helperproto.RingBytes}
	for i, arg := range args {
		if arg == "--" {
			f.argv = args[i+1:]
			break
		}
		key, value, _ := strings.Cut(arg, "=")
		var err error
		switch key {
		case "--dir":
			f.dir = value
		case "--id":
			f.id = value
		case "--stdout-offset":
			f.stdoutOffset, err = strconv.ParseInt(value, 10, 64)
		case "--stderr-offset":
			f.stderrOffset, err = strconv.ParseInt(value, 10, 64)
		case "--max-bytes":
			f.maxBytes, err = strconv.ParseInt(value, 10, 64)
		case "--timeout-ms":
			var ms int64
			ms, err = strconv.ParseInt(value, 10, 64)
			f.timeout = time.Duration(ms) * time.Millisecond
		case "--eof":
			f.eof = true
		case "--backstop":
			f.backstop, err = strconv.ParseInt(value, 10, 64)
			if err == nil && f.backstop < 0 {
				err = errors.New("negative")
			}
		default:
			return f, fmt.Errorf("proc %s: unknown flag %q", sub, arg)
		}
		if err != nil {
			return f, fmt.Errorf("proc %s: %s is not a number", sub, arg)
		}
	}
	if f.maxBytes <= 0 || f.maxBytes > helperproto.RingBytes {
		f.maxBytes = helperproto.RingBytes
	}
	switch {
	case !filepath.IsAbs(f.dir):
		return f, fmt.Errorf("proc %s: --dir=%q is not absolute", sub, f.dir)
	case sub != "list" && !validHandle(f.id):
		return f, &helperproto.Error{Kind: helperproto.KindNoSuchProcess,
			Message: fmt.Sprintf("proc %s: %q is not a handle ([A-Za-z0-9_-], at most %d characters)", sub, f.id, 64-len(helperproto.ProcRunIDPrefix))}
	case (sub == "start" || sub == "supervise") && len(f.argv) == 0:
		return f, fmt.Errorf("proc %s needs a command after --", sub)
	case sub != "start" && sub != "supervise" && len(f.argv) > 0:
		return f, fmt.Errorf("proc %s takes no command", sub)
	case f.stdoutOffset < 0 || f.stderrOffset < 0:
		return f, fmt.Errorf("proc %s: negative offset", sub)
	case f.timeout < 0 || f.timeout > helperproto.MaxProcWait:
		return f, fmt.Errorf("proc %s: --timeout-ms must be between 0 and %d", sub, helperproto.MaxProcWait.Milliseconds())
	}
	return f, nil
}

// validHandle is validID for the handle, leaving room for the run ID's
// prefix.
func validHandle(h string) bool {
	return validID(h) && len(h)+len(helperproto.ProcRunIDPrefix) <= 64
}

// procMain runs `proc SUB FLAGS [-- ARGV]`.
func procMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usageError(stderr, errors.New("proc needs a subcommand"))
	}
	sub := args[0]
	f, err := parseProc(sub, args[1:])
	if err != nil {
		var he *helperproto.Error
		if errors.As(err, &he) {
			return report(stderr, err)
		}
		return usageError(stderr, err)
	}
	var out any
	switch sub {
	case "start":
		out, err = procStart(f)
	case "supervise":
		return procSupervise(f)
	case "list":
		out, err = procList(f.dir)
	case "poll":
		out, err = procPoll(f)
	case "wait":
		out, err = procWait(f)
	case "kill":
		out, err = procKill(f)
	case "stdin":
		out, err = procStdin(f, stdin)
	default:
		return usageError(stderr, fmt.Errorf("unknown proc subcommand %q", sub))
	}
	if err != nil {
		return report(stderr, err)
	}
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		return report(stderr, err)
	}
	return 0
}

func noSuchProcess(id string) error {
	return &helperproto.Error{Kind: helperproto.KindNoSuchProcess, Message: fmt.Sprintf("no background process %q in this sandbox", id)}
}

// procStart creates the handle's directory and starts its supervisor.
func procStart(f procFlags) (*execio.ProcessStatus, error) {
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", f.dir, err)
	}
	unlock, err := lockFile(filepath.Join(f.dir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := makeRoom(f.dir); err != nil {
		return nil, err
	}
	dir := filepath.Join(f.dir, f.id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("handle %q is already in use", f.id)
		}
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	cleanup := func(err error) (*execio.ProcessStatus, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "stdin"), 0o600); err != nil {
		return cleanup(fmt.Errorf("creating the stdin fifo: %w", err))
	}
	for _, stream := range []string{"stdout", "stderr"} {
		if err := os.WriteFile(filepath.Join(dir, stream), make([]byte, helperproto.RingHeader), 0o600); err != nil {
			return cleanup(fmt.Errorf("creating the %s ring: %w", stream, err))
		}
	}
	meta, _ := json.Marshal(helperproto.ProcMeta{Command: f.argv, StartedAt: time.Now().UTC()})
	if err := os.WriteFile(filepath.Join(dir, "meta"), meta, 0o600); err != nil {
		return cleanup(fmt.Errorf("writing the process's metadata: %w", err))
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return cleanup(err)
	}
	defer devNull.Close()
	var env []string
	for _, kv := range os.Environ() {
		// Not part of the run that started us: a kill of that run must
		// not find the background process by its marker.
		if !strings.HasPrefix(kv, helperproto.RunIDEnv+"=") {
			env = append(env, kv)
		}
	}
	args := append([]string{os.Args[0], "proc", "supervise", "--dir=" + f.dir, "--id=" + f.id, "--backstop=" + strconv.FormatInt(f.backstop, 10), "--"}, f.argv...)
	p, err := os.StartProcess("/proc/self/exe", args, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{devNull, devNull, devNull},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return cleanup(fmt.Errorf("starting the supervisor: %w", err))
	}
	// The supervisor runs on; the `helper run` above us (a subreaper) and
	// then the container's init reap it.
	_ = p.Release()
	deadline := time.Now().Add(procStartWait)
	for {
		st, err := procStatus(f.dir, f.id)
		if err != nil {
			return nil, err
		}
		if st.State != execio.ProcessRunning || fileExists(filepath.Join(dir, "pid")) {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("the supervisor of %q did not come up within %s", f.id, procStartWait)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// makeRoom removes the oldest finished handles until one more fits, or
// fails when MaxProcs are running.
func makeRoom(root string) error {
	all, err := procList(root)
	if err != nil {
		return err
	}
	var finished []execio.ProcessStatus
	for _, st := range all {
		if st.State != execio.ProcessRunning {
			finished = append(finished, st)
		}
	}
	slices.SortFunc(finished, func(a, b execio.ProcessStatus) int { return endOf(a).Compare(endOf(b)) })
	for n := len(all); n >= helperproto.MaxProcs; n-- {
		if len(finished) == 0 {
			return &helperproto.Error{Kind: helperproto.KindTooManyProcesses, Message: fmt.Sprintf(
				"this sandbox already runs %d background processes, its limit; kill one (or wait for one to end) first", len(all))}
		}
		_ = os.RemoveAll(filepath.Join(root, finished[0].Handle))
		finished = finished[1:]
	}
	return nil
}

func endOf(st execio.ProcessStatus) time.Time {
	if st.EndedAt != nil {
		return *st.EndedAt
	}
	return st.StartedAt
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func lockFile(p string) (func(), error) {
	fd, err := syscall.Open(p, syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", p, err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("locking %s: %w", p, err)
	}
	return func() { syscall.Close(fd) }, nil
}

// procSupervise runs the command under `helper run`, copies its output into
// the rings, feeds it the stdin frames, and records its exit.
func procSupervise(f procFlags) int {
	dir := filepath.Join(f.dir, f.id)
	// Caught, not ignored, so the command gets the default dispositions.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE, syscall.SIGHUP)
	code := superviseRun(dir, f)
	exit, _ := json.Marshal(helperproto.ProcExit{Code: code, EndedAt: time.Now().UTC()})
	tmp := filepath.Join(dir, ".exit")
	if os.WriteFile(tmp, exit, 0o600) == nil {
		_ = os.Rename(tmp, filepath.Join(dir, "exit"))
	}
	return 0
}

func superviseRun(dir string, f procFlags) int {
	failed := func(err error) int {
		if r, rerr := openRing(filepath.Join(dir, "stderr")); rerr == nil {
			line, _ := json.Marshal(classify(err))
			_, _ = r.Write([]byte(helperproto.ErrorPrefix + string(line) + "\n"))
			r.f.Close()
		}
		return helperproto.ExitOther
	}
	outRing, err := openRing(filepath.Join(dir, "stdout"))
	if err != nil {
		return failed(err)
	}
	errRing, err := openRing(filepath.Join(dir, "stderr"))
	if err != nil {
		return failed(err)
	}
	// O_RDWR: the fifo never reports EOF when a writer leaves.
	fifo, err := os.OpenFile(filepath.Join(dir, "stdin"), os.O_RDWR, 0)
	if err != nil {
		return failed(fmt.Errorf("opening the stdin fifo: %w", err))
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return failed(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return failed(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return failed(err)
	}
	args := append([]string{os.Args[0], "run", "--id=" + helperproto.ProcRunIDPrefix + f.id, "--backstop=" + strconv.FormatInt(f.backstop, 10), "--"}, f.argv...)
	proc, err := os.StartProcess("/proc/self/exe", args, &os.ProcAttr{Files: []*os.File{inR, outW, errW}})
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		return failed(fmt.Errorf("starting the runner: %w", err))
	}
	_ = os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	go feedStdin(fifo, inW, dir)
	copied := make(chan struct{}, 2)
	var flow copyProgress
	go copyStream(outR, outRing, &flow, copied)
	go copyStream(errR, errRing, &flow, copied)
	st, err := proc.Wait()
	// The runner's pipes are its own; they end with it.
	<-copied
	<-copied
	if err != nil || st == nil {
		return helperproto.ExitOther
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok {
		return exitCode(ws)
	}
	return st.ExitCode()
}

// feedStdin copies stdin frames from the fifo to the command until a close
// frame (or a malformed frame: a writer killed mid-frame) closes its stdin.
func feedStdin(fifo *os.File, w *os.File, dir string) {
	defer func() {
		w.Close()
		_ = os.WriteFile(filepath.Join(dir, "stdin-closed"), nil, 0o600)
		// Keep the fifo drained so a late writer does not block forever.
		_, _ = io.Copy(io.Discard, fifo)
	}()
	for {
		kind, payload, err := helperproto.ReadFrame(fifo, helperproto.MaxStdinWrite)
		if err != nil || kind != helperproto.FrameStdinData {
			return
		}
		if _, err := w.Write(payload); err != nil {
			return
		}
	}
}

// ring writes a stream into its ring file.
type ring struct {
	f     *os.File
	total int64
}

func openRing(p string) (*ring, error) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the ring %s: %w", p, err)
	}
	return &ring{f: f}, nil
}

// Write keeps the last RingBytes. A full tmpfs loses output but never
// blocks the command.
func (r *ring) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > helperproto.RingBytes {
		r.total += int64(len(p) - helperproto.RingBytes)
		p = p[len(p)-helperproto.RingBytes:]
	}
	for len(p) > 0 {
		pos := r.total % helperproto.RingBytes
		k := min(int64(len(p)), helperproto.RingBytes-pos)
		_, _ = r.f.WriteAt(p[:k], helperproto.RingHeader+pos)
		r.total += k
		p = p[k:]
	}
	var hdr [helperproto.RingHeader]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(r.total))
	_, _ = r.f.WriteAt(hdr[:], 0)
	return n, nil
}

// readRing reads up to limit bytes of a ring from offset.
func readRing(p string, offset, limit int64) (execio.StreamChunk, error) {
	f, err := os.Open(p)
	if err != nil {
		return execio.StreamChunk{}, fmt.Errorf("opening the ring: %w", err)
	}
	defer f.Close()
	total := func() (int64, error) {
		var hdr [helperproto.RingHeader]byte
		if _, err := f.ReadAt(hdr[:], 0); err != nil {
			return 0, fmt.Errorf("reading the ring's header: %w", err)
		}
		t := helperproto.RingTotal(hdr[:])
		if t < 0 {
			return 0, errors.New("the ring's header is corrupt")
		}
		return t, nil
	}
	t1, err := total()
	if err != nil {
		return execio.StreamChunk{}, err
	}
	offset = min(offset, t1)
	start := max(offset, t1-helperproto.RingBytes)
	end := min(t1, start+limit)
	data := make([]byte, end-start)
	for got := int64(0); got < int64(len(data)); {
		pos := (start + got) % helperproto.RingBytes
		k := min(int64(len(data))-got, helperproto.RingBytes-pos)
		if _, err := f.ReadAt(data[got:got+k], helperproto.RingHeader+pos); err != nil {
			return execio.StreamChunk{}, fmt.Errorf("reading the ring: %w", err)
		}
		got += k
	}
	// Output written while we read may have overwritten the oldest bytes.
	t2, err := total()
	if err != nil {
		return execio.StreamChunk{}, err
	}
	if lost := t2 - helperproto.RingBytes - start; lost > 0 {
		lost = min(lost, int64(len(data)))
		data = data[lost:]
		start += lost
	}
	return execio.StreamChunk{Offset: start, Data: data, Next: start + int64(len(data)), Dropped: start - offset}, nil
}

// procStatus reads one handle's state.
func procStatus(root, id string) (*execio.ProcessStatus, error) {
	dir := filepath.Join(root, id)
	metaData, err := readBounded(filepath.Join(dir, "meta"), maxProcMeta)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, noSuchProcess(id)
		}
		return nil, err
	}
	var meta helperproto.ProcMeta
	if err := json.Unmarshal(metaData, &meta); err != nil {
		return nil, fmt.Errorf("the metadata of %q is corrupt: %w", id, err)
	}
	st := &execio.ProcessStatus{Handle: id, Command: meta.Command, StartedAt: meta.StartedAt, State: execio.ProcessRunning,
		Killed: fileExists(filepath.Join(dir, "killed"))}
	if data, err := readBounded(filepath.Join(dir, "exit"), 4<<10); err == nil {
		var exit helperproto.ProcExit
		if json.Unmarshal(data, &exit) == nil {
			st.State, st.ExitCode, st.EndedAt = execio.ProcessExited, &exit.Code, &exit.EndedAt
		}
	}
	if st.State == execio.ProcessRunning {
		if pid, ok := readPID(filepath.Join(dir, "pid")); ok && !isSupervisor(pid, id) {
			// Re-read: it may have recorded its exit just now.
			if _, err := os.Lstat(filepath.Join(dir, "exit")); err == nil {
				return procStatus(root, id)
			}
			st.State = execio.ProcessLost
		}
	}
	for _, s := range []struct {
		name string
		dst  *int64
	}{{"stdout", &st.StdoutBytes}, {"stderr", &st.StderrBytes}} {
		if c, err := readRing(filepath.Join(dir, s.name), 1<<62, 0); err == nil {
			*s.dst = c.Next
		}
	}
	return st, nil
}

func readBounded(p string, max int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is over %d bytes", p, max)
	}
	return data, nil
}

func readPID(p string) (int, bool) {
	data, err := readBounded(p, 32)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid, err == nil && pid > 0
}

// isSupervisor reports whether pid is a live `helper proc supervise
// --id=id` of our user.
func isSupervisor(pid int, id string) bool {
	dir := "/proc/" + strconv.Itoa(pid)
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
	if len(args) < 4 || string(args[1]) != "proc" || string(args[2]) != "supervise" {
		return false
	}
	for _, arg := range args[3:] {
		if string(arg) == "--" {
			return false
		}
		if string(arg) == "--id="+id {
			return true
		}
	}
	return false
}

// procList reports every handle, oldest first.
func procList(root string) ([]execio.ProcessStatus, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return []execio.ProcessStatus{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", root, err)
	}
	out := []execio.ProcessStatus{}
	for _, e := range entries {
		if len(out) >= maxProcEntries {
			break
		}
		if !e.IsDir() || !validHandle(e.Name()) {
			continue
		}
		if st, err := procStatus(root, e.Name()); err == nil {
			out = append(out, *st)
		}
	}
	slices.SortFunc(out, func(a, b execio.ProcessStatus) int { return a.StartedAt.Compare(b.StartedAt) })
	return out, nil
}

func procPoll(f procFlags) (*execio.ProcessOutput, error) {
	st, err := procStatus(f.dir, f.id)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(f.dir, f.id)
	out := &execio.ProcessOutput{ProcessStatus: *st}
	if out.Stdout, err = readRing(filepath.Join(dir, "stdout"), f.stdoutOffset, f.maxBytes); err != nil {
		return nil, err
	}
	if out.Stderr, err = readRing(filepath.Join(dir, "stderr"), f.stderrOffset, f.maxBytes); err != nil {
		return nil, err
	}
	return out, nil
}

// procWait polls until the process is no longer running or the timeout
// passes, then reports as poll does.
func procWait(f procFlags) (*execio.ProcessOutput, error) {
	deadline := time.Now().Add(f.timeout)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		st, err := procStatus(f.dir, f.id)
		if err != nil {
			return nil, err
		}
		if st.State != execio.ProcessRunning || !time.Now().Before(deadline) {
			return procPoll(f)
		}
		time.Sleep(min(pause, time.Until(deadline)))
	}
}

// procKill kills the process's whole tree and reports its status once the
// exit is recorded. A process that already ended is reported as it is.
func procKill(f procFlags) (*execio.ProcessStatus, error) {
	st, err := procStatus(f.dir, f.id)
	if err != nil || st.State != execio.ProcessRunning {
		return st, err
	}
	// Recorded first, so that the exit this kill causes reads as killed.
	if err := os.WriteFile(filepath.Join(f.dir, f.id, "killed"), nil, 0o600); err != nil {
		return nil, fmt.Errorf("recording the kill: %w", err)
	}
	if err := kill(helperproto.ProcRunIDPrefix + f.id); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(procKillWait)
	for {
		st, err := procStatus(f.dir, f.id)
		if err != nil || st.State != execio.ProcessRunning {
			return st, err
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("the tree of %q is gone but its exit was not recorded within %s", f.id, procKillWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// procStdin writes what arrives on stdin (at most MaxStdinWrite) to the
// process's stdin, then closes it with --eof. It blocks while the process
// does not read.
func procStdin(f procFlags, stdin io.Reader) (*execio.ProcessStatus, error) {
	data, err := io.ReadAll(io.LimitReader(stdin, helperproto.MaxStdinWrite+1))
	if err != nil {
		return nil, fmt.Errorf("reading the data: %w", err)
	}
	if len(data) > helperproto.MaxStdinWrite {
		return nil, &helperproto.Error{Kind: helperproto.KindTooLarge, Message: fmt.Sprintf("a write to stdin is at most %d bytes", helperproto.MaxStdinWrite)}
	}
	st, err := procStatus(f.dir, f.id)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(f.dir, f.id)
	exited := &helperproto.Error{Kind: helperproto.KindProcessExited, Message: fmt.Sprintf("background process %q has exited (or closed its stdin)", f.id)}
	if st.State != execio.ProcessRunning || fileExists(filepath.Join(dir, "stdin-closed")) {
		return nil, exited
	}
	unlock, err := lockFile(filepath.Join(dir, ".stdin.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Non-blocking open: no reader (the supervisor is gone) is ENXIO
	// instead of a hang.
	fd, err := syscall.Open(filepath.Join(dir, "stdin"), syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ENXIO) {
		return nil, exited
	}
	if err != nil {
		return nil, fmt.Errorf("opening the stdin fifo: %w", err)
	}
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	w := os.NewFile(uintptr(fd), "stdin")
	defer w.Close()
	var frames []byte
	if len(data) > 0 {
		frames = helperproto.AppendFrame(frames, helperproto.FrameStdinData, data)
	}
	if f.eof {
		frames = helperproto.AppendFrame(frames, helperproto.FrameStdinClose, nil)
	}
	if _, err := w.Write(frames); err != nil {
		if errors.Is(err, syscall.EPIPE) {
			return nil, exited
		}
		return nil, fmt.Errorf("writing to stdin: %w", err)
	}
	return procStatus(f.dir, f.id)
}
