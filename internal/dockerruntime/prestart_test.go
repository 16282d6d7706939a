/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
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
})
