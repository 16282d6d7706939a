// Command code-sandbox-helper runs inside every sandbox: it runs commands so
// that their whole process tree can be killed, and streams files in and out
// of the sandbox without following symlinks out of the allowed directories.
// See internal/sandboxhelper.
package main

import (
	"os"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper"
)

func main() {
	os.Exit(sandboxhelper.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
