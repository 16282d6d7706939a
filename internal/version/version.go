// Package version carries the build's version stamp.
package version

// Version is set at build time with -ldflags "-X …/internal/version.Version=…".
var Version = "dev"
