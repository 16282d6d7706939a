package dockerruntime

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

const tmpfsMagic = 0x01021994

// hostPathUsage reads each tmpfs path's use with statfs(2) through
// /proc/<pid>/root, pid being the container's init as Docker reports it.
// It works only where this process shares the Engine's PID namespace and
// may look at that process (root, or CAP_SYS_PTRACE): the MCP server on
// the Docker host, not the manager's pod, which has no hostPID. A PID
// means nothing in another namespace, so /proc/<pid>/cgroup must name the
// container before and after the reads, and each path must be a tmpfs.
// The container is not touched: a paused one stays frozen.
func hostPathUsage(pid int, containerID string, paths []string) (map[string]int64, bool) {
	if pid <= 0 || len(containerID) < 12 {
		return nil, false
	}
	owns := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		return err == nil && strings.Contains(string(b), containerID)
	}
	if !owns() {
		return nil, false
	}
	out := make(map[string]int64, len(paths))
	for _, p := range paths {
		var st syscall.Statfs_t
		if err := syscall.Statfs(fmt.Sprintf("/proc/%d/root%s", pid, p), &st); err != nil || st.Type != tmpfsMagic {
			return nil, false
		}
		out[p] = int64((st.Blocks - st.Bfree) * uint64(st.Bsize))
	}
	if !owns() {
		return nil, false
	}
	return out, true
}
