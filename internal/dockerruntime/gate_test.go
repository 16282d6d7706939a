/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Pauses and exec starts", dockerLabel, func() {
	It("never freeze an exec half way into the container: pausing and execing in a loop, every call returns and the container stays usable", func(ctx SpecContext) {
		ct, _ := startSandbox(ctx, nil)
		// Without the gate, a freeze that catches a docker exec's runc init
		// hangs runc exec, and with it Docker's unpause, inspect and remove
		// of the container (cgroup v1). Each call here has a bound; a hang
		// shows as a call that does not return within it.
		const rounds = 60
		callBound := 30 * time.Second
		var wg sync.WaitGroup
		var mu sync.Mutex
		var hangs []string
		bounded := func(what string, f func(context.Context) error) error {
			cctx, cancel := context.WithTimeout(ctx, callBound)
			defer cancel()
			err := f(cctx)
			if cctx.Err() != nil {
				mu.Lock()
				hangs = append(hangs, what)
				mu.Unlock()
			}
			return err
		}
		wg.Add(2)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			for range rounds * 3 {
				_ = bounded("exec", func(cctx context.Context) error {
					_, err := rt.Exec(cctx, ct.ID, ExecOptions{Cmd: []string{"true"}}, io.Discard, io.Discard)
					if err != nil && !errors.Is(err, ErrPaused) {
						return err
					}
					return nil
				})
			}
		}()
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			for range rounds {
				Expect(bounded("pause", func(cctx context.Context) error { return rt.Pause(cctx, ct.ID) })).To(Succeed())
				Expect(bounded("unpause", func(cctx context.Context) error { return rt.Unpause(cctx, ct.ID) })).To(Succeed())
			}
		}()
		wg.Wait()
		Expect(hangs).To(BeEmpty(), "calls that did not return within %s", callBound)
		Expect(bounded("inspect", func(cctx context.Context) error {
			got, err := rt.docker.ContainerInspect(cctx, ct.ID)
			if err == nil && got.State.Paused {
				return errors.New("left paused")
			}
			return err
		})).To(Succeed())
		Expect(runCmd(ctx, ct.ID, execio.Request{Shell: "echo alive"}).Stdout).To(Equal("alive\n"))
		Expect(rt.gates.size()).To(BeZero(), "a gate outlived its holders")
	}, SpecTimeout(5*time.Minute))
})
