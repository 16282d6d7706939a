/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// execCreates lists the exec_create events Docker recorded for container
// id from since until now: the command line of every exec anything
// started in it. It is Docker's own record, not the runtime's.
func execCreates(ctx context.Context, id string, since time.Time) []string {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msgs, errs := rt.docker.Events(ctx, events.ListOptions{
		Since:   strconv.FormatInt(since.Add(-time.Second).Unix(), 10),
		Until:   strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)), filters.Arg("container", id)),
	})
	var out []string
	for {
		select {
		case m := <-msgs:
			if cmd, ok := strings.CutPrefix(string(m.Action), "exec_create: "); ok {
				out = append(out, cmd)
			}
		case err := <-errs:
			// The stream ends (io.EOF) at Until.
			if err != nil && !strings.Contains(err.Error(), "EOF") {
				Expect(err).NotTo(HaveOccurred())
			}
			return out
		}
	}
}

var _ = Describe("The helper started with the container", dockerLabel, func() {
	It("is the one a sandbox's first command runs in: no exec after create, for commands and for the health check across a freeze", func(ctx SpecContext) {
		serve := HelperPath + " serve"
		t0 := time.Now()
		ct, _ := startSandbox(ctx, nil)
		// No command yet: the only exec in the container is the helper
		// CreateAndStart began (in the background, so wait for it).
		Eventually(func() []string { return execCreates(ctx, ct.ID, t0) }).WithContext(ctx).WithTimeout(20*time.Second).
			Should(Equal([]string{serve}), "CreateAndStart starts the resident helper")
		for i := range 3 {
			var stdout bytes.Buffer
			res, err := rt.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"echo", strconv.Itoa(i)}}, &stdout, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.ExitCode).To(BeZero())
			Expect(stdout.String()).To(Equal(strconv.Itoa(i) + "\n"))
		}
		// A warm pool member: checked, frozen with its helper, thawed at
		// its claim; its first command still needs no exec.
		Expect(rt.CheckHealth(ctx, ct.ID)).To(Succeed())
		Expect(rt.Pause(ctx, ct.ID)).To(Succeed())
		Expect(rt.BeginUnpause(ct.ID)(ctx)).To(Succeed())
		res, err := rt.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"true"}}, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(BeZero())
		Expect(execCreates(ctx, ct.ID, t0)).To(Equal([]string{serve}), "the first command and the check reused the helper started with the container")
	}, SpecTimeout(60*time.Second))

	It("is awaited, not duplicated, by a command that comes while it starts", func(ctx SpecContext) {
		t0 := time.Now()
		ct, _ := startSandbox(ctx, nil)
		// Straight after CreateAndStart: the helper may still be starting.
		res, err := rt.RunCommand(ctx, ct.ID, execio.Request{Command: []string{"true"}}, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(BeZero())
		Expect(execCreates(ctx, ct.ID, t0)).To(Equal([]string{HelperPath + " serve"}))
	}, SpecTimeout(60*time.Second))

	It("carries file transfers: a write, a read and an upload over what a request carries need no exec", func(ctx SpecContext) {
		serve := HelperPath + " serve"
		t0 := time.Now()
		ct, _ := startSandbox(ctx, nil)
		data := bytes.Repeat([]byte("x"), 1024)
		_, err := rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(makeTar(tarEntry{Name: "d/f", Type: tar.TypeReg, Mode: 0o640, Body: data})), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		var out bytes.Buffer
		_, err = rt.CopyOut(ctx, ct.ID, execio.Target{Root: "/tmp", Rel: "d/f"}, &out, 0)
		Expect(err).NotTo(HaveOccurred())
		hdr, body := readOneEntry(out.Bytes())
		Expect(hdr.Mode & 0o777).To(Equal(int64(0o640)))
		Expect(body).To(Equal(data))
		Expect(execCreates(ctx, ct.ID, t0)).To(Equal([]string{serve}), "the transfers ran in the resident helper")

		// Over serveUploadMax: streamed to the same helper in data frames.
		big := bytes.Repeat([]byte("y"), serveUploadMax+1)
		_, err = rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(makeTar(tarEntry{Name: "big", Type: tar.TypeReg, Mode: 0o644, Body: big})), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(sh(ctx, ct.ID, "wc -c < /tmp/big").Stdout).To(Equal(strconv.Itoa(len(big)) + "\n"))
		// One refused part way (its second entry), then one that is fine:
		// the first entry is there, the error names the bad one, and the
		// helper takes the next upload.
		bad := makeTar(tarEntry{Name: "first", Type: tar.TypeReg, Mode: 0o644, Body: big}, tarEntry{Name: "fifo", Type: tar.TypeFifo, Mode: 0o644})
		_, err = rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(bad), execio.UploadLimits{})
		Expect(err).To(MatchError(ContainSubstring("fifo")))
		Expect(sh(ctx, ct.ID, "wc -c < /tmp/first").Stdout).To(Equal(strconv.Itoa(len(big)) + "\n"))
		_, err = rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(makeTar(tarEntry{Name: "after", Type: tar.TypeReg, Mode: 0o600, Body: big})), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(sh(ctx, ct.ID, "stat -c '%a %s' /tmp/after").Stdout).To(Equal("600 " + strconv.Itoa(len(big)) + "\n"))
		Expect(withoutSh(execCreates(ctx, ct.ID, t0))).To(Equal([]string{serve}), "no exec for the large uploads either (but this test's own sh checks)")
	}, SpecTimeout(60*time.Second))

	It("streams a 64 MiB upload without holding it: the manager's heap grows by a bounded amount", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		const size = 64 << 20
		// The archive is generated as it is read: nothing of it is in
		// memory but what the upload path holds.
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			err := tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
			chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10)
			for n := 0; err == nil && n < size; n += len(chunk) {
				_, err = tw.Write(chunk)
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base := ms.HeapInuse
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			var m runtime.MemStats
			for {
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		t0 := time.Now()
		stats, err := rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, pr, execio.UploadLimits{MaxBytes: 128 << 20})
		close(stop)
		<-sampled
		Expect(err).NotTo(HaveOccurred())
		Expect(stats.Bytes).To(BeEquivalentTo(size))
		Expect(sh(ctx, ct.ID, "wc -c < /tmp/big").Stdout).To(Equal(strconv.Itoa(size) + "\n"))
		grown := int64(peak.Load()) - int64(base)
		AddReportEntry("64 MiB upload", fmt.Sprintf("%s, heap in use grew by at most %.1f MiB", time.Since(t0).Round(time.Millisecond), float64(grown)/(1<<20)))
		Expect(grown).To(BeNumerically("<", 24<<20), "the upload was buffered whole (or nearly) in the manager")
		Expect(withoutSh(execCreates(ctx, ct.ID, t0))).To(HaveEach(HelperPath+" serve"), "no exec but the resident helper's own start (and this test's sh check)")
	}, SpecTimeout(120*time.Second))

	It("falls back to an exec for a large upload where the sandbox's helper cannot take one in frames", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		rt.awaitPrestart(ctx, ct.ID)
		// As a helper from an older tools volume answers: no features.
		rt.noteFeatures(ct.ID, helperproto.Ready{})
		t0 := time.Now()
		big := bytes.Repeat([]byte("y"), serveUploadMax+1)
		_, err := rt.CopyIn(ctx, ct.ID, execio.Target{Root: "/tmp"}, bytes.NewReader(makeTar(tarEntry{Name: "big", Type: tar.TypeReg, Mode: 0o644, Body: big})), execio.UploadLimits{})
		Expect(err).NotTo(HaveOccurred())
		Expect(sh(ctx, ct.ID, "wc -c < /tmp/big").Stdout).To(Equal(strconv.Itoa(len(big)) + "\n"))
		Expect(execCreates(ctx, ct.ID, t0)).To(ContainElement(HavePrefix(HelperPath + " untar")))
	}, SpecTimeout(60*time.Second))
})

// withoutSh leaves out the execs of the tests' own sh checks.
func withoutSh(execs []string) []string {
	var out []string
	for _, e := range execs {
		if !strings.HasPrefix(e, "/bin/sh -c ") {
			out = append(out, e)
		}
	}
	return out
}

// readOneEntry is the first entry of a tar and its content.
func readOneEntry(archive []byte) (*tar.Header, []byte) {
	GinkgoHelper()
	tr := tar.NewReader(bytes.NewReader(archive))
	hdr, err := tr.Next()
	Expect(err).NotTo(HaveOccurred())
	body, err := io.ReadAll(tr)
	Expect(err).NotTo(HaveOccurred())
	return hdr, body
}
