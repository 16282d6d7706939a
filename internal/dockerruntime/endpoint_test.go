package dockerruntime

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("FindEndpoint", Label("unit"), func() {
	var (
		home    string
		vars    map[string]string
		sockets map[string]bool
		goos    string
	)
	BeforeEach(func() {
		home = GinkgoT().TempDir()
		vars = map[string]string{}
		sockets = map[string]bool{}
		goos = "linux"
	})
	find := func(host string) (Endpoint, error) {
		return findEndpoint(host, endpointEnv{
			getenv: func(k string) string { return vars[k] },
			home:   home,
			goos:   goos,
			exists: func(p string) bool { return sockets[p] },
		})
	}
	write := func(path, body string) {
		GinkgoHelper()
		Expect(os.MkdirAll(filepath.Dir(path), 0o755)).To(Succeed())
		Expect(os.WriteFile(path, []byte(body), 0o600)).To(Succeed())
	}
	storeID := func(name string) string {
		sum := sha256.Sum256([]byte(name))
		return hex.EncodeToString(sum[:])
	}
	// addContext writes a context the way `docker context create` does.
	addContext := func(configDir, name, host string) string {
		GinkgoHelper()
		write(filepath.Join(configDir, "contexts", "meta", storeID(name), "meta.json"),
			`{"Name":"`+name+`","Metadata":{"Description":"test"},"Endpoints":{"docker":{"Host":"`+host+`","SkipTLSVerify":false}}}`)
		return filepath.Join(configDir, "contexts", "tls", storeID(name), "docker")
	}

	It("takes an explicit host first, then DOCKER_HOST, over any context", func() {
		addContext(filepath.Join(home, ".docker"), "remote", "tcp://remote:2376")
		write(filepath.Join(home, ".docker", "config.json"), `{"currentContext":"remote"}`)
		vars["DOCKER_CONTEXT"] = "remote"
		vars["DOCKER_HOST"] = "tcp://from-env:2375"
		ep, err := find("unix:///flag.sock")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep).To(Equal(Endpoint{Host: "unix:///flag.sock", Source: "--docker-host"}))
		ep, err = find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep).To(Equal(Endpoint{Host: "tcp://from-env:2375", Source: "DOCKER_HOST"}))
	})

	It("reads the context named by DOCKER_CONTEXT before config.json's, with its TLS material", func() {
		configDir := filepath.Join(home, "elsewhere")
		vars["DOCKER_CONFIG"] = configDir
		addContext(configDir, "desktop-linux", "unix:///Users/me/.docker/run/docker.sock")
		tlsDir := addContext(configDir, "remote", "tcp://remote:2376")
		for _, f := range []string{"ca.pem", "cert.pem", "key.pem"} {
			write(filepath.Join(tlsDir, f), "pem")
		}
		write(filepath.Join(configDir, "config.json"), `{"auths":{},"currentContext":"desktop-linux"}`)

		ep, err := find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep.Host).To(Equal("unix:///Users/me/.docker/run/docker.sock"))
		Expect(ep.Source).To(Equal(`context "desktop-linux" (currentContext in ` + filepath.Join(configDir, "config.json") + `)`))
		Expect(ep.CAFile).To(BeEmpty())

		vars["DOCKER_CONTEXT"] = "remote"
		ep, err = find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep).To(Equal(Endpoint{
			Host: "tcp://remote:2376", Source: `context "remote" (DOCKER_CONTEXT)`,
			CAFile: filepath.Join(tlsDir, "ca.pem"), CertFile: filepath.Join(tlsDir, "cert.pem"), KeyFile: filepath.Join(tlsDir, "key.pem"),
		}))
	})

	It("uses the platform's default for the default context or no configuration", func() {
		ep, err := find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep).To(Equal(Endpoint{Host: "unix:///var/run/docker.sock", Source: "the default", Tried: []string{"/var/run/docker.sock"}}))
		Expect(ep.String()).To(Equal("unix:///var/run/docker.sock (from the default; nothing at /var/run/docker.sock)"))

		vars["DOCKER_CONTEXT"] = "default"
		sockets["/var/run/docker.sock"] = true
		ep, err = find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep).To(Equal(Endpoint{Host: "unix:///var/run/docker.sock", Source: "the default"}))

		goos = "windows"
		ep, err = find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep.Host).To(Equal("npipe:////./pipe/docker_engine"))
	})

	It("finds Docker Desktop's per-user socket on macOS when the system one is absent", func() {
		goos = "darwin"
		desktop := filepath.Join(home, ".docker", "run", "docker.sock")
		ep, err := find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep.Host).To(Equal("unix:///var/run/docker.sock"))
		Expect(ep.String()).To(ContainSubstring("nothing at /var/run/docker.sock or " + desktop))

		sockets[desktop] = true
		ep, err = find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep.Host).To(Equal("unix://" + desktop))

		sockets["/var/run/docker.sock"] = true
		ep, err = find("")
		Expect(err).NotTo(HaveOccurred())
		Expect(ep.Host).To(Equal("unix:///var/run/docker.sock"))
	})

	DescribeTable("refuses a context it cannot use, naming it",
		func(setup func(configDir string), want string) {
			configDir := filepath.Join(home, ".docker")
			setup(configDir)
			_, err := find("")
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("a missing context", func(string) { vars["DOCKER_CONTEXT"] = "gone" },
			`Docker context "gone" (from DOCKER_CONTEXT) does not exist`),
		Entry("a malformed config.json", func(d string) { write(filepath.Join(d, "config.json"), `{"currentContext":`) },
			"config.json: unexpected end of JSON input"),
		Entry("a malformed meta.json", func(d string) {
			vars["DOCKER_CONTEXT"] = "bad"
			write(filepath.Join(d, "contexts", "meta", storeID("bad"), "meta.json"), `[]`)
		}, `Docker context "bad" (from DOCKER_CONTEXT)`),
		Entry("a meta.json of another context", func(d string) {
			vars["DOCKER_CONTEXT"] = "mine"
			write(filepath.Join(d, "contexts", "meta", storeID("mine"), "meta.json"), `{"Name":"theirs","Endpoints":{"docker":{"Host":"tcp://x:1"}}}`)
		}, `names the context "theirs"`),
		Entry("a context without a Docker endpoint", func(d string) {
			vars["DOCKER_CONTEXT"] = "k8s"
			write(filepath.Join(d, "contexts", "meta", storeID("k8s"), "meta.json"), `{"Name":"k8s","Endpoints":{"kubernetes":{"Host":"https://k"}}}`)
		}, `has no Docker endpoint`),
		Entry("a context that skips TLS verification", func(d string) {
			vars["DOCKER_CONTEXT"] = "insecure"
			write(filepath.Join(d, "contexts", "meta", storeID("insecure"), "meta.json"), `{"Name":"insecure","Endpoints":{"docker":{"Host":"tcp://x:2376","SkipTLSVerify":true}}}`)
		}, `skips TLS verification`),
		Entry("a certificate without its key", func(d string) {
			vars["DOCKER_CONTEXT"] = "half"
			tlsDir := addContext(d, "half", "tcp://x:2376")
			write(filepath.Join(tlsDir, "cert.pem"), "pem")
		}, `only one of cert.pem and key.pem`),
	)
})

var _ = Describe("New", Label("unit"), func() {
	It("names the endpoint and where it came from when the Engine does not answer", func() {
		dir := GinkgoT().TempDir()
		GinkgoT().Setenv("DOCKER_HOST", "")
		GinkgoT().Setenv("DOCKER_CONFIG", dir)
		GinkgoT().Setenv("DOCKER_CONTEXT", "")
		sum := sha256.Sum256([]byte("nowhere"))
		meta := filepath.Join(dir, "contexts", "meta", hex.EncodeToString(sum[:]), "meta.json")
		Expect(os.MkdirAll(filepath.Dir(meta), 0o755)).To(Succeed())
		Expect(os.WriteFile(meta, []byte(`{"Name":"nowhere","Endpoints":{"docker":{"Host":"unix:///nonexistent/nowhere.sock"}}}`), 0o600)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"currentContext":"nowhere"}`), 0o600)).To(Succeed())
		c, err := New(Options{CallTimeout: 5e9})
		Expect(err).NotTo(HaveOccurred())
		defer c.Close()
		Expect(c.Host()).To(Equal("unix:///nonexistent/nowhere.sock"))
		err = c.Ping(GinkgoT().Context())
		Expect(err).To(MatchError(ErrUnavailable))
		Expect(err).To(MatchError(ContainSubstring(`pinging the Docker Engine at unix:///nonexistent/nowhere.sock (from context "nowhere" (currentContext in ` + filepath.Join(dir, "config.json") + `))`)))
	})
})

var _ = Describe("FindEndpoint without a home", Label("unit"), func() {
	It("reads no configuration relative to the working directory (a container without HOME)", func() {
		wd := GinkgoT().TempDir()
		GinkgoT().Chdir(wd)
		Expect(os.MkdirAll(filepath.Join(wd, ".docker"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(wd, ".docker", "config.json"), []byte(`{"currentContext":"planted"}`), 0o600)).To(Succeed())
		ep, err := findEndpoint("", endpointEnv{getenv: func(string) string { return "" }, goos: "linux", exists: func(string) bool { return true }})
		Expect(err).NotTo(HaveOccurred())
		Expect(ep).To(Equal(Endpoint{Host: "unix:///var/run/docker.sock", Source: "the default"}))
	})
})
