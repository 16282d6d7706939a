/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/strslice"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/egress"
)

// tmpfsOpts splits a Docker tmpfs option string into a set and a key=value map.
func tmpfsOpts(s string) (flags map[string]bool, kv map[string]string) {
	flags, kv = map[string]bool{}, map[string]string{}
	for _, o := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(o, "="); ok {
			kv[k] = v
		} else {
			flags[o] = true
		}
	}
	return flags, kv
}

func ulimit(hc *container.HostConfig, name string) *container.Ulimit {
	for _, u := range hc.Ulimits {
		if u.Name == name {
			return u
		}
	}
	return nil
}

var _ = Describe("BuildContainerConfig", Label("unit"), func() {
	owner := Owner{UID: "0d3c-uid", Namespace: "team-a", Name: "box", Node: "node-1"}
	minimal := Spec{Owner: owner, Image: "example.com/img@sha256:abc"}

	Context("with only owner and image set (defaults)", func() {
		var (
			cfg *container.Config
			hc  *container.HostConfig
		)
		BeforeEach(func() {
			var err error
			cfg, hc, err = BuildContainerConfig(minimal)
			Expect(err).NotTo(HaveOccurred())
			Expect(cfg).NotTo(BeNil())
			Expect(hc).NotTo(BeNil())
		})

		It("drops every capability and adds none", func() {
			Expect(hc.CapDrop).To(Equal(strslice.StrSlice{"ALL"}))
			Expect(hc.CapAdd).To(BeEmpty())
			Expect(hc.Privileged).To(BeFalse())
		})

		It("sets exactly no-new-privileges and never unconfines seccomp/apparmor/systempaths", func() {
			Expect(hc.SecurityOpt).To(Equal([]string{"no-new-privileges:true"}))
			for _, o := range hc.SecurityOpt {
				Expect(o).NotTo(ContainSubstring("unconfined"))
				Expect(o).NotTo(HavePrefix("seccomp"))
				Expect(o).NotTo(HavePrefix("apparmor"))
			}
		})

		It("keeps Docker's masked and read-only /proc paths (nil, not empty)", func() {
			// An empty non-nil slice would make Docker clear its defaults.
			Expect(hc.MaskedPaths).To(BeNil())
			Expect(hc.ReadonlyPaths).To(BeNil())
		})

		It("makes the root filesystem read-only with sized nosuid,nodev tmpfs scratch space", func() {
			Expect(hc.ReadonlyRootfs).To(BeTrue())
			Expect(hc.Tmpfs).To(HaveLen(3))
			Expect(hc.Tmpfs).To(HaveKey(DefaultWorkingDir))
			Expect(hc.Tmpfs).To(HaveKey("/tmp"))
			Expect(hc.Tmpfs).To(HaveKey("/var/tmp"))
			for dir, opts := range hc.Tmpfs {
				flags, kv := tmpfsOpts(opts)
				Expect(flags).To(HaveKey("nosuid"), "%s: %s", dir, opts)
				Expect(flags).To(HaveKey("nodev"), "%s: %s", dir, opts)
				Expect(flags).To(HaveKey("rw"), "%s: %s", dir, opts)
				Expect(flags).NotTo(HaveKey("suid"), "%s: %s", dir, opts)
				Expect(flags).NotTo(HaveKey("dev"), "%s: %s", dir, opts)
				Expect(kv).To(HaveKeyWithValue("size", itoa64(DefaultDiskBytes)), "%s: %s", dir, opts)
			}
			// The working directory belongs to the sandbox user; the shared
			// scratch dirs are sticky.
			_, kv := tmpfsOpts(hc.Tmpfs[DefaultWorkingDir])
			Expect(kv).To(HaveKeyWithValue("uid", "65534"))
			Expect(kv).To(HaveKeyWithValue("gid", "65534"))
			_, kv = tmpfsOpts(hc.Tmpfs["/tmp"])
			Expect(kv).To(HaveKeyWithValue("mode", "1777"))
			Expect(hc.ShmSize).To(Equal(DefaultDiskBytes))
		})

		It("limits memory without swap, CPU and PIDs", func() {
			Expect(hc.Memory).To(Equal(DefaultMemoryBytes))
			Expect(hc.MemorySwap).To(Equal(hc.Memory), "MemorySwap must equal Memory (no swap)")
			Expect(hc.NanoCPUs).To(Equal(DefaultNanoCPUs))
			Expect(hc.PidsLimit).NotTo(BeNil())
			Expect(*hc.PidsLimit).To(Equal(DefaultPids))
			Expect(*hc.PidsLimit).To(BeNumerically(">", 0), "0 or -1 would be unlimited")
		})

		It("sets nofile, core and fsize ulimits", func() {
			nofile := ulimit(hc, "nofile")
			Expect(nofile).NotTo(BeNil())
			Expect(nofile.Soft).To(Equal(DefaultNoFile))
			Expect(nofile.Hard).To(Equal(DefaultNoFile))
			core := ulimit(hc, "core")
			Expect(core).NotTo(BeNil())
			Expect(core.Soft).To(BeZero())
			Expect(core.Hard).To(BeZero())
			fsize := ulimit(hc, "fsize")
			Expect(fsize).NotTo(BeNil())
			// Finite, and not below the disk budget (a full tmpfs should say
			// ENOSPC before a single file hits SIGXFSZ).
			Expect(fsize.Hard).To(BeNumerically(">=", DefaultDiskBytes))
			Expect(fsize.Hard).To(BeNumerically("<=", DefaultDiskBytes+16<<20))
			Expect(fsize.Soft).To(Equal(fsize.Hard))
			Expect(hc.Ulimits).NotTo(ContainElement(HaveField("Name", "nproc")), "nproc is per UID across containers")
		})

		It("runs an init process and never restarts or auto-removes", func() {
			Expect(hc.Init).NotTo(BeNil())
			Expect(*hc.Init).To(BeTrue())
			Expect(hc.RestartPolicy.Name).To(Equal(container.RestartPolicyDisabled))
			Expect(string(hc.RestartPolicy.Name)).To(Equal("no"))
			Expect(hc.AutoRemove).To(BeFalse())
		})

		It("has no network, and private namespaces", func() {
			Expect(string(hc.NetworkMode)).To(Equal(NetworkNone))
			Expect(hc.PidMode.IsHost()).To(BeFalse())
			Expect(string(hc.PidMode)).To(BeEmpty(), "empty PidMode is a private PID namespace")
			Expect(string(hc.IpcMode)).To(Equal("private"))
			Expect(hc.UTSMode.IsHost()).To(BeFalse())
			Expect(string(hc.UTSMode)).To(BeEmpty())
			Expect(hc.UsernsMode.IsHost()).To(BeFalse())
			Expect(string(hc.UsernsMode)).To(BeEmpty())
			Expect(hc.CgroupnsMode).To(Equal(container.CgroupnsModePrivate))
			Expect(hc.CgroupParent).To(BeEmpty())
		})

		It("exposes nothing from the host", func() {
			Expect(hc.Binds).To(BeEmpty())
			Expect(hc.VolumesFrom).To(BeEmpty())
			Expect(hc.Devices).To(BeEmpty())
			Expect(hc.DeviceRequests).To(BeEmpty())
			Expect(hc.DeviceCgroupRules).To(BeEmpty())
			Expect(hc.PortBindings).To(BeEmpty())
			Expect(hc.PublishAllPorts).To(BeFalse())
			Expect(hc.Links).To(BeEmpty())
			Expect(hc.ExtraHosts).To(BeEmpty())
			Expect(hc.Sysctls).To(BeEmpty())
			Expect(hc.StorageOpt).To(BeEmpty())
			Expect(hc.OomKillDisable).To(SatisfyAny(BeNil(), HaveValue(BeFalse())))
			// The only mount is the read-only tools volume (idle process
			// and helper).
			Expect(hc.Mounts).To(HaveLen(1))
			m := hc.Mounts[0]
			Expect(m.Type).To(Equal(mount.TypeVolume))
			Expect(m.Target).To(Equal(toolsMountPath))
			Expect(m.ReadOnly).To(BeTrue())
			Expect(m.Source).To(Equal(toolsVolumeName()))
			Expect(m.Source).NotTo(ContainSubstring("/"), "a volume, not a host path")
			Expect(m.BindOptions).To(BeNil())
			for _, mm := range hc.Mounts {
				Expect(mm.Source).NotTo(ContainSubstring("docker.sock"))
			}
		})

		It("caps the json-file log", func() {
			Expect(hc.LogConfig.Type).To(Equal("json-file"))
			Expect(hc.LogConfig.Config).To(HaveKeyWithValue("max-size", LogMaxSize))
			Expect(hc.LogConfig.Config).To(HaveKeyWithValue("max-file", "1"))
		})

		It("runs as nobody with the idle process in the working directory", func() {
			Expect(cfg.User).To(Equal("65534:65534"))
			Expect(cfg.Image).To(Equal(minimal.Image))
			Expect(cfg.WorkingDir).To(Equal(DefaultWorkingDir))
			Expect([]string(cfg.Entrypoint)).To(Equal([]string{IdleProcessPath}))
			Expect(cfg.Cmd).NotTo(BeNil(), "a nil Cmd would let Docker append the image's CMD")
			Expect(cfg.Cmd).To(BeEmpty())
			Expect(cfg.Env).To(ContainElement("HOME=" + DefaultWorkingDir))
			Expect(cfg.StopTimeout).NotTo(BeNil())
			Expect(*cfg.StopTimeout).To(Equal(10))
			Expect(hc.Runtime).To(Equal(RuntimeRunc))
		})

		It("labels the container with its owner", func() {
			Expect(cfg.Labels).To(Equal(map[string]string{
				LabelManagedBy:  ManagedByValue,
				LabelSandboxUID: owner.UID,
				LabelNamespace:  owner.Namespace,
				LabelName:       owner.Name,
				LabelNode:       owner.Node,
			}))
			Expect(Container{Labels: cfg.Labels}.Owned(owner.UID)).To(BeTrue())
			Expect(Container{Labels: cfg.Labels}.Owned("other")).To(BeFalse())
		})
	})

	It("applies explicit limits, runtime, network, user and command", func() {
		spec := minimal
		spec.Command = []string{"python3", "-c", "print(1)"}
		spec.Env = []string{"FOO=bar", "HOME=/home/me", "EMPTY="}
		spec.WorkingDir = "/work/dir"
		spec.User = "1000:2000"
		spec.NanoCPUs = 250_000_000
		spec.MemoryBytes = 64 << 20
		spec.Pids = 32
		spec.DiskBytes = 8 << 20
		spec.Network = NetworkEgress
		spec.Runtime = RuntimeRunsc
		spec.StopGracePeriod = 3 * time.Second
		cfg, hc, err := BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())

		Expect([]string(cfg.Entrypoint)).To(Equal([]string{"python3"}))
		Expect([]string(cfg.Cmd)).To(Equal([]string{"-c", "print(1)"}))
		Expect(hc.Mounts).To(Equal([]mount.Mount{toolsMount()}), "the tools volume (helper) is mounted whatever the command")
		Expect(cfg.Env).To(Equal([]string{"FOO=bar", "HOME=/home/me", "EMPTY="}), "HOME is not overridden")
		Expect(cfg.User).To(Equal("1000:2000"))
		Expect(cfg.WorkingDir).To(Equal("/work/dir"))
		Expect(*cfg.StopTimeout).To(Equal(3))
		// IPv6 off in an Egress sandbox, whatever Docker's version does
		// for an IPv4-only network (no link-local path between sandboxes).
		Expect(hc.Sysctls).To(Equal(egress.SandboxSysctls()))
		if _, err := os.Stat("/proc/net/if_inet6"); err == nil {
			Expect(hc.Sysctls).To(HaveKeyWithValue("net.ipv6.conf.all.disable_ipv6", "1"))
		}

		Expect(hc.NanoCPUs).To(Equal(int64(250_000_000)))
		Expect(hc.Memory).To(Equal(int64(64 << 20)))
		Expect(hc.MemorySwap).To(Equal(int64(64 << 20)))
		Expect(*hc.PidsLimit).To(Equal(int64(32)))
		Expect(hc.ShmSize).To(Equal(int64(8 << 20)))
		Expect(string(hc.NetworkMode)).To(Equal("code-sandbox-egress"), "egress sandboxes never use Docker's default bridge")
		Expect(hc.Runtime).To(Equal("runsc"))
		Expect(hc.Tmpfs).To(HaveLen(3))
		Expect(hc.Tmpfs).To(HaveKey("/work/dir"))
		for dir, opts := range hc.Tmpfs {
			_, kv := tmpfsOpts(opts)
			Expect(kv).To(HaveKeyWithValue("size", itoa64(8<<20)), dir)
		}
		_, kv := tmpfsOpts(hc.Tmpfs["/work/dir"])
		Expect(kv).To(HaveKeyWithValue("uid", "1000"))
		Expect(kv).To(HaveKeyWithValue("gid", "2000"))
		// Hardening does not depend on the options.
		Expect(hc.CapDrop).To(Equal(strslice.StrSlice{"ALL"}))
		Expect(hc.ReadonlyRootfs).To(BeTrue())
		Expect(hc.SecurityOpt).To(Equal([]string{"no-new-privileges:true"}))
		Expect(hc.MaskedPaths).To(BeNil())
	})

	It("uses a non-nil empty Cmd for a one-word command", func() {
		spec := minimal
		spec.Command = []string{"/bin/server"}
		cfg, _, err := BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())
		Expect([]string(cfg.Entrypoint)).To(Equal([]string{"/bin/server"}))
		Expect(cfg.Cmd).NotTo(BeNil())
		Expect(cfg.Cmd).To(BeEmpty())
	})

	It("a bare uid means gid = uid", func() {
		spec := minimal
		spec.User = "1234"
		cfg, hc, err := BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.User).To(Equal("1234"))
		_, kv := tmpfsOpts(hc.Tmpfs[DefaultWorkingDir])
		Expect(kv).To(HaveKeyWithValue("uid", "1234"))
		Expect(kv).To(HaveKeyWithValue("gid", "1234"))
	})

	It("does not modify the caller's Spec", func() {
		spec := minimal
		spec.Env = []string{"A=1"}
		_, _, err := BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(spec.Env).To(Equal([]string{"A=1"}))
		Expect(spec.WorkingDir).To(BeEmpty())
		Expect(spec.User).To(BeEmpty())
	})

	It("accepts the documented boundary values", func() {
		spec := minimal
		spec.MemoryBytes = 6 << 20
		_, hc, err := BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(hc.Memory).To(Equal(int64(6 << 20)))
	})

	DescribeTable("rejects an invalid Spec with ErrInvalidSpec naming the problem",
		func(mutate func(*Spec), wantMsg string) {
			spec := minimal
			mutate(&spec)
			cfg, hc, err := BuildContainerConfig(spec)
			Expect(err).To(HaveOccurred())
			Expect(err).To(MatchError(ErrInvalidSpec))
			Expect(err.Error()).To(ContainSubstring(wantMsg))
			Expect(cfg).To(BeNil())
			Expect(hc).To(BeNil())
		},
		Entry("missing owner UID", func(s *Spec) { s.Owner.UID = "" }, "owner UID is empty"),
		Entry("empty image", func(s *Spec) { s.Image = "" }, "image is empty"),
		Entry("blank image", func(s *Spec) { s.Image = "  \t" }, "image is empty"),
		Entry("unknown pull policy", func(s *Spec) { s.PullPolicy = "Sometimes" }, `unknown pull policy "Sometimes"`),

		Entry(`root user "0"`, func(s *Spec) { s.User = "0" }, `user "0" is root`),
		Entry(`root user "0:0"`, func(s *Spec) { s.User = "0:0" }, `user "0:0" is root`),
		Entry(`root user "00"`, func(s *Spec) { s.User = "00" }, `user "00" is root`),
		Entry(`root uid with other gid "0:1000"`, func(s *Spec) { s.User = "0:1000" }, `user "0:1000" is root`),
		Entry("user name", func(s *Spec) { s.User = "root" }, `user "root" must be a numeric uid[:gid]`),
		Entry("user name nobody", func(s *Spec) { s.User = "nobody" }, `user "nobody" must be a numeric`),
		Entry("non-numeric gid", func(s *Spec) { s.User = "1000:wheel" }, `user "1000:wheel" must be a numeric`),
		Entry("empty gid", func(s *Spec) { s.User = "1000:" }, `user "1000:" must be a numeric`),
		Entry("negative uid", func(s *Spec) { s.User = "-1" }, `user "-1" must be a numeric`),
		Entry("uid overflow", func(s *Spec) { s.User = "4294967296" }, `must be a numeric`),

		Entry("relative workingDir", func(s *Spec) { s.WorkingDir = "app" }, `workingDir "app" must be a clean absolute path`),
		Entry("unclean workingDir", func(s *Spec) { s.WorkingDir = "/app/../etc" }, `workingDir "/app/../etc" must be a clean absolute path`),
		Entry("trailing slash workingDir", func(s *Spec) { s.WorkingDir = "/app/" }, `must be a clean absolute path`),
		Entry("dot workingDir", func(s *Spec) { s.WorkingDir = "/app/." }, `must be a clean absolute path`),
		Entry("workingDir /", func(s *Spec) { s.WorkingDir = "/" }, `workingDir "/" is reserved`),
		Entry("workingDir /tmp", func(s *Spec) { s.WorkingDir = "/tmp" }, `workingDir "/tmp" is reserved`),
		Entry("workingDir /var/tmp", func(s *Spec) { s.WorkingDir = "/var/tmp" }, `workingDir "/var/tmp" is reserved`),
		Entry("workingDir /dev/shm", func(s *Spec) { s.WorkingDir = "/dev/shm" }, `is reserved`),
		Entry("workingDir /proc", func(s *Spec) { s.WorkingDir = "/proc" }, `workingDir "/proc" is reserved`),
		Entry("workingDir /etc", func(s *Spec) { s.WorkingDir = "/etc" }, `workingDir "/etc" is reserved`),
		Entry("workingDir = tools mount", func(s *Spec) { s.WorkingDir = toolsMountPath }, `is reserved`),
		Entry("workingDir under /proc", func(s *Spec) { s.WorkingDir = "/proc/x" }, `workingDir "/proc/x" is under reserved /proc/`),
		Entry("workingDir under /proc/self/fd", func(s *Spec) { s.WorkingDir = "/proc/self/fd/7" }, `is under reserved /proc/`),
		Entry("workingDir under /sys", func(s *Spec) { s.WorkingDir = "/sys/fs/cgroup" }, `is under reserved /sys/`),
		Entry("workingDir under /dev", func(s *Spec) { s.WorkingDir = "/dev/mqueue" }, `is under reserved /dev/`),
		Entry("workingDir under the tools mount", func(s *Spec) { s.WorkingDir = toolsMountPath + "/x" }, `is under reserved`),

		Entry("host network", func(s *Spec) { s.Network = "host" }, `network mode "host" is not allowed`),
		Entry("container network", func(s *Spec) { s.Network = "container:abc" }, `network mode "container:abc" is not allowed`),
		Entry("default network", func(s *Spec) { s.Network = "default" }, `network mode "default" is not allowed`),
		Entry("unknown runtime", func(s *Spec) { s.Runtime = "kata" }, `runtime "kata" is not allowed`),
		Entry("containerd runtime name", func(s *Spec) { s.Runtime = "io.containerd.runc.v2" }, `is not allowed`),

		Entry("env without '='", func(s *Spec) { s.Env = []string{"OK=1", "FOO"} }, `environment entry "FOO" is not NAME=value`),
		Entry("env with empty name", func(s *Spec) { s.Env = []string{"=bar"} }, `environment entry "=bar" is not NAME=value`),

		Entry("memory below 6MiB", func(s *Spec) { s.MemoryBytes = 6<<20 - 1 }, `is below Docker's 6MiB minimum`),
		Entry("memory 1 byte", func(s *Spec) { s.MemoryBytes = 1 }, `memory 1 is below`),
		Entry("negative memory", func(s *Spec) { s.MemoryBytes = -1 }, `must not be negative`),
		Entry("negative CPUs", func(s *Spec) { s.NanoCPUs = -1 }, `must not be negative`),
		Entry("negative pids", func(s *Spec) { s.Pids = -1 }, `must not be negative`),
		Entry("negative disk", func(s *Spec) { s.DiskBytes = -1 }, `must not be negative`),
	)
})

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

var _ = Describe("Hostname", Label("unit"), func() {
	DescribeTable("derives an RFC 1123 label from the owner",
		func(o Owner, want string) {
			h := Hostname(o)
			Expect(h).To(Equal(want))
			Expect(h).To(MatchRegexp(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`))
		},
		Entry("a name that is a label", Owner{Name: "box-1", UID: "u"}, "box-1"),
		Entry("upper case and dots", Owner{Name: "My.Box_2", UID: "u"}, "my-box-2"),
		Entry("a name of 253 characters is cut at 63", Owner{Name: strings.Repeat("a", 253)}, strings.Repeat("a", 63)),
		Entry("a cut that ends in a dash loses it", Owner{Name: strings.Repeat("a", 62) + ".b"}, strings.Repeat("a", 62)),
		Entry("no usable name: the UID", Owner{Name: "..", UID: "0D3C5A7B-1111-2222"}, "sandbox-0d3c5a7b-111"),
		Entry("nothing at all", Owner{}, "sandbox"),
		Entry("adversarial characters", Owner{Name: "a/../b\n;rm -rf"}, "a----b--rm--rf"),
	)

	It("is what the container is created with", func() {
		cfg, _, err := BuildContainerConfig(Spec{Owner: Owner{UID: "u1", Name: "child-3"}, Image: "img"})
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.Hostname).To(Equal("child-3"))
	})
})
