package sandboxhelper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// serve runs commands on request, one at a time, for as long as its stdin
// stays open (see helperproto's serve protocol). It is `docker exec`ed once
// and then kept, so a command costs a fork of `helper run` instead of a
// Docker exec.
//
// Each command runs under its own `helper run` child, exactly as one exec
// per command would run it: run is the subreaper that owns and kills the
// command's tree, and what outlives a finished command (`server &`) is
// re-parented to the container's init when run exits, never to serve, so a
// later command's kill cannot reach it. serve itself changes nothing of its
// own (environment, directory) between commands.
func serve(stdin io.Reader, stdout io.Writer) int {
	out := &frameWriter{w: stdout}
	ready, _ := json.Marshal(helperproto.Ready{Features: []string{helperproto.FeatureStreamedUntar}})
	if err := out.frame(helperproto.FrameReady, ready); err != nil {
		return helperproto.ExitOther
	}
	in := make(chan inFrame)
	go func() {
		defer close(in)
		for {
			kind, payload, err := helperproto.ReadFrame(stdin, helperproto.MaxRequestFrame)
			if err != nil {
				return
			}
			in <- inFrame{kind, payload}
		}
	}()
	for {
		f, ok := <-in
		switch {
		case !ok:
			// The manager closed us, or went away.
			return 0
		case f.kind == helperproto.FrameKill:
			// A kill that crossed its command's exit frame.
			continue
		}
		req, err := parseServeRequest(f.kind, f.payload)
		if err != nil {
			return out.fail(helperproto.ExitUsage, err)
		}
		if req.DialPort != 0 {
			return dialServe(req.DialPort, in, out)
		}
		op, args, transfer := transferRequest(req)
		if req.StdinFrames && (!transfer || op != "untar") {
			return out.fail(helperproto.ExitUsage, errors.New("serve: stdinFrames is only for the helper's own untar"))
		}
		if err := out.frame(helperproto.FrameAccepted, nil); err != nil {
			return helperproto.ExitOther
		}
		if transfer {
			// In this process, not forked (serve_transfer_linux.go); it
			// sends its own exit frame.
			code, more := serveTransfer(req, op, args, in, out)
			if !more {
				return code
			}
			continue
		}
		code, more := runOne(req, in, out)
		if err := out.exit(code); err != nil || !more {
			return code
		}
	}
}

type inFrame struct {
	kind    byte
	payload []byte
}

// runOne runs one request under a `helper run` child and copies its output
// into frames. A kill frame for it, or the end of stdin, SIGTERMs the child,
// which kills the tree (as `helper kill` does). more is false when serve
// must stop after this command.
func runOne(req helperproto.ServeRequest, in <-chan inFrame, out *frameWriter) (code int, more bool) {
	cmdStdin, err := stdinFor(req.Stdin)
	if err != nil {
		return out.errorLine(helperproto.ExitOther, err), false
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		cmdStdin.Close()
		return out.errorLine(helperproto.ExitOther, err), false
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		cmdStdin.Close()
		outR.Close()
		outW.Close()
		return out.errorLine(helperproto.ExitOther, err), false
	}
	args := append([]string{os.Args[0], "run", "--id=" + req.ID, "--backstop=" + strconv.FormatInt(req.BackstopSeconds, 10), "--"}, req.Argv...)
	proc, err := os.StartProcess("/proc/self/exe", args, &os.ProcAttr{
		Dir:   req.WorkingDir,
		Env:   mergeEnv(os.Environ(), req.Env),
		Files: []*os.File{cmdStdin, outW, errW},
	})
	cmdStdin.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		var pathErr *os.PathError
		if errors.As(err, &pathErr) && pathErr.Op == "chdir" {
			// What runc reports for an exec's missing working directory.
			return out.errorLine(helperproto.ExitCannotExecute, fmt.Errorf("cannot change to working directory %q: %w", req.WorkingDir, pathErr.Err)), true
		}
		return out.errorLine(helperproto.ExitCannotExecute, fmt.Errorf("starting the helper's runner: %w", err)), false
	}

	defer outR.Close()
	defer errR.Close()
	copied := make(chan struct{}, 2)
	var flow copyProgress
	go copyStream(outR, out.stream(helperproto.FrameStdout), &flow, copied)
	go copyStream(errR, out.stream(helperproto.FrameStderr), &flow, copied)
	exited := make(chan *os.ProcessState, 1)
	go func() {
		st, _ := proc.Wait()
		exited <- st
	}()

	more = true
	killed := false
	terminate := func() {
		killed = true
		_ = proc.Signal(syscall.SIGTERM)
	}
	for {
		select {
		case f, ok := <-in:
			switch {
			case !ok:
				more = false
				in = nil
				terminate()
			case f.kind == helperproto.FrameKill && string(f.payload) == req.ID:
				terminate()
			case f.kind == helperproto.FrameKill:
				// Another command's late kill.
			default:
				// A second request while one runs: the manager is
				// confused; stop both.
				more = false
				terminate()
			}
		case st := <-exited:
			// The runner's pipes are its own (the command's tree holds
			// the runner's), so they end with it.
			<-copied
			<-copied
			if st == nil {
				return helperproto.ExitOther, false
			}
			if ws, ok := st.Sys().(syscall.WaitStatus); ok {
				if killed && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
					// The kill came before run could catch it, so before
					// it started the command: nothing else to kill.
					return helperproto.ExitKilled, more
				}
				return exitCode(ws), more
			}
			return st.ExitCode(), more
		}
	}
}

// mergeEnv is base with overrides applied (an override replaces a
// variable of the same name, in place), as Docker merges an exec's env
// into the container's.
func mergeEnv(base, overrides []string) []string {
	env := append([]string(nil), base...)
	index := make(map[string]int, len(env))
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		index[name] = i
	}
	for _, kv := range overrides {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := index[name]; ok {
			env[i] = kv
			continue
		}
		index[name] = len(env)
		env = append(env, kv)
	}
	return env
}

func parseServeRequest(kind byte, payload []byte) (helperproto.ServeRequest, error) {
	var req helperproto.ServeRequest
	if kind != helperproto.FrameRequest {
		return req, fmt.Errorf("serve: expected a request frame, got %q", kind)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("serve: decoding the request: %w", err)
	}
	switch {
	case !validID(req.ID):
		return req, fmt.Errorf("serve: run ID %q is not [A-Za-z0-9_-]{1,64}", req.ID)
	case req.DialPort != 0 && (req.DialPort < 1 || req.DialPort > 65535):
		return req, fmt.Errorf("serve: dial port %d is not in 1-65535", req.DialPort)
	case req.DialPort != 0 && len(req.Argv) != 0:
		return req, errors.New("serve: a request is a command or a dial, not both")
	case req.DialPort == 0 && len(req.Argv) == 0:
		return req, errors.New("serve: the request has no command")
	case req.StdinFrames && (req.DialPort != 0 || len(req.Stdin) != 0):
		return req, errors.New("serve: stdinFrames is the stdin of an untar, not of a dial, nor next to stdin")
	case req.BackstopSeconds < 0:
		return req, fmt.Errorf("serve: negative backstop %d", req.BackstopSeconds)
	}
	for _, kv := range req.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return req, fmt.Errorf("serve: env %q is not KEY=VALUE", kv)
		}
	}
	return req, nil
}

// stdinFor is the command's stdin: data, then EOF.
func stdinFor(data []byte) (*os.File, error) {
	if len(data) == 0 {
		return os.Open(os.DevNull)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the stdin pipe: %w", err)
	}
	go func() {
		// A command that stops reading gets the rest dropped (EPIPE).
		_, _ = w.Write(data)
		_ = w.Close()
	}()
	return r, nil
}

// frameWriter writes whole frames, one Write each, from any goroutine.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func (f *frameWriter) frame(kind byte, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf = helperproto.AppendFrame(f.buf[:0], kind, payload)
	_, err := f.w.Write(f.buf)
	return err
}

func (f *frameWriter) exit(code int) error {
	return f.frame(helperproto.FrameExit, helperproto.ExitPayload(code))
}

// errorLine reports the helper's own failure as run does, as its error
// line on stderr, and returns code for the exit frame that follows.
func (f *frameWriter) errorLine(code int, err error) int {
	line, _ := json.Marshal(classify(err))
	_ = f.frame(helperproto.FrameStderr, []byte(helperproto.ErrorPrefix+string(line)+"\n"))
	return code
}

// fail is errorLine and the exit frame.
func (f *frameWriter) fail(code int, err error) int {
	_ = f.exit(f.errorLine(code, err))
	return code
}

// stream is an io.Writer of one output stream's frames.
func (f *frameWriter) stream(kind byte) io.Writer {
	return streamWriter{f: f, kind: kind}
}

type streamWriter struct {
	f    *frameWriter
	kind byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	for rest := p; len(rest) > 0; {
		n := min(len(rest), helperproto.MaxOutputFrame)
		if err := s.f.frame(s.kind, rest[:n]); err != nil {
			return len(p) - len(rest), err
		}
		rest = rest[n:]
	}
	return len(p), nil
}

// dialServe connects to 127.0.0.1:port and relays the connection over the
// serve frames (helperproto: DialPort) until both directions have ended or
// the manager goes away. The helper exits after: it never runs a command
// once it held a connection.
func dialServe(port int, in <-chan inFrame, out *frameWriter) int {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dialTimeout)
	if err != nil {
		return out.fail(helperproto.ExitOther, dialError(port, err))
	}
	defer conn.Close()
	tcp := conn.(*net.TCPConn)
	if err := out.frame(helperproto.FrameAccepted, nil); err != nil {
		return helperproto.ExitOther
	}
	// The connection's bytes, then its end, in order on one goroutine.
	fromConn := make(chan struct{})
	go func() {
		defer close(fromConn)
		_, _ = io.Copy(out.stream(helperproto.FrameStdout), tcp)
		_ = out.frame(helperproto.FrameCloseWrite, nil)
	}()
	toConnDone := false
	for !toConnDone || fromConn != nil {
		select {
		case f, ok := <-in:
			switch {
			case !ok:
				// The manager closed the connection, or went away.
				return 0
			case f.kind == helperproto.FrameData && !toConnDone:
				// A server that stopped reading drops the rest, as a
				// reset connection would.
				_, _ = tcp.Write(f.payload)
			case f.kind == helperproto.FrameCloseWrite:
				toConnDone = true
				_ = tcp.CloseWrite()
			case f.kind == helperproto.FrameData:
				// After our half-close: the manager is confused.
				return helperproto.ExitUsage
			default:
				return helperproto.ExitUsage
			}
		case <-fromConn:
			fromConn = nil
		}
	}
	_ = out.exit(0)
	return 0
}
