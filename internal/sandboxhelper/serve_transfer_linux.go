package sandboxhelper

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// A file transfer is the helper's own `untar` or `tar`. Forked as a
// command it costs a start of this Go binary (~3-4 ms, most of a 1 KiB
// write_file through the resident helper); serve runs it itself instead,
// with the very same functions, flags and limits (untar, writeTar,
// parseFlags), in this process, which is the same user, umask, rlimits and
// non-dumpable state a forked one would have (serve made itself
// non-dumpable before reading its first frame). See helperproto: "A
// request whose Argv is the helper's own untar or tar".

// errTransferKilled ends an in-process transfer's reads and writes once
// its kill frame (or the end of serve's stdin) came.
var errTransferKilled = errors.New("the transfer was killed")

// errTransferEnded fails a streamed upload's frames that arrive after its
// untar ended (early, with an error): they are dropped.
var errTransferEnded = errors.New("the transfer has ended")

// transferRequest recognises a request for the helper's own untar or tar.
// ok false is any other command (forked as always).
func transferRequest(req helperproto.ServeRequest) (op string, args []string, ok bool) {
	if len(req.Argv) < 2 || req.Argv[0] != os.Args[0] {
		return "", nil, false
	}
	switch req.Argv[1] {
	case "untar", "tar":
		return req.Argv[1], req.Argv[2:], true
	}
	return "", nil, false
}

// serveTransfer runs one accepted untar or tar request in this process
// and sends its exit frame. A kill frame naming it, or the end of stdin,
// stops it at its next read or write. A streamed upload's frames after an
// early end are read and dropped up to its FrameCloseWrite, so that they
// are not taken for the next request. more is false when serve must stop.
func serveTransfer(req helperproto.ServeRequest, op string, args []string, in <-chan inFrame, out *frameWriter) (code int, more bool) {
	stop := make(chan struct{})
	var stopOnce sync.Once
	var (
		pr *io.PipeReader
		pw *io.PipeWriter
	)
	var stdin io.Reader = bytes.NewReader(req.Stdin)
	if req.StdinFrames {
		pr, pw = io.Pipe()
		stdin = pr
	}
	stdin = stoppable{r: stdin, stop: stop}
	kill := func() {
		stopOnce.Do(func() { close(stop) })
		if pw != nil {
			pw.CloseWithError(errTransferKilled)
		}
	}
	done := make(chan error, 1)
	go func() {
		err := runTransfer(op, args, stdin, stoppable{w: out.stream(helperproto.FrameStdout), stop: stop})
		if pr != nil {
			// Unblocks the frame loop's write of the rest of an upload.
			pr.CloseWithError(errTransferEnded)
		}
		done <- err
	}()

	more = true
	streaming := req.StdinFrames
	killed := false
	var result *int
	for result == nil || streaming {
		select {
		case f, ok := <-in:
			switch {
			case !ok:
				more, in, streaming = false, nil, false
				killed = true
				kill()
			case f.kind == helperproto.FrameKill && string(f.payload) == req.ID:
				killed = true
				kill()
			case f.kind == helperproto.FrameKill:
				// Another command's late kill.
			case f.kind == helperproto.FrameData && streaming:
				// Blocks while untar takes it (a frame at most); fails at
				// once after the transfer ended, and the data is dropped.
				_, _ = pw.Write(f.payload)
			case f.kind == helperproto.FrameCloseWrite && streaming:
				streaming = false
				_ = pw.Close()
			default:
				// A request (or data) the protocol does not allow here: the
				// manager is confused; stop.
				more, streaming = false, false
				killed = true
				kill()
			}
		case err := <-done:
			done = nil
			c := 0
			switch {
			case killed:
				c = helperproto.ExitKilled
			case errors.Is(err, errUsage):
				c = out.errorLine(helperproto.ExitUsage, err)
			case err != nil:
				c = out.errorLine(classify(err).ExitCode(), err)
			}
			result = &c
			// The exit frame goes now, not after the rest of an upload:
			// the manager stops sending once it sees it.
			if err := out.exit(c); err != nil {
				return c, false
			}
		}
	}
	return *result, more
}

// errUsage marks flags a forked helper would refuse with its usage error.
var errUsage = errors.New("usage")

// runTransfer is what Main does for untar and tar, on this process's
// goroutine, a panic included (it would otherwise end the resident helper).
func runTransfer(op string, args []string, stdin io.Reader, stdout io.Writer) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the helper's %s failed: %v", op, r)
		}
	}()
	flags, err := parseFlags(args, op)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if op == "untar" {
		return untar(flags, stdin)
	}
	return writeTar(flags, stdout)
}

// stoppable is a reader or a writer that fails with errTransferKilled
// once stop is closed.
type stoppable struct {
	r    io.Reader
	w    io.Writer
	stop <-chan struct{}
}

func (s stoppable) Read(p []byte) (int, error) {
	select {
	case <-s.stop:
		return 0, errTransferKilled
	default:
		return s.r.Read(p)
	}
}

func (s stoppable) Write(p []byte) (int, error) {
	select {
	case <-s.stop:
		return 0, errTransferKilled
	default:
		return s.w.Write(p)
	}
}
