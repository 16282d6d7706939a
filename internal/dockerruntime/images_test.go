/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// RegistrySecret is what the fake registry answers with; it must never
// appear in an error a tenant can see.
const RegistrySecret = "SECRET-BODY-123"

// FakeRegistry is a real listener on 127.0.0.1 that records every request.
// It answers the API version check (/v2/) as a registry does, and every
// other request with Status and a registry-style JSON error whose message
// is RegistrySecret, which the daemon copies into its pull error.
type FakeRegistry struct {
	// Host is "127.0.0.1:PORT".
	Host   string
	Status int
	mu     sync.Mutex
	reqs   []string
}

// Requests returns the request lines seen so far.
func (f *FakeRegistry) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reqs...)
}

func startFakeRegistry(status int) *FakeRegistry {
	GinkgoHelper()
	f := &FakeRegistry{Status: status}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
			w.WriteHeader(http.StatusOK)
			return
		}
		code := map[int]string{http.StatusNotFound: "MANIFEST_UNKNOWN", http.StatusUnauthorized: "UNAUTHORIZED"}[f.Status]
		if code == "" {
			code = "UNKNOWN"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.Status)
		_, _ = fmt.Fprintf(w, `{"errors":[{"code":%q,"message":"%s internal data of the node's network","detail":"%s"}]}`, code, RegistrySecret, RegistrySecret)
	}))
	DeferCleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	Expect(err).NotTo(HaveOccurred())
	f.Host = u.Host
	Expect(f.Host).To(HavePrefix("127.0.0.1:"))
	return f
}

// clientWithPolicy is a fresh client whose image policy allows the listed
// registries besides public ones.
func clientWithPolicy(allowed ...string) *Client {
	GinkgoHelper()
	policy, err := imagepolicy.New(allowed, true)
	Expect(err).NotTo(HaveOccurred())
	c, err := New(Options{CallTimeout: 30 * time.Second, PullTimeout: 30 * time.Second, ImagePolicy: policy})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(c.Close)
	return c
}

var _ = Describe("Image registry policy", dockerLabel, func() {
	It("refuses a loopback registry by default, before any request reaches it, even for a present image", func(ctx SpecContext) {
		reg := startFakeRegistry(http.StatusInternalServerError)
		ref := reg.Host + "/team/app:1"
		for _, policy := range []PullPolicy{PullIfNotPresent, PullAlways, PullNever} {
			err := rt.EnsureImage(ctx, ref, policy)
			Expect(err).To(MatchError(ErrImageNotAllowed), "policy %s", policy)
			Expect(err).NotTo(MatchError(ErrImagePullFailed))
			Expect(err.Error()).To(ContainSubstring("loopback"))
		}
		spec := baseSpec(newUID())
		spec.Image = ref
		spec.PullPolicy = PullAlways
		_, err := rt.CreateAndStart(ctx, spec)
		Expect(err).To(MatchError(ErrImageNotAllowed))
		Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(BeEmpty())

		// A locally present image under a loopback registry's name is
		// refused too: the policy is about the reference, not the pull.
		tagged := reg.Host + "/present/busybox:" + randid.Hex(4)
		Expect(rt.Docker().ImageTag(ctx, busyboxImage, tagged)).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			_, _ = rt.Docker().ImageRemove(ctx, tagged, image.RemoveOptions{})
		})
		Expect(rt.EnsureImage(ctx, tagged, PullNever)).To(MatchError(ErrImageNotAllowed))

		Consistently(reg.Requests).WithTimeout(time.Second).Should(BeEmpty(), "the refused registry was contacted")
	}, SpecTimeout(60*time.Second))

	DescribeTable("pulls from a listed loopback registry and reports the failure class, never the response body",
		func(ctx SpecContext, status int, class PullFailure, rawCarriesBody bool) {
			reg := startFakeRegistry(status)
			c := clientWithPolicy(reg.Host)
			ref := reg.Host + "/team/app:1"
			err := c.EnsureImage(ctx, ref, PullIfNotPresent)
			Expect(reg.Requests()).NotTo(BeEmpty(), "the listed registry was never contacted")
			Expect(err).To(MatchError(ErrImagePullFailed))
			Expect(err).To(MatchError(ErrImageNotFound))
			Expect(err).NotTo(MatchError(ErrUnavailable))
			var pe *PullError
			Expect(errors.As(err, &pe)).To(BeTrue())
			Expect(pe.Class).To(Equal(class), "raw: %v", pe.Detail)
			Expect(err.Error()).To(Equal("ImagePullFailed: " + string(class) + " (pulling " + ref + ")"))
			Expect(err.Error()).NotTo(ContainSubstring(RegistrySecret))
			// The daemon's own text, kept for the operator's log, does carry
			// the registry's response: that is what must not reach tenants.
			if rawCarriesBody {
				Expect(pe.Detail).To(MatchError(ContainSubstring(RegistrySecret)), "the fake registry's body did not reach the daemon's error; the test proves nothing")
			}

			spec := baseSpec(newUID())
			spec.Image = ref
			spec.PullPolicy = PullIfNotPresent
			_, err = c.CreateAndStart(ctx, spec)
			Expect(err).To(MatchError(ErrImagePullFailed))
			Expect(err.Error()).NotTo(ContainSubstring(RegistrySecret))
			Expect(containersWithUIDLabel(ctx, spec.Owner.UID)).To(BeEmpty())
		},
		// Docker 20.10 quotes the registry's error message for 404 and 401
		// but not for 500; other versions differ, hence the flag.
		Entry("a server error", http.StatusInternalServerError, PullRegistryRefused, false, SpecTimeout(90*time.Second)),
		Entry("a missing manifest", http.StatusNotFound, PullImageNotFound, true, SpecTimeout(90*time.Second)),
		Entry("a refused login", http.StatusUnauthorized, PullUnauthorized, true, SpecTimeout(90*time.Second)))

	It("names an unreachable registry as such", func(ctx SpecContext) {
		c := clientWithPolicy("127.0.0.1:1")
		err := c.EnsureImage(ctx, "127.0.0.1:1/nope:latest", PullAlways)
		var pe *PullError
		Expect(errors.As(err, &pe)).To(BeTrue(), "error: %v", err)
		Expect(pe.Class).To(Equal(PullRegistryUnreachable), "raw: %v", pe.Detail)
	}, SpecTimeout(60*time.Second))
})

var _ = Describe("The tools volume filler", dockerLabel, func() {
	It("is a container of the trusted filler image, never of the tenant's image", func(ctx SpecContext) {
		// A fresh client has not verified the tools volume, so its first
		// create goes through the filler.
		c, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)

		since := time.Now().Add(-time.Second)
		spec := baseSpec(newUID())
		ct, err := c.CreateAndStart(ctx, spec)
		Expect(err).NotTo(HaveOccurred())
		until := time.Now().Add(time.Second)

		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		msgs, errs := rt.Docker().Events(ectx, events.ListOptions{
			Since: since.Format(time.RFC3339Nano), Until: until.Format(time.RFC3339Nano),
			Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)), filters.Arg("event", string(events.ActionCreate))),
		})
		// Other runs may share the Docker Engine; the filler containers are
		// those labelled as the tools filler (event attributes carry the
		// container's labels).
		type created struct{ id, image, name, managedBy string }
		var all []created
	collect:
		for {
			select {
			case m := <-msgs:
				all = append(all, created{m.Actor.ID, m.Actor.Attributes["image"], m.Actor.Attributes["name"], m.Actor.Attributes[LabelManagedBy]})
			case err := <-errs:
				if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "EOF") {
					Expect(err).NotTo(HaveOccurred())
				}
				break collect
			}
		}
		// Other processes sharing the Engine create fillers too, so ours is
		// found by the image ID our client verified.
		var ours int
		for _, e := range all {
			if e.managedBy == ManagedByValue+"-tools" {
				if e.image == c.fillerID {
					ours++
				}
				Expect(e.image).NotTo(Equal(busyboxImage), "tools filler %s was created from the tenant's image", e.name)
			}
		}
		Expect(c.fillerID).To(HavePrefix("sha256:"))
		Expect(ours).To(BeNumerically(">=", 1), "no filler container was created from the verified image ID %s: %+v", c.fillerID, all)

		img, err := rt.Docker().ImageInspect(ctx, c.fillerID)
		Expect(err).NotTo(HaveOccurred())
		Expect(img.Config).NotTo(BeNil())
		Expect(img.Config.Cmd).To(Equal([]string{fillerEntrypoint}))
		Expect(img.RootFS.Layers).To(HaveLen(1))
		Expect(sh(ctx, ct.ID, "echo ok").Stdout).To(Equal("ok\n"))
	}, SpecTimeout(60*time.Second))
})

// The tools filler's tag is a public name: a tenant's pull with
// imagePullPolicy Always of code-sandbox-operator/tools-filler:<hash>
// re-points it on the node. Re-tagging the busybox test image stands in for
// that pull.
var _ = Describe("The tools volume filler image", dockerLabel, func() {
	retagAsFiller := func(ctx context.Context) string {
		GinkgoHelper()
		bb, err := rt.Docker().ImageInspect(ctx, busyboxImage)
		Expect(err).NotTo(HaveOccurred())
		Expect(rt.Docker().ImageTag(ctx, busyboxImage, ToolsFillerImage())).To(Succeed())
		return bb.ID
	}

	It("is found by content and used by ID, so a tenant re-pointing its tag changes nothing the manager runs", func(ctx SpecContext) {
		// Other processes share the Engine: leave the tag on the filler.
		DeferCleanup(func(ctx context.Context) {
			fresh, err := New(Options{CallTimeout: 30 * time.Second})
			Expect(err).NotTo(HaveOccurred())
			defer fresh.Close()
			fresh.toolsMu.Lock()
			defer fresh.toolsMu.Unlock()
			_, err = fresh.ensureFillerImage(ctx)
			Expect(err).NotTo(HaveOccurred())
		})
		tenantID := retagAsFiller(ctx)
		// A fresh client (a restarted manager) finds the tag on the
		// tenant's image: it imports the filler again rather than use it.
		c, err := New(Options{CallTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		c.toolsMu.Lock()
		id, err := c.ensureFillerImage(ctx)
		c.toolsMu.Unlock()
		Expect(err).NotTo(HaveOccurred())
		Expect(id).NotTo(Equal(tenantID))
		img, err := rt.Docker().ImageInspect(ctx, id)
		Expect(err).NotTo(HaveOccurred())
		Expect(fillerImageOK(img)).To(BeTrue(), "%+v", img.Config)
		Expect(img.RootFS.Layers).To(Equal([]string{fillerDiffID()}))

		// Re-pointed again after the client verified it: the client keeps
		// the ID it verified, whatever the tag now names.
		Expect(retagAsFiller(ctx)).To(Equal(tenantID))
		c.toolsMu.Lock()
		again, err := c.ensureFillerImage(ctx)
		c.toolsMu.Unlock()
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(Equal(id))

		// And the filler container a create makes is of that image.
		c.toolsCreatedAt = ""
		since := time.Now().Add(-time.Second)
		ct, err := c.CreateAndStart(ctx, baseSpec(newUID()))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx context.Context) { _ = c.Remove(ctx, ct.ID, 0) })
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		msgs, errs := rt.Docker().Events(ectx, events.ListOptions{
			Since: since.Format(time.RFC3339Nano), Until: time.Now().Add(time.Second).Format(time.RFC3339Nano),
			Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)), filters.Arg("event", string(events.ActionCreate)),
				filters.Arg("label", LabelManagedBy+"="+ManagedByValue+"-tools")),
		})
		var images []string
	collect:
		for {
			select {
			case m := <-msgs:
				images = append(images, m.Actor.Attributes["image"])
			case err := <-errs:
				GinkgoWriter.Printf("the event stream ended: %v\n", err)
				break collect
			}
		}
		Expect(images).NotTo(BeEmpty())
		Expect(images).To(ContainElement(id))
		Expect(images).NotTo(ContainElement(ContainSubstring(tenantID[len("sha256:"):])))
	}, SpecTimeout(90*time.Second))
})

// importedNoPathImage returns an image made with `docker import` from the
// busybox test image's filesystem: like debootstrap-built and imported
// images, its configuration has no Env, so no PATH.
func importedNoPathImage(ctx context.Context) string {
	GinkgoHelper()
	ref := "code-sandbox-test/busybox-imported:1"
	if img, err := rt.Docker().ImageInspect(ctx, ref); err == nil && img.Config != nil && len(img.Config.Env) == 0 {
		return ref
	}
	created, err := rt.Docker().ContainerCreate(ctx, &container.Config{Image: busyboxImage, Cmd: []string{"true"}},
		&container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	Expect(err).NotTo(HaveOccurred())
	defer func() {
		_ = rt.Docker().ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
	}()
	rc, err := rt.Docker().ContainerExport(ctx, created.ID)
	Expect(err).NotTo(HaveOccurred())
	defer rc.Close()
	out, err := rt.Docker().ImageImport(ctx, image.ImportSource{Source: rc, SourceName: "-"}, ref, image.ImportOptions{})
	Expect(err).NotTo(HaveOccurred())
	Expect(drainPull(out)).To(Succeed())
	img, err := rt.Docker().ImageInspect(ctx, ref)
	Expect(err).NotTo(HaveOccurred())
	if img.Config != nil {
		Expect(img.Config.Env).To(BeEmpty())
	}
	return ref
}

var _ = Describe("Images without PATH", dockerLabel, func() {
	It("get the standard default PATH, so commands run by name; a PATH in the spec wins", func(ctx SpecContext) {
		ref := importedNoPathImage(ctx)
		ct, _ := startSandbox(ctx, func(s *Spec) { s.Image = ref })
		inspect, err := rt.Docker().ContainerInspect(ctx, ct.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(inspect.Config.Env).To(ContainElement("PATH=" + DefaultPathEnv))

		res := runCmd(ctx, ct.ID, execio.Request{Command: []string{"sh", "-c", "echo $PATH"}})
		Expect(res.Err).NotTo(HaveOccurred())
		Expect(res.Result.ExitCode).To(Equal(0), "%+v", res)
		Expect(res.Stdout).To(Equal(DefaultPathEnv + "\n"))

		custom, _ := startSandbox(ctx, func(s *Spec) {
			s.Image = ref
			s.Env = []string{"PATH=/bin"}
		})
		inspect, err = rt.Docker().ContainerInspect(ctx, custom.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(inspect.Config.Env).To(ContainElement("PATH=/bin"))
		Expect(inspect.Config.Env).NotTo(ContainElement("PATH=" + DefaultPathEnv))
		res = runCmd(ctx, custom.ID, execio.Request{Command: []string{"sh", "-c", "echo $PATH"}})
		Expect(res.Stdout).To(Equal("/bin\n"), "%+v", res)

		// An image that sets its own PATH keeps it untouched.
		own, _ := startSandbox(ctx, nil)
		inspect, err = rt.Docker().ContainerInspect(ctx, own.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Count(strings.Join(inspect.Config.Env, "\n"), "PATH=")).To(Equal(1))
	}, SpecTimeout(90*time.Second))
})

var _ = Describe("Pull error classes", Label("unit"), func() {
	DescribeTable("name the class from the daemon's text, ignoring the reference",
		func(raw string, timedOut bool, want PullFailure) {
			ref := "registry.example.com:4040/app:404"
			Expect(classifyPull(errors.New(raw), ref, timedOut)).To(Equal(want))
		},
		Entry(nil, "manifest unknown: manifest unknown", false, PullImageNotFound),
		Entry(nil, "pull access denied for registry.example.com:4040/app, repository does not exist or may require 'docker login': denied: requested access to the resource is denied", false, PullUnauthorized),
		Entry(nil, "unauthorized: authentication required", false, PullUnauthorized),
		Entry(nil, `Get "https://registry.example.com:4040/v2/": dial tcp 10.0.0.1:4040: connect: connection refused`, false, PullRegistryUnreachable),
		Entry(nil, `Get "https://registry.example.com:4040/v2/": dial tcp: lookup registry.example.com: no such host`, false, PullRegistryUnreachable),
		Entry(nil, `Get "https://registry.example.com:4040/v2/": x509: certificate signed by unknown authority`, false, PullRegistryUnreachable),
		Entry(nil, "received unexpected HTTP status: 500 Internal Server Error", false, PullRegistryRefused),
		Entry(nil, "error parsing HTTP 418 response body: invalid character 'S': \"SECRET\"", false, PullRegistryRefused),
		Entry(nil, "context deadline exceeded", true, PullTimedOut),
		Entry(nil, "something else entirely registry.example.com:4040/app:404", false, PullFailed),
	)
})
