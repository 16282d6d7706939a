package dockerruntime

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// HelperPath is where every sandbox finds the helper: commands run under
// `HelperPath run`, and files move through `HelperPath untar` / `tar`.
const HelperPath = toolsMountPath + "/helper"

// helperBinaries holds the helper built by `make helper` for each Linux
// architecture. The directory always has its README, so a clone without the
// binaries still compiles; helperBinary reports the missing binary instead.
//
//go:embed helperbin
var helperBinaries embed.FS

var (
	helperMu sync.Mutex
	// helperCache holds each architecture's binary once read: it is a few
	// MiB, and its hash names the tools volume on every create.
	helperCache = map[string][]byte{}
)

// helperBinary returns the helper for linux/goarch.
func helperBinary(goarch string) ([]byte, error) {
	helperMu.Lock()
	defer helperMu.Unlock()
	if data, ok := helperCache[goarch]; ok {
		return data, nil
	}
	data, err := fs.ReadFile(helperBinaries, "helperbin/code-sandbox-helper-linux-"+goarch)
	if err != nil || len(data) == 0 {
		return nil, fmt.Errorf("the sandbox helper for linux/%s is not embedded in this build; run `make helper`", goarch)
	}
	helperCache[goarch] = data
	return data, nil
}

// toolsContentHash identifies the tools volume's content for an
// architecture: the idle process and the helper (when embedded).
func toolsContentHash(goarch string) string {
	h := sha256.New()
	if elf, err := idleELF(goarch); err == nil {
		h.Write(elf)
	}
	if helper, err := helperBinary(goarch); err == nil {
		h.Write(helper)
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// helperFailure turns a helper that exited non-zero into an error: its own
// error line when it wrote one (mapped to execio's sentinels), otherwise
// what it printed.
func helperFailure(what string, exitCode int, stderr []byte) error {
	if he, ok := helperproto.ParseError(stderr); ok {
		return fmt.Errorf("%s: %w", what, he)
	}
	text := strings.TrimSpace(string(stderr))
	if exitCode == helperproto.ExitCannotExecute || exitCode == helperproto.ExitCommandNotFound {
		return fmt.Errorf("%s: %s could not be executed in the sandbox (exit %d: %s); a sandbox created before the helper existed must be recreated",
			what, HelperPath, exitCode, text)
	}
	return fmt.Errorf("%s: the sandbox helper exited with %d: %s", what, exitCode, text)
}

// boundedBuffer keeps the first max bytes written to it and drops the rest,
// so a misbehaving helper cannot grow the manager's memory through stderr.
type boundedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
