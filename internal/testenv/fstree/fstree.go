/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package fstree lists a directory tree for the assertions of tests that
// must show what a file operation wrote, or that it wrote nothing: two
// listings of a tree are equal only when no path, type, mode or file content
// in it changed.
//
// The package imports nothing from the module, so every test package may
// use it.
package fstree

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// List is every path below dir, dir itself as ".", sorted: each as the path
// relative to dir, a space and its type and mode (fs.FileMode's String),
// and for a regular file a space and its content. Symbolic links are
// listed, never followed. It fails the spec when the tree cannot be read.
func List(dir string) []string {
	GinkgoHelper()
	var out []string
	Expect(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := rel + " " + info.Mode().String()
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	})).To(Succeed())
	sort.Strings(out)
	return out
}
