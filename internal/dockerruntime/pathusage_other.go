//go:build !linux

package dockerruntime

// hostPathUsage needs Linux's /proc; elsewhere the helper reads the paths.
func hostPathUsage(int, string, []string) (map[string]int64, bool) { return nil, false }
