package sandboxhelper

import (
	"fmt"
	"io"
	"path"
	"strings"
	"syscall"
)

// statfs prints, for each --root=DIR, one line "DIR USED TOTAL" (bytes)
// from statfs(2): the per-path disk figures of a running sandbox whose
// tmpfs mounts the manager cannot see from the host (dockerruntime's
// pathUsage). A root that cannot be read prints "DIR - -".
func statfsMain(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("statfs needs at least one --root=DIR")
	}
	var roots []string
	for _, a := range args {
		r, ok := strings.CutPrefix(a, "--root=")
		if !ok || !path.IsAbs(r) || path.Clean(r) != r || strings.ContainsAny(r, " \n") {
			return fmt.Errorf("statfs: bad argument %q (want --root=/clean/path)", a)
		}
		roots = append(roots, r)
	}
	for _, r := range roots {
		var st syscall.Statfs_t
		if err := syscall.Statfs(r, &st); err != nil {
			fmt.Fprintf(stdout, "%s - -\n", r)
			continue
		}
		bs := uint64(st.Bsize)
		fmt.Fprintf(stdout, "%s %d %d\n", r, (st.Blocks-st.Bfree)*bs, st.Blocks*bs)
	}
	return nil
}
