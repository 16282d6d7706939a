//go:build !linux

package sandboxhelper

import (
	"errors"
	"io"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// The helper runs only inside Linux containers; on other systems the
// package still compiles (the manager parses its errors everywhere).

var errLinuxOnly = errors.New("code-sandbox-helper runs commands only on Linux")

func run(_ runOptions, _, stderr io.Writer) int { return report(stderr, errLinuxOnly) }

func kill(string) error { return errLinuxOnly }

func serve(io.Reader, io.Writer) int { return helperproto.ExitOther }

func procMain(_ []string, _ io.Reader, _, stderr io.Writer) int { return report(stderr, errLinuxOnly) }

func quiesce() (func(), error) { return nil, errLinuxOnly }
func thawAll()                 {}
