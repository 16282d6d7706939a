package helperproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The serve protocol. `helper serve` is started by one `docker exec` and
// then kept: it runs commands on request, one at a time, until its stdin
// ends. A command then costs a write to its stdin and a fork in the
// sandbox instead of a new exec, which is most of what a Docker exec costs.
//
// Both directions carry frames: a kind byte, a big-endian uint32 payload
// length, the payload. The helper writes, on its stdout:
//
//	FrameReady     once, when it is up and waiting (no payload)
//	FrameAccepted  per command, once it has read a valid request
//	FrameStdout    the command's stdout, at most MaxOutputFrame per frame
//	FrameStderr    the command's stderr (and the helper's own failures)
//	FrameExit      last for the command: its exit code, a big-endian int32
//
// and reads, on its stdin, FrameRequest (a JSON ServeRequest) when it is
// idle, and FrameKill (the payload is the run ID) while that command runs.
// A kill for a command that has ended is ignored. The end of its stdin
// kills the running command's tree, and the helper exits.
//
// A request with DialPort instead of Argv hands the helper a connection
// instead of a command (the fast path of a preview's or port-forward's new
// connection): it connects to 127.0.0.1:DialPort in the sandbox and answers
// FrameAccepted, or its error line (kind port_closed when nothing listens)
// and FrameExit. Connected, it relays: the connection's bytes as
// FrameStdout, the connection's end as FrameCloseWrite; it reads FrameData
// (bytes for the connection) and FrameCloseWrite (a half-close) on its
// stdin. It sends FrameExit and exits once both directions have ended, or at
// once when its stdin ends: a helper that dialed never runs another command.
//
// A request whose Argv is the helper's own `untar` or `tar` (Argv[0] the
// path serve was started as) is served in the serve process itself, not
// forked: the same walker, flags and limits as the subcommand, the same
// stdout, error line and exit code, without the cost of starting the Go
// binary again. With StdinFrames the archive of an untar follows the
// request as FrameData frames, ended by FrameCloseWrite, instead of in
// Stdin; the helper may end the command (its FrameExit) before it, and then
// drops the data up to the FrameCloseWrite. Only a helper whose FrameReady
// payload (a JSON Ready) lists FeatureStreamedUntar takes StdinFrames: an
// older one sends FrameReady without payload and refuses the field.
//
// The reader of the helper's frames must treat them as hostile: code in the
// sandbox runs as the same user as the helper and may tamper with it.
const (
	FrameReady    byte = 'R'
	FrameAccepted byte = 'A'
	FrameStdout   byte = 'O'
	FrameStderr   byte = 'E'
	FrameExit     byte = 'X'
	FrameRequest  byte = 'Q'
	FrameKill     byte = 'K'
	// FrameData and FrameCloseWrite carry a dialed connection (DialPort).
	FrameData       byte = 'D'
	FrameCloseWrite byte = 'W'
)

const (
	// MaxOutputFrame bounds a frame from the helper.
	MaxOutputFrame = 32 << 10
	// MaxRequestFrame bounds a request (its stdin included).
	MaxRequestFrame = 64 << 20
	frameHeader     = 5
)

// ServeRequest is the command a `helper serve` runs.
type ServeRequest struct {
	// ID marks the command's environment (RunIDEnv).
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	// Env is applied over the helper's environment (the container's).
	Env []string `json:"env,omitempty"`
	// WorkingDir is the command's directory; empty keeps the container's.
	WorkingDir string `json:"workingDir,omitempty"`
	// Stdin is fed to the command, then closed; nil means an empty stdin.
	Stdin []byte `json:"stdin,omitempty"`
	// BackstopSeconds kills the tree by itself that long after it started
	// (0: never), for when the manager cannot.
	BackstopSeconds int64 `json:"backstopSeconds,omitempty"`
	// DialPort, instead of Argv, asks for a connection to
	// 127.0.0.1:DialPort in the sandbox (1-65535).
	DialPort int `json:"dialPort,omitempty"`
	// StdinFrames: the stdin of the helper's own untar follows as FrameData
	// frames, ended by FrameCloseWrite (see above), instead of Stdin.
	StdinFrames bool `json:"stdinFrames,omitempty"`
}

// Ready is FrameReady's payload: what this helper's serve can do beyond
// commands and dials. An older helper's FrameReady has no payload.
type Ready struct {
	Features []string `json:"features,omitempty"`
}

// FeatureStreamedUntar: the helper runs its own untar and tar in the serve
// process and takes an untar's archive as StdinFrames.
const FeatureStreamedUntar = "streamed-untar"

// MaxReadyPayload bounds FrameReady's payload as the manager reads it.
const MaxReadyPayload = 1 << 10

// ParseReady decodes FrameReady's payload; an empty or unreadable one is a
// helper without features (it is read from a process the sandbox can
// tamper with: it only ever turns a faster path on, never a check off).
func ParseReady(payload []byte) Ready {
	var r Ready
	if len(payload) == 0 || len(payload) > MaxReadyPayload || json.Unmarshal(payload, &r) != nil {
		return Ready{}
	}
	return r
}

// Has says whether the helper lists feature.
func (r Ready) Has(feature string) bool {
	for _, f := range r.Features {
		if f == feature {
			return true
		}
	}
	return false
}

// ErrFrameTooLarge is a frame over the reader's bound.
var ErrFrameTooLarge = errors.New("frame too large")

// AppendFrame appends one frame to buf, so a writer can send it in one
// Write.
func AppendFrame(buf []byte, kind byte, payload []byte) []byte {
	buf = append(buf, kind)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(payload)))
	return append(buf, payload...)
}

// ExitPayload encodes FrameExit's payload.
func ExitPayload(code int) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(int32(code)))
}

// ParseExit decodes FrameExit's payload.
func ParseExit(payload []byte) (int, error) {
	if len(payload) != 4 {
		return 0, fmt.Errorf("exit frame of %d bytes, want 4", len(payload))
	}
	return int(int32(binary.BigEndian.Uint32(payload))), nil
}

// ReadFrame reads one frame whose payload is at most max bytes; a longer
// one fails with ErrFrameTooLarge before anything is allocated for it. A
// stream that ends between frames returns io.EOF, one that ends inside a
// frame io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, max int) (kind byte, payload []byte, err error) {
	kind, n, err := readHeader(r, max)
	if err != nil {
		return 0, nil, err
	}
	return readPayload(r, kind, make([]byte, n))
}

// ReadFrameInto is ReadFrame into buf, whose length is the bound: the
// payload returned is buf's prefix, so a reader of many frames does not
// allocate one each.
func ReadFrameInto(r io.Reader, buf []byte) (kind byte, payload []byte, err error) {
	kind, n, err := readHeader(r, len(buf))
	if err != nil {
		return 0, nil, err
	}
	return readPayload(r, kind, buf[:n])
}

func readHeader(r io.Reader, max int) (byte, uint32, error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if uint64(n) > uint64(max) {
		return 0, 0, fmt.Errorf("%w: %q frame of %d bytes, at most %d", ErrFrameTooLarge, hdr[0], n, max)
	}
	return hdr[0], n, nil
}

func readPayload(r io.Reader, kind byte, payload []byte) (byte, []byte, error) {
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return kind, payload, nil
}
