package mcpserver

import (
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func testConfig() Config {
	return Config{DefaultImage: "img:1", MaxLifetime: time.Hour}.withDefaults()
}

var _ = Describe("bindArgs", Label("unit"), func() {
	DescribeTable("binds a JSON object or refuses it with an argument error",
		func(raw, want string) {
			var a execArgs
			err := bindArgs([]byte(raw), &a)
			if want == "" {
				Expect(err).NotTo(HaveOccurred(), "bindArgs(%q): unexpected error", raw)
				return
			}
			Expect(err).To(MatchError(errArgs), "bindArgs(%q): want an argument error", raw)
			Expect(err).To(MatchError(ContainSubstring(want)), "bindArgs(%q): want an argument error containing %q", raw, want)
		},
		Entry("ok", `{"container_id":"abc","commands":["x"]}`, ""),
		Entry("empty", ``, ""),
		Entry("null", `null`, ""),
		Entry("unknown", `{"container_id":"abc","bogus":1}`, `unknown argument "bogus"`),
		Entry("wrong type", `{"container_id":"abc","commands":"echo"}`, `argument "commands" must be an array`),
		Entry("wrong number", `{"container_id":"abc","timeout_seconds":"soon"}`, `argument "timeout_seconds" must be an integer`),
		Entry("not an object", `[1,2]`, "must be a JSON object"),
		Entry("trailing", `{} {}`, "one JSON object"),
	)
})

func ptr[T any](v T) *T { return &v }

// createCase is one initializeArgs.createRequest case: want is a substring
// of the expected error, or "" when img is the expected image.
type createCase struct {
	cfg  Config
	args initializeArgs
	want string
	img  string
}

var _ = Describe("initializeArgs.createRequest", Label("unit"), func() {
	cfg := testConfig()
	egress := cfg
	egress.AllowEgress = true
	allowList := cfg
	allowList.AllowedImages = []string{"python:*"}

	DescribeTable("validates the arguments and picks the image",
		func(tt createCase) {
			req, err := tt.args.createRequest(tt.cfg)
			if tt.want != "" {
				Expect(err).To(MatchError(ContainSubstring(tt.want)), "want error containing %q", tt.want)
				return
			}
			Expect(err).NotTo(HaveOccurred())
			Expect(req.Image).To(Equal(tt.img), "image")
		},
		Entry("defaults", createCase{cfg: cfg, img: "img:1"}),
		Entry("image", createCase{cfg: cfg, args: initializeArgs{Image: "busybox:1"}, img: "busybox:1"}),
		Entry("cpu too high", createCase{cfg: cfg, args: initializeArgs{CPU: ptr(100.0)}, want: "cpu"}),
		Entry("cpu zero", createCase{cfg: cfg, args: initializeArgs{CPU: ptr(0.0)}, want: "cpu"}),
		Entry("memory k8s", createCase{cfg: cfg, args: initializeArgs{Memory: "256Mi"}, img: "img:1"}),
		Entry("memory docker", createCase{cfg: cfg, args: initializeArgs{Memory: "1g"}, img: "img:1"}),
		Entry("memory junk", createCase{cfg: cfg, args: initializeArgs{Memory: "lots"}, want: "memory"}),
		Entry("memory tiny", createCase{cfg: cfg, args: initializeArgs{Memory: "1Mi"}, want: "out of range"}),
		Entry("network host", createCase{cfg: cfg, args: initializeArgs{Network: "host"}, want: "network"}),
		Entry("egress disabled", createCase{cfg: cfg, args: initializeArgs{Network: "egress"}, want: "--allow-egress"}),
		Entry("egress enabled", createCase{cfg: egress, args: initializeArgs{Network: "egress"}, img: "img:1"}),
		Entry("lifetime zero", createCase{cfg: cfg, args: initializeArgs{LifetimeSeconds: ptr(int64(0))}, want: "lifetime_seconds"}),
		Entry("lifetime too long", createCase{cfg: cfg, args: initializeArgs{LifetimeSeconds: ptr(int64(7200))}, want: "lifetime_seconds"}),
		Entry("image not allowed", createCase{cfg: allowList, args: initializeArgs{Image: "evil:1"}, want: "not allowed"}),
		Entry("image allowed", createCase{cfg: allowList, args: initializeArgs{Image: "python:3"}, img: "python:3"}),
		Entry("image with space", createCase{cfg: cfg, args: initializeArgs{Image: "a b"}, want: "not an image"}),
	)

	It("converts memory and CPU and defaults the lifetime and network", func() {
		req, _ := initializeArgs{Memory: "256Mi", CPU: ptr(0.5)}.createRequest(cfg)
		Expect(req.MemoryBytes).To(Equal(int64(256<<20)), "unexpected request %+v", req)
		Expect(req.NanoCPUs).To(Equal(int64(5e8)), "unexpected request %+v", req)
		Expect(req.Lifetime).To(Equal(time.Hour), "unexpected request %+v", req)
		Expect(req.Network).To(Equal(contract.NetworkNone), "unexpected request %+v", req)
	})
})

var _ = Describe("execArgs.requests", Label("unit"), func() {
	cfg := testConfig()

	It("builds one request per command with sorted env and defaults", func() {
		ok := execArgs{ContainerID: "abc", Commands: []string{"echo 1", "echo 2"}, Env: map[string]string{"B": "2", "A": "1"}, Workdir: "/tmp"}
		reqs, err := ok.requests(cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(reqs).To(HaveLen(2), "unexpected requests %+v", reqs)
		Expect(reqs[0].Shell).To(Equal("echo 1"), "unexpected requests %+v", reqs)
		Expect(reqs[0].Env[0]).To(Equal("A=1"), "unexpected requests %+v", reqs)
		Expect(reqs[0].TimeoutSeconds).To(Equal(int64(60)), "unexpected requests %+v", reqs)
		Expect(reqs[0].OutputLimitBytes).To(Equal(cfg.OutputLimit), "unexpected requests %+v", reqs)
	})

	DescribeTable("refuses invalid arguments",
		func(args execArgs, want string) {
			_, err := args.requests(cfg)
			Expect(err).To(MatchError(ContainSubstring(want)), "want error containing %q", want)
		},
		Entry("no id", execArgs{Commands: []string{"x"}}, "container_id"),
		Entry("bad id", execArgs{ContainerID: "../x", Commands: []string{"x"}}, "container_id"),
		Entry("no commands", execArgs{ContainerID: "a"}, "commands"),
		Entry("empty command", execArgs{ContainerID: "a", Commands: []string{" "}}, "commands[0] is empty"),
		Entry("timeout negative", execArgs{ContainerID: "a", Commands: []string{"x"}, TimeoutSeconds: ptr(int64(-1))}, "timeout_seconds"),
		Entry("timeout huge", execArgs{ContainerID: "a", Commands: []string{"x"}, TimeoutSeconds: ptr(int64(1 << 40))}, "timeout_seconds"),
		Entry("relative workdir", execArgs{ContainerID: "a", Commands: []string{"x"}, Workdir: "app"}, "absolute"),
		Entry("proc workdir", execArgs{ContainerID: "a", Commands: []string{"x"}, Workdir: "/proc/self/fd/7"}, "/proc"),
		Entry("dotdot workdir", execArgs{ContainerID: "a", Commands: []string{"x"}, Workdir: "/app/../etc"}, ".."),
		Entry("bad env", execArgs{ContainerID: "a", Commands: []string{"x"}, Env: map[string]string{"1X": "y"}}, "variable name"),
		Entry("NUL", execArgs{ContainerID: "a", Commands: []string{"a\x00b"}}, "NUL"),
		Entry("too many", execArgs{ContainerID: "a", Commands: make([]string, MaxCommandsPerExec+1)}, "limit"),
	)
})

var _ = Describe("execArgs.yieldAfter", Label("unit"), func() {
	long := testConfig()
	long.CommandTimeout = 5 * time.Minute
	DescribeTable("yields by default only a command that may outlive a 60 s client cap",
		func(cfg Config, a execArgs, want time.Duration) {
			got, err := a.yieldAfter(cfg)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(want))
		},
		Entry("the shipped 60 s default: the quick path", testConfig(), execArgs{}, time.Duration(0)),
		Entry("timeout_seconds 45: never past the yield", testConfig(), execArgs{TimeoutSeconds: ptr[int64](45)}, time.Duration(0)),
		Entry("timeout_seconds 46", testConfig(), execArgs{TimeoutSeconds: ptr[int64](46)}, DefaultYieldAfter),
		Entry("timeout_seconds 300", testConfig(), execArgs{TimeoutSeconds: ptr[int64](300)}, DefaultYieldAfter),
		Entry("--command-timeout 5m, no timeout_seconds", long, execArgs{}, DefaultYieldAfter),
		Entry("--command-timeout 5m, timeout_seconds 30", long, execArgs{TimeoutSeconds: ptr[int64](30)}, time.Duration(0)),
		Entry("yield_after_seconds 0: never", long, execArgs{YieldAfterSeconds: ptr[int64](0)}, time.Duration(0)),
		Entry("yield_after_seconds 5 on a short command", testConfig(), execArgs{YieldAfterSeconds: ptr[int64](5)}, 5*time.Second),
	)
	It("refuses a yield_after_seconds out of range", func() {
		_, err := execArgs{YieldAfterSeconds: ptr[int64](-1)}.yieldAfter(testConfig())
		Expect(err).To(MatchError(ContainSubstring("yield_after_seconds -1 is out of range")))
	})
})

var _ = Describe("sandboxFilePath", Label("unit"), func() {
	DescribeTable("splits a sandbox file path or refuses it",
		func(in, dir, base, want string) {
			gotDir, gotBase, err := sandboxFilePath("dest_path", in)
			if want != "" {
				Expect(err).To(MatchError(ContainSubstring(want)), "%q: want error containing %q", in, want)
				return
			}
			Expect(err).NotTo(HaveOccurred(), "%q", in)
			Expect(gotDir).To(Equal(dir), "%q: dir", in)
			Expect(gotBase).To(Equal(base), "%q: base", in)
		},
		Entry("a relative file", "a.py", ".", "a.py", ""),
		Entry("an absolute file", "/app/src/a.py", "/app/src", "a.py", ""),
		Entry("a directory", "src/", "", "", "must name a file"),
		Entry("a traversal", "../../etc/passwd", "", "", ".."),
		Entry("an empty path", "", "", "", "required"),
		Entry("the root", "/", "", "", "must name a file"),
	)
})

var _ = Describe("completeUTF8", Label("unit"), func() {
	It("never splits a multi-byte character", func() {
		euro := []byte("a€") // € is 3 bytes
		for n := 1; n <= len(euro); n++ {
			got := completeUTF8(euro[:n])
			want := 1
			if n == len(euro) {
				want = n
			}
			Expect(got).To(Equal(want), "completeUTF8(%q)", euro[:n])
		}
	})

	It("passes invalid bytes through", func() {
		Expect(completeUTF8([]byte{0xff, 0xfe})).To(Equal(2), "invalid bytes must pass through")
	})
})
