package mcpserver

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func testConfig() Config {
	return Config{DefaultImage: "img:1", MaxLifetime: time.Hour}.withDefaults()
}

func TestBindArgs(t *testing.T) {
	tests := []struct {
		name, raw, want string
	}{
		{"ok", `{"container_id":"abc","commands":["x"]}`, ""},
		{"empty", ``, ""},
		{"null", `null`, ""},
		{"unknown", `{"container_id":"abc","bogus":1}`, `unknown argument "bogus"`},
		{"wrong type", `{"container_id":"abc","commands":"echo"}`, `argument "commands" must be an array`},
		{"wrong number", `{"container_id":"abc","timeout_seconds":"soon"}`, `argument "timeout_seconds" must be an integer`},
		{"not an object", `[1,2]`, "must be a JSON object"},
		{"trailing", `{} {}`, "one JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a execArgs
			err := bindArgs([]byte(tt.raw), &a)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, errArgs) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an argument error containing %q", err, tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestCreateRequest(t *testing.T) {
	cfg := testConfig()
	egress := cfg
	egress.AllowEgress = true
	allowList := cfg
	allowList.AllowedImages = []string{"python:*"}
	tests := []struct {
		name string
		cfg  Config
		args initializeArgs
		want string
		img  string
	}{
		{name: "defaults", cfg: cfg, img: "img:1"},
		{name: "image", cfg: cfg, args: initializeArgs{Image: "busybox:1"}, img: "busybox:1"},
		{name: "cpu too high", cfg: cfg, args: initializeArgs{CPU: ptr(100.0)}, want: "cpu"},
		{name: "cpu zero", cfg: cfg, args: initializeArgs{CPU: ptr(0.0)}, want: "cpu"},
		{name: "memory k8s", cfg: cfg, args: initializeArgs{Memory: "256Mi"}, img: "img:1"},
		{name: "memory docker", cfg: cfg, args: initializeArgs{Memory: "1g"}, img: "img:1"},
		{name: "memory junk", cfg: cfg, args: initializeArgs{Memory: "lots"}, want: "memory"},
		{name: "memory tiny", cfg: cfg, args: initializeArgs{Memory: "1Mi"}, want: "out of range"},
		{name: "network host", cfg: cfg, args: initializeArgs{Network: "host"}, want: "network"},
		{name: "egress disabled", cfg: cfg, args: initializeArgs{Network: "egress"}, want: "--allow-egress"},
		{name: "egress enabled", cfg: egress, args: initializeArgs{Network: "egress"}, img: "img:1"},
		{name: "lifetime zero", cfg: cfg, args: initializeArgs{LifetimeSeconds: ptr(int64(0))}, want: "lifetime_seconds"},
		{name: "lifetime too long", cfg: cfg, args: initializeArgs{LifetimeSeconds: ptr(int64(7200))}, want: "lifetime_seconds"},
		{name: "image not allowed", cfg: allowList, args: initializeArgs{Image: "evil:1"}, want: "not allowed"},
		{name: "image allowed", cfg: allowList, args: initializeArgs{Image: "python:3"}, img: "python:3"},
		{name: "image with space", cfg: cfg, args: initializeArgs{Image: "a b"}, want: "not an image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := tt.args.createRequest(tt.cfg)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("got %v, want error containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req.Image != tt.img {
				t.Fatalf("image %q, want %q", req.Image, tt.img)
			}
		})
	}
	req, _ := initializeArgs{Memory: "256Mi", CPU: ptr(0.5)}.createRequest(cfg)
	if req.MemoryBytes != 256<<20 || req.NanoCPUs != 5e8 || req.Lifetime != time.Hour || req.Network != NetworkNone {
		t.Fatalf("unexpected request %+v", req)
	}
}

func TestExecRequests(t *testing.T) {
	cfg := testConfig()
	ok := execArgs{ContainerID: "abc", Commands: []string{"echo 1", "echo 2"}, Env: map[string]string{"B": "2", "A": "1"}, Workdir: "/tmp"}
	reqs, err := ok.requests(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[0].Shell != "echo 1" || reqs[0].Env[0] != "A=1" || reqs[0].TimeoutSeconds != 60 || reqs[0].OutputLimitBytes != cfg.OutputLimit {
		t.Fatalf("unexpected requests %+v", reqs)
	}
	tests := []struct {
		name string
		args execArgs
		want string
	}{
		{"no id", execArgs{Commands: []string{"x"}}, "container_id"},
		{"bad id", execArgs{ContainerID: "../x", Commands: []string{"x"}}, "container_id"},
		{"no commands", execArgs{ContainerID: "a"}, "commands"},
		{"empty command", execArgs{ContainerID: "a", Commands: []string{" "}}, "commands[0] is empty"},
		{"timeout negative", execArgs{ContainerID: "a", Commands: []string{"x"}, TimeoutSeconds: ptr(int64(-1))}, "timeout_seconds"},
		{"timeout huge", execArgs{ContainerID: "a", Commands: []string{"x"}, TimeoutSeconds: ptr(int64(1 << 40))}, "timeout_seconds"},
		{"relative workdir", execArgs{ContainerID: "a", Commands: []string{"x"}, Workdir: "app"}, "absolute"},
		{"proc workdir", execArgs{ContainerID: "a", Commands: []string{"x"}, Workdir: "/proc/self/fd/7"}, "/proc"},
		{"dotdot workdir", execArgs{ContainerID: "a", Commands: []string{"x"}, Workdir: "/app/../etc"}, ".."},
		{"bad env", execArgs{ContainerID: "a", Commands: []string{"x"}, Env: map[string]string{"1X": "y"}}, "variable name"},
		{"NUL", execArgs{ContainerID: "a", Commands: []string{"a\x00b"}}, "NUL"},
		{"too many", execArgs{ContainerID: "a", Commands: make([]string, MaxCommandsPerExec+1)}, "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.args.requests(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestSandboxFilePath(t *testing.T) {
	for _, tt := range []struct{ in, dir, base, want string }{
		{in: "a.py", dir: ".", base: "a.py"},
		{in: "/app/src/a.py", dir: "/app/src", base: "a.py"},
		{in: "src/", want: "must name a file"},
		{in: "../../etc/passwd", want: ".."},
		{in: "", want: "required"},
		{in: "/", want: "must name a file"},
	} {
		dir, base, err := sandboxFilePath("dest_path", tt.in)
		if tt.want != "" {
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%q: got %v, want error containing %q", tt.in, err, tt.want)
			}
			continue
		}
		if err != nil || dir != tt.dir || base != tt.base {
			t.Errorf("%q: got %q %q %v", tt.in, dir, base, err)
		}
	}
}

func TestCompleteUTF8(t *testing.T) {
	euro := []byte("a€") // € is 3 bytes
	for n := 1; n <= len(euro); n++ {
		got := completeUTF8(euro[:n])
		want := 1
		if n == len(euro) {
			want = n
		}
		if got != want {
			t.Errorf("completeUTF8(%q) = %d, want %d", euro[:n], got, want)
		}
	}
	if got := completeUTF8([]byte{0xff, 0xfe}); got != 2 {
		t.Errorf("invalid bytes must pass through, got %d", got)
	}
}
