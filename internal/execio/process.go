package execio

import (
	"encoding/json"
	"strconv"
	"time"
)

// Background processes (a Sandbox's `processes` subresource): commands that
// run detached from the call that started them, found again by a handle.
// The in-sandbox helper supervises them and keeps their output in the
// sandbox (see helperproto/proc.go); these are the types every layer
// speaks.
const (
	// MaxProcesses bounds a sandbox's handles, running or finished.
	// Starting one more drops the oldest finished one; with MaxProcesses
	// running, a start fails with ErrTooManyProcesses.
	MaxProcesses = 16
	// ProcessRingBytes is what is kept of each of stdout and stderr: the
	// last 512 KiB (1 MiB per process).
	ProcessRingBytes = 512 << 10
	// MaxProcessStdinWrite bounds one write to a process's stdin.
	MaxProcessStdinWrite = 1 << 20
	// MaxProcessWait bounds one wait: under kube-apiserver's default
	// request timeout of 60 s for a request that is not long-running (the
	// processes subresource is not), and under the 60 s an MCP client
	// commonly gives a tool call. Wait again for longer.
	MaxProcessWait = 50 * time.Second
)

// Process states.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
	// ProcessLost is a process whose supervisor went away without
	// recording an exit (something in the sandbox killed it).
	ProcessLost = "lost"
)

// ProcessStatus is one background process.
type ProcessStatus struct {
	// Handle names the process in its sandbox; it means nothing elsewhere.
	Handle    string    `json:"handle"`
	Command   []string  `json:"command"`
	State     string    `json:"state"`
	StartedAt time.Time `json:"startedAt"`
	// ExitCode is set once State is exited (137 after a kill).
	ExitCode *int       `json:"exitCode,omitempty"`
	EndedAt  *time.Time `json:"endedAt,omitempty"`
	// Killed is set once a kill (exec_kill, tasks/cancel, kubectl sandbox
	// kill) was asked for while it ran: an exit after that is the kill's
	// doing. A helper older than this field never sets it.
	Killed bool `json:"killed,omitempty"`
	// StdoutBytes and StderrBytes count everything the process wrote,
	// dropped bytes included: where a poll for only new output starts.
	StdoutBytes int64 `json:"stdoutBytes"`
	StderrBytes int64 `json:"stderrBytes"`
}

// ProcessOutput is a poll's or a wait's answer: the status and the output
// from the offsets asked for.
type ProcessOutput struct {
	ProcessStatus
	Stdout StreamChunk `json:"stdout"`
	Stderr StreamChunk `json:"stderr"`
}

// StreamChunk is a stream's output from Offset to Next. Dropped counts the
// bytes between the offset asked for and Offset that the ring no longer
// holds (overwritten by newer output); a reader shows DroppedMarker there.
type StreamChunk struct {
	Offset  int64  `json:"offset"`
	Data    []byte `json:"data"`
	Next    int64  `json:"next"`
	Dropped int64  `json:"dropped,omitempty"`
}

// Text is the chunk as text, with a marker where output was dropped.
func (c StreamChunk) Text(stream string) string {
	if c.Dropped == 0 {
		return string(c.Data)
	}
	return DroppedMarker(stream, c.Dropped) + string(c.Data)
}

// DroppedMarker is the line shown where a ring lost output.
func DroppedMarker(stream string, n int64) string {
	return "[code-sandbox: " + strconv.FormatInt(n, 10) + " bytes of " + stream + " dropped; only the last " + formatSize(ProcessRingBytes) + " are kept]\n"
}

// Process actions (ProcessRequest.Action).
const (
	ProcessActionStart = "start"
	ProcessActionList  = "list"
	ProcessActionPoll  = "poll"
	ProcessActionWait  = "wait"
	ProcessActionKill  = "kill"
	ProcessActionStdin = "stdin"
)

// ProcessRequest is one call on a sandbox's background processes: the body
// of POST sandboxes/{name}/processes.
type ProcessRequest struct {
	Action string `json:"action"`
	// Handle names the process (every action but start and list). The
	// server mints handles; a start never takes one.
	Handle string `json:"handle,omitempty"`
	// Command is what start runs: a Request (its stdin must be empty, its
	// timeout is ignored). Raw, so that the server decodes it with the
	// bounds of DecodeRequest.
	Command json.RawMessage `json:"command,omitempty"`
	// TimeoutSeconds kills a started process's tree after that long; 0
	// means never (it runs until it exits, is killed, or the Sandbox
	// ends). At most MaxTimeout.
	TimeoutSeconds int64 `json:"timeoutSeconds,omitempty"`
	// StdoutOffset and StderrOffset are where poll and wait start reading
	// (Next of the previous answer; 0 for everything still kept).
	StdoutOffset int64 `json:"stdoutOffset,omitempty"`
	StderrOffset int64 `json:"stderrOffset,omitempty"`
	// TimeoutMillis bounds wait (at most MaxProcessWait).
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
	// Stdin is written to the process's stdin (stdin); CloseStdin closes
	// it after.
	Stdin      []byte `json:"stdin,omitempty"`
	CloseStdin bool   `json:"closeStdin,omitempty"`
}

// ProcessResponse answers a ProcessRequest: Process for start, kill and
// stdin, Output for poll and wait, Processes for list.
type ProcessResponse struct {
	Process   *ProcessStatus  `json:"process,omitempty"`
	Output    *ProcessOutput  `json:"output,omitempty"`
	Processes []ProcessStatus `json:"processes,omitempty"`
}
