package sandboxhelper

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

const usage = `usage:
  code-sandbox-helper run --id=ID [--backstop=SECONDS] -- ARGV...
  code-sandbox-helper kill ID
  code-sandbox-helper check   (a warm pool member's health check; see check.go)
  code-sandbox-helper serve   (one command, on request; see helperproto)
  code-sandbox-helper proc start|list|poll|wait|kill|stdin [--id=HANDLE] ...   (background processes; see bg_linux.go)
  code-sandbox-helper dial --port=N   (relays stdin/stdout to 127.0.0.1:N in the sandbox; see dial.go)
  code-sandbox-helper untar --root=DIR --dest=REL [--max-bytes=N] [--max-entries=N] [--links=1] < archive.tar
  code-sandbox-helper tar --root=DIR --path=REL [--max-bytes=N] > archive.tar
  code-sandbox-helper snapshot --root=DIR... [--max-bytes=N] > archive.tar   (see snapshot.go)
  code-sandbox-helper thaw   (continues what a snapshot that was cut off left stopped)
  code-sandbox-helper statfs --root=DIR...   (one line "DIR USED TOTAL" per root)`

// Main runs one helper subcommand and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usageError(stderr, errors.New("no subcommand"))
	}
	switch args[0] {
	case "run", "serve", "tar", "untar", "proc", "dial", "snapshot":
		// Before any frame or file content is read: see hideFromSandbox.
		if err := hideFromSandbox(); err != nil {
			return report(stderr, fmt.Errorf("making the helper non-dumpable: %w", err))
		}
	}
	switch args[0] {
	case "run":
		opts, err := parseRun(args[1:])
		if err != nil {
			return usageError(stderr, err)
		}
		return run(opts, stdout, stderr)
	case "serve":
		if len(args) != 1 {
			return usageError(stderr, errors.New("serve takes no arguments"))
		}
		return serve(stdin, stdout)
	case "proc":
		return procMain(args[1:], stdin, stdout, stderr)
	case "dial":
		port, err := parseDial(args[1:])
		if err != nil {
			return usageError(stderr, err)
		}
		return dial(port, stdin, stdout, stderr)
	case "check":
		if len(args) != 1 {
			return usageError(stderr, errors.New("check takes no arguments"))
		}
		if err := check(); err != nil {
			return report(stderr, err)
		}
		return 0
	case "kill":
		if len(args) != 2 || !validID(args[1]) {
			return usageError(stderr, errors.New("kill takes one run ID"))
		}
		if err := kill(args[1]); err != nil {
			return report(stderr, err)
		}
		return 0
	case "thaw":
		if len(args) != 1 {
			return usageError(stderr, errors.New("thaw takes no arguments"))
		}
		thawAll()
		return 0
	case "statfs":
		if err := statfsMain(args[1:], stdout); err != nil {
			return usageError(stderr, err)
		}
		return 0
	case "snapshot":
		flags, err := parseSnapshot(args[1:])
		if err != nil {
			return usageError(stderr, err)
		}
		if err := snapshot(flags, stdout); err != nil {
			return report(stderr, err)
		}
		return 0
	case "untar", "tar":
		flags, err := parseFlags(args[1:], args[0])
		if err != nil {
			return usageError(stderr, err)
		}
		if args[0] == "untar" {
			err = untar(flags, stdin)
		} else {
			err = writeTar(flags, stdout)
		}
		if err != nil {
			return report(stderr, err)
		}
		return 0
	}
	return usageError(stderr, fmt.Errorf("unknown subcommand %q", args[0]))
}

func usageError(stderr io.Writer, err error) int {
	report(stderr, fmt.Errorf("%v\n%s", err, usage))
	return helperproto.ExitUsage
}

// validID keeps run IDs to a charset that cannot be confused with another
// argument when matched in a command line.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

type runOptions struct {
	id       string
	backstop int64 // seconds; 0 means none
	argv     []string
}

func parseRun(args []string) (runOptions, error) {
	var opts runOptions
	for i, arg := range args {
		if arg == "--" {
			opts.argv = args[i+1:]
			break
		}
		key, value, _ := strings.Cut(arg, "=")
		switch key {
		case "--id":
			opts.id = value
		case "--backstop":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 {
				return opts, fmt.Errorf("--backstop=%q is not a number of seconds", value)
			}
			opts.backstop = n
		default:
			return opts, fmt.Errorf("run: unknown flag %q", arg)
		}
	}
	switch {
	case !validID(opts.id):
		return opts, fmt.Errorf("run needs --id=ID ([A-Za-z0-9_-], at most 64 characters), got %q", opts.id)
	case len(opts.argv) == 0:
		return opts, errors.New("run needs a command after --")
	}
	return opts, nil
}

// transferFlags are the flags of untar and tar.
type transferFlags struct {
	root       string
	rel        string // --dest for untar, --path for tar
	maxBytes   int64
	maxEntries int
	links      bool // untar --links=1: restore symbolic links (a snapshot)
}

func parseFlags(args []string, cmd string) (transferFlags, error) {
	f := transferFlags{maxBytes: -1, maxEntries: -1}
	relFlag := "--dest"
	if cmd == "tar" {
		relFlag = "--path"
	}
	seenRel := false
	for _, arg := range args {
		key, value, ok := strings.Cut(arg, "=")
		if !ok {
			return f, fmt.Errorf("%s: flag %q needs a value", cmd, arg)
		}
		var err error
		switch key {
		case "--root":
			f.root = value
		case relFlag:
			f.rel, seenRel = value, true
		case "--max-bytes":
			f.maxBytes, err = strconv.ParseInt(value, 10, 64)
		case "--links":
			if cmd != "untar" || (value != "0" && value != "1") {
				return f, fmt.Errorf("%s: bad flag %q", cmd, arg)
			}
			f.links = value == "1"
		case "--max-entries":
			if cmd != "untar" {
				return f, fmt.Errorf("%s: unknown flag %q", cmd, arg)
			}
			var n int64
			n, err = strconv.ParseInt(value, 10, 32)
			f.maxEntries = int(n)
		default:
			return f, fmt.Errorf("%s: unknown flag %q", cmd, arg)
		}
		if err != nil {
			return f, fmt.Errorf("%s: %s is not a number: %w", cmd, arg, err)
		}
	}
	if f.root == "" || !seenRel {
		return f, fmt.Errorf("%s needs --root and %s", cmd, relFlag)
	}
	return f, nil
}
