package helperproto

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// Background processes. `helper proc start` starts a command detached from
// every exec stream (its own session, re-parented to the container's init),
// under a per-process supervisor (`helper proc supervise`) that keeps its
// stdout and stderr in two ring files and records its exit. The state lives
// in the sandbox (ProcDir, on the sandbox's /tmp tmpfs), so its memory and
// disk count against the sandbox, never against the manager, and a manager
// that restarts finds the processes and their output again with `helper proc
// list` / `poll`. Every proc subcommand prints one JSON document on stdout
// (execio.ProcessStatus, a list of them, or execio.ProcessOutput) or fails with the error line.
//
// The manager must treat all of it as hostile: code in the sandbox may
// rewrite the files, so it bounds what it reads and validates handles.
const (
	// ProcDir holds one directory per handle.
	ProcDir = "/tmp/.code-sandbox-procs"
	// MaxProcs bounds a sandbox's handles, running or finished. Starting
	// one more removes the oldest finished one; with MaxProcs running, it
	// fails with KindTooManyProcesses.
	MaxProcs = execio.MaxProcesses
	// RingBytes is the size of each stream's ring: the last RingBytes of
	// stdout and of stderr are kept (1 MiB per process in all).
	RingBytes = execio.ProcessRingBytes
	// RingHeader is the ring file's header: the number of bytes ever
	// written to the stream, little-endian uint64. The data region of
	// RingBytes follows; byte n of the stream is at RingHeader+n%RingBytes.
	RingHeader = 8
	// MaxStdinWrite bounds one write to a background process's stdin.
	MaxStdinWrite = execio.MaxProcessStdinWrite
	// MaxProcWait bounds `proc wait`.
	MaxProcWait = execio.MaxProcessWait
	// ProcRunIDPrefix prefixes the run ID of a background process's
	// `helper run` (the handle follows), so `helper kill` finds it.
	ProcRunIDPrefix = "bg-"
)

// Error kinds of the proc subcommands.
const (
	KindNoSuchProcess    = "no_such_process"
	KindTooManyProcesses = "too_many_processes"
	KindProcessExited    = "process_exited"
)

// ProcExit is the supervisor's record of the exit (the "exit" file).
type ProcExit struct {
	Code    int       `json:"code"`
	EndedAt time.Time `json:"endedAt"`
}

// ProcMeta is the "meta" file, written by `proc start`.
type ProcMeta struct {
	Command   []string  `json:"command"`
	StartedAt time.Time `json:"startedAt"`
}

// Stdin frames, written to a process's stdin fifo by `proc stdin`.
const (
	FrameStdinData  byte = 'D'
	FrameStdinClose byte = 'C'
)

// RingTotal decodes a ring header.
func RingTotal(hdr []byte) int64 { return int64(binary.LittleEndian.Uint64(hdr)) }

// DroppedMarker is the line a reader shows where a ring lost output.
func DroppedMarker(stream string, n int64) string {
	return "\n[code-sandbox: " + stream + ": " + strconv.FormatInt(n, 10) + " bytes dropped; the ring buffer keeps the last " + strconv.Itoa(RingBytes) + " bytes]\n"
}
