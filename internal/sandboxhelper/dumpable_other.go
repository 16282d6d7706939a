//go:build !linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxhelper

func hideFromSandbox() error { return nil }
