package mcpserver

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// fakeBackend is an in-memory Backend for the tools' unit tests. It keeps
// the contract a real backend keeps (ownership by Caller.ID, a per-identity
// limit, errors wrapped in the Err* kinds, the sandbox path rules) so that
// the tools can be driven end to end; fail injects an error per method.
type fakeBackend struct {
	mu        sync.Mutex
	max       int // sandboxes per identity; 0: unlimited
	next      int
	sandboxes map[string]*fakeSandbox
	// fail maps a method name ("Create", "Exec"…) to the error it returns
	// before doing anything.
	fail map[string]error
	// exec runs a command; nil echoes the command line to stdout.
	exec  func(req execio.Request, out contract.OutputFunc) (execio.Result, error)
	logs  contract.Logs
	calls []string // method names, in order
	execs []execio.Request
}

type fakeSandbox struct {
	owner string
	sb    contract.Sandbox
	// files maps an absolute path to its content; dirs holds directories.
	files map[string][]byte
	modes map[string]int64
	dirs  map[string]bool
}

var _ contract.Backend = (*fakeBackend)(nil)

func newFakeBackend() *fakeBackend {
	return &fakeBackend{sandboxes: map[string]*fakeSandbox{}, fail: map[string]error{}}
}

// add makes a sandbox for owner and returns its ID.
func (f *fakeBackend) add(owner string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	id := fmt.Sprintf("sbx-%d", f.next)
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	f.sandboxes[id] = &fakeSandbox{
		owner: owner,
		sb: contract.Sandbox{ID: id, Image: "img:1", Status: "running", Network: contract.NetworkNone, WorkingDir: "/app",
			CreatedAt: now.Add(time.Duration(f.next) * time.Second), LastUsedAt: now, ExpiresAt: now.Add(time.Hour)},
		files: map[string][]byte{}, modes: map[string]int64{}, dirs: map[string]bool{"/app": true},
	}
	return id
}

func (f *fakeBackend) called(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, method)
	return f.fail[method]
}

func (f *fakeBackend) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// get is the ownership check: another identity's sandbox does not exist.
func (f *fakeBackend) get(caller contract.Caller, id string) (*fakeSandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sandboxes[id]
	if !ok || s.owner != caller.ID {
		return nil, fmt.Errorf("%w: %q", contract.ErrNotFound, id)
	}
	return s, nil
}

func (f *fakeBackend) Create(_ context.Context, caller contract.Caller, req contract.CreateRequest) (contract.Sandbox, error) {
	if err := f.called("Create"); err != nil {
		return contract.Sandbox{}, err
	}
	f.mu.Lock()
	n := 0
	for _, s := range f.sandboxes {
		if s.owner == caller.ID {
			n++
		}
	}
	f.mu.Unlock()
	if f.max > 0 && n >= f.max {
		return contract.Sandbox{}, fmt.Errorf("%w: you already have %d sandboxes; the limit is %d", contract.ErrQuota, n, f.max)
	}
	id := f.add(caller.ID)
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sandboxes[id]
	s.sb.Image, s.sb.Network, s.sb.NanoCPUs, s.sb.MemoryBytes = req.Image, req.Network, req.NanoCPUs, req.MemoryBytes
	s.sb.ExpiresAt = s.sb.CreatedAt.Add(req.Lifetime)
	return s.sb, nil
}

func (f *fakeBackend) Get(_ context.Context, caller contract.Caller, id string) (contract.Sandbox, error) {
	if err := f.called("Get"); err != nil {
		return contract.Sandbox{}, err
	}
	s, err := f.get(caller, id)
	if err != nil {
		return contract.Sandbox{}, err
	}
	return s.sb, nil
}

func (f *fakeBackend) List(_ context.Context, caller contract.Caller) ([]contract.Sandbox, error) {
	if err := f.called("List"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []contract.Sandbox
	for _, s := range f.sandboxes {
		if s.owner == caller.ID {
			out = append(out, s.sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

func (f *fakeBackend) Exec(_ context.Context, caller contract.Caller, id string, req execio.Request, out contract.OutputFunc) (execio.Result, error) {
	if err := f.called("Exec"); err != nil {
		return execio.Result{}, err
	}
	if _, err := f.get(caller, id); err != nil {
		return execio.Result{}, err
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	run := f.exec
	f.mu.Unlock()
	if run == nil {
		out("stdout", []byte(req.Shell+"\n"))
		return execio.Result{StdoutBytes: int64(len(req.Shell) + 1)}, nil
	}
	return run(req, out)
}

func (f *fakeBackend) Upload(_ context.Context, caller contract.Caller, id, destDir string, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	defer func() { _, _ = io.Copy(io.Discard, archive) }()
	if err := f.called("Upload"); err != nil {
		return execio.TransferStats{}, err
	}
	s, err := f.get(caller, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	t, err := execio.ResolvePath("/app", destDir)
	if err != nil {
		return execio.TransferStats{}, err
	}
	dest := path.Join(t.Root, t.Rel)
	var st execio.TransferStats
	tr := tar.NewReader(archive)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			return st, fmt.Errorf("%w: %v", execio.ErrInvalidRequest, err)
		}
		name := path.Join(dest, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			f.mu.Lock()
			s.dirs[name] = true
			f.mu.Unlock()
			st.Dirs++
		case tar.TypeReg:
			if st.Bytes+hdr.Size > limits.MaxBytes {
				return st, fmt.Errorf("%w: more than %d bytes", execio.ErrTooLarge, limits.MaxBytes)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				return st, err
			}
			f.mu.Lock()
			s.files[name], s.modes[name] = data, hdr.Mode
			f.mu.Unlock()
			st.Files++
			st.Bytes += int64(len(data))
		default:
			return st, fmt.Errorf("%w: %s", execio.ErrUnsupportedEntry, hdr.Name)
		}
	}
}

func (f *fakeBackend) Download(_ context.Context, caller contract.Caller, id, src string, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	if err := f.called("Download"); err != nil {
		return execio.TransferStats{}, err
	}
	s, err := f.get(caller, id)
	if err != nil {
		return execio.TransferStats{}, err
	}
	t, err := execio.ResolvePath("/app", src)
	if err != nil {
		return execio.TransferStats{}, err
	}
	p := path.Join(t.Root, t.Rel)
	f.mu.Lock()
	data, isFile := s.files[p]
	isDir := s.dirs[p]
	f.mu.Unlock()
	tw := tar.NewWriter(w)
	var st execio.TransferStats
	switch {
	case isFile:
		if int64(len(data)) > maxBytes {
			return st, fmt.Errorf("%w: %q is larger than %d bytes", execio.ErrTooLarge, src, maxBytes)
		}
		if err := tw.WriteHeader(&tar.Header{Name: path.Base(p), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return st, err
		}
		if _, err := tw.Write(data); err != nil {
			return st, err
		}
		st.Files, st.Bytes = 1, int64(len(data))
	case isDir:
		if err := tw.WriteHeader(&tar.Header{Name: path.Base(p) + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return st, err
		}
		st.Dirs = 1
	default:
		return st, fmt.Errorf("%w: %s", execio.ErrPathNotFound, src)
	}
	return st, tw.Close()
}

func (f *fakeBackend) Logs(_ context.Context, caller contract.Caller, id string, _ contract.LogsOptions) (contract.Logs, error) {
	if err := f.called("Logs"); err != nil {
		return contract.Logs{}, err
	}
	if _, err := f.get(caller, id); err != nil {
		return contract.Logs{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logs, nil
}

func (f *fakeBackend) Stop(_ context.Context, caller contract.Caller, id string) error {
	if err := f.called("Stop"); err != nil {
		return err
	}
	if _, err := f.get(caller, id); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.sandboxes, id)
	f.mu.Unlock()
	return nil
}

func (f *fakeBackend) Ready(context.Context) error { return nil }

func (f *fakeBackend) Close(context.Context) error { return nil }

// file returns a file of a sandbox, for assertions; noFile when there is
// none.
func (f *fakeBackend) file(id, p string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sandboxes[id]
	if !ok {
		return noFile
	}
	data, ok := s.files[p]
	if !ok {
		return noFile
	}
	return string(data)
}

const noFile = "<no such file>"

// putFile stores a file in a sandbox.
func (f *fakeBackend) putFile(id, p, content string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sandboxes[id]
	s.files[p] = []byte(content)
	for d := path.Dir(p); d != "/" && !s.dirs[d]; d = path.Dir(d) {
		s.dirs[d] = true
	}
}

// errFake is an error no Err* kind wraps.
var errFake = errors.New("the fake backend broke")

// has reports whether any call was made to method.
func (f *fakeBackend) has(method string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		if c == method {
			return true
		}
	}
	return false
}

// exists reports whether the sandbox exists.
func (f *fakeBackend) exists(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sandboxes[id]
	return ok
}
