package sandboxhelper

import (
	"bytes"
	"os"
	"strconv"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// procEntry is what the helper needs of /proc/PID/stat.
type procEntry struct {
	pid, ppid int
	state     byte // R, S, D, Z, …
}

// readStat parses /proc/PID/stat. The command name may contain spaces and
// parentheses, so the fields after it are found from the last ')'.
func readStat(pid int) (procEntry, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procEntry{}, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return procEntry{}, false
	}
	fields := bytes.Fields(data[i+2:])
	if len(fields) < 2 {
		return procEntry{}, false
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	if err != nil {
		return procEntry{}, false
	}
	return procEntry{pid: pid, ppid: ppid, state: fields[0][0]}, true
}

// listPIDs returns every PID visible in /proc.
func listPIDs() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// treeMembers returns every process whose parent chain leads to ancestor
// (a subreaper's orphans are re-parented to it, so even a process that
// called setsid or double-forked is found), plus every process of ours whose
// environment carries helperproto.RunIDEnv=id (which finds them where there is no
// subreaper).
func treeMembers(ancestor int, id string) []procEntry {
	children := map[int][]procEntry{}
	var marked []procEntry
	marker := []byte("\x00" + helperproto.RunIDEnv + "=" + id + "\x00")
	for _, pid := range listPIDs() {
		e, ok := readStat(pid)
		if !ok {
			continue
		}
		children[e.ppid] = append(children[e.ppid], e)
		if pid == ancestor {
			continue
		}
		// Reading another user's environ fails, so only our own processes
		// can match.
		if env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ"); err == nil {
			if bytes.Contains(append(append([]byte{0}, env...), 0), marker) {
				marked = append(marked, e)
			}
		}
	}
	seen := map[int]bool{}
	var out []procEntry
	queue := []int{ancestor}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c.pid] {
				seen[c.pid] = true
				out = append(out, c)
				queue = append(queue, c.pid)
			}
		}
	}
	for _, e := range marked {
		if !seen[e.pid] {
			out = append(out, e)
		}
	}
	return out
}
