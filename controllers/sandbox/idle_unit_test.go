/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// The idle policy on the fake clock: exact times, which the envtest specs
// (idle_test.go) cannot assert with real ones.
var _ = Describe("Reconcile, idle policy (unit)", Label("unit"), func() {
	withLifecycle := func(pause, del int64) func(*sandboxv1alpha1.Sandbox) {
		return func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Lifecycle = &sandboxv1alpha1.SandboxLifecycle{}
			if pause > 0 {
				s.Spec.Lifecycle.IdlePauseSeconds = ptr.To(pause)
			}
			if del > 0 {
				s.Spec.Lifecycle.IdleDeleteSeconds = ptr.To(del)
			}
		}
	}
	pausedReason := func(s *sandboxv1alpha1.Sandbox) string {
		c := meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
	begin := func(e *unitEnv, wake bool) func() {
		GinkgoHelper()
		end, err := e.r.activity.Begin(context.Background(), e.get(), wake)
		Expect(err).NotTo(HaveOccurred())
		return end
	}

	It("counts from status.startTime, pauses exactly at idlePauseSeconds, and looks again then", func() {
		e := newUnitEnv(unitSandbox(true, withLifecycle(60, 0)))
		res := e.mustReconcile()
		Expect(ready(e.get())).To(Equal("True/Running"))
		Expect(res.RequeueAfter).To(Equal(60*time.Second), "the next look is when the idle pause is due")

		e.clk.Step(59 * time.Second)
		e.mustReconcile()
		Expect(e.rt.callsWith("pause ")).To(BeEmpty(), "paused early")

		e.clk.Step(time.Second)
		e.mustReconcile()
		s := e.get()
		Expect(e.rt.callsWith("pause ")).To(HaveLen(1))
		Expect(pausedReason(s)).To(Equal("True/" + sandboxv1alpha1.SandboxReasonIdle))
		Expect(ready(s)).To(Equal("True/Running"), "Ready stays True while idle-paused")
		Expect(e.events()).To(ContainElement("Normal " + sandboxv1alpha1.SandboxReasonIdle))

		// Later reconciles keep it frozen and say nothing more.
		e.clk.Step(time.Hour)
		e.mustReconcile()
		Expect(e.rt.callsWith("unpause ")).To(BeEmpty())
		Expect(e.events()).To(BeEmpty())

		// Activity thaws it at once; the reconcile records Resumed.
		begin(e, true)()
		Expect(e.rt.callsWith("unpause ")).To(HaveLen(1))
		e.mustReconcile()
		s = e.get()
		Expect(pausedReason(s)).To(Equal("False/" + sandboxv1alpha1.SandboxReasonResumed))
		Expect(s.Status.LastActivityTime).NotTo(BeNil())
		Expect(s.Status.LastActivityTime.Time).To(BeTemporally("==", e.clk.Now().Truncate(time.Second)))
	})

	It("never pauses while an operation is in flight, and persists activity at most every 30 s", func() {
		e := newUnitEnv(unitSandbox(true, withLifecycle(10, 0)))
		e.mustReconcile()
		end := begin(e, true)
		e.clk.Step(time.Minute)
		e.mustReconcile()
		Expect(e.rt.callsWith("pause ")).To(BeEmpty(), "paused a sandbox with an exec running")
		Expect(e.get().Status.LastActivityTime).NotTo(BeNil(), "the first activity is persisted")
		end() // the end of an operation is activity too
		e.mustReconcile()
		first := e.get().Status.LastActivityTime
		Expect(first.Time).To(BeTemporally("==", e.clk.Now()))

		// Activity 10 s and 29 s after the persisted one: not written.
		for _, step := range []time.Duration{10 * time.Second, 19 * time.Second} {
			e.clk.Step(step)
			begin(e, false)()
			e.mustReconcile()
			Expect(e.get().Status.LastActivityTime.Time).To(BeTemporally("==", first.Time), "throttled")
		}
		// 30 s after it: written.
		e.clk.Step(time.Second)
		begin(e, false)()
		e.mustReconcile()
		Expect(e.get().Status.LastActivityTime.Time).To(BeTemporally("==", first.Add(30*time.Second)))
	})

	It("deletes the Sandbox exactly at idleDeleteSeconds, after writing its last activity, and says so", func() {
		e := newUnitEnv(unitSandbox(true, withLifecycle(0, 120)))
		e.mustReconcile()
		e.clk.Step(30 * time.Second)
		begin(e, false)() // a log read
		e.clk.Step(119 * time.Second)
		e.mustReconcile()
		Expect(e.get().DeletionTimestamp).To(BeNil(), "deleted early: activity resets the clock")
		e.clk.Step(time.Second)
		e.mustReconcile()
		s := e.get()
		Expect(s.DeletionTimestamp).NotTo(BeNil())
		Expect(s.Status.LastActivityTime).NotTo(BeNil())
		Expect(e.events()).To(ContainElement("Normal " + EventReasonDeleted))
	})

	It("deletes an idle Sandbox whose container exited, and never pauses it", func() {
		e := newUnitEnv(unitSandbox(true, withLifecycle(10, 60)))
		e.mustReconcile()
		ids := e.rt.ids(unitUID)
		Expect(ids).To(HaveLen(1))
		e.rt.setState(ids[0], dockerruntime.ContainerState{Status: "exited", ExitCode: 1})
		e.clk.Step(30 * time.Second)
		res := e.mustReconcile()
		Expect(ready(e.get())).To(Equal("False/" + sandboxv1alpha1.SandboxReasonContainerExited))
		Expect(e.rt.callsWith("pause ")).To(BeEmpty())
		Expect(res.RequeueAfter).To(Equal(30*time.Second), "the next look is when the idle delete is due")
		e.clk.Step(30 * time.Second)
		e.mustReconcile()
		Expect(e.get().DeletionTimestamp).NotTo(BeNil())
	})

	It("deletes an expired Sandbox with shutdownPolicy Delete, and keeps it with Retain", func() {
		for policy, deleted := range map[sandboxv1alpha1.ShutdownPolicy]bool{sandboxv1alpha1.ShutdownDelete: true, sandboxv1alpha1.ShutdownRetain: false} {
			e := newUnitEnv(unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.ActiveDeadlineSeconds = ptr.To[int64](60)
				s.Spec.Lifecycle = &sandboxv1alpha1.SandboxLifecycle{ShutdownPolicy: policy}
			}))
			e.mustReconcile()
			e.clk.Step(61 * time.Second)
			e.mustReconcile()
			s := e.get()
			Expect(ready(s)).To(Equal("False/"+sandboxv1alpha1.SandboxReasonExpired), string(policy))
			Expect(s.DeletionTimestamp != nil).To(Equal(deleted), string(policy))
		}
	})

	It("counts a running background process as activity: the helper is asked only when the clock is due", func() {
		e := newUnitEnv(unitSandbox(true, withLifecycle(60, 0)))
		e.mustReconcile()
		e.rt.processes = []execio.ProcessStatus{{Handle: "p-1", State: execio.ProcessRunning}}
		e.clk.Step(30 * time.Second)
		e.mustReconcile()
		Expect(e.rt.callsWith("list-processes ")).To(BeEmpty(), "asked before the idle pause was due")

		e.clk.Step(30 * time.Second)
		res := e.mustReconcile()
		Expect(e.rt.callsWith("list-processes ")).To(HaveLen(1))
		Expect(e.rt.callsWith("pause ")).To(BeEmpty(), "paused while a background process ran")
		Expect(res.RequeueAfter).To(Equal(60*time.Second), "the clock restarts at the check")

		// Ended (exited processes are listed too): paused at the next due time.
		e.rt.processes = []execio.ProcessStatus{{Handle: "p-1", State: execio.ProcessExited}}
		e.clk.Step(60 * time.Second)
		e.mustReconcile()
		Expect(e.rt.callsWith("pause ")).To(HaveLen(1))
		Expect(pausedReason(e.get())).To(Equal("True/" + sandboxv1alpha1.SandboxReasonIdle))
	})

	It("counts a failed process list as a running process only after a background start it saw", func() {
		e := newUnitEnv(unitSandbox(true, withLifecycle(0, 60)))
		e.mustReconcile()
		e.rt.processesErr = errors.New("helper has no process support")

		// Never saw a start: a list error is no activity, so the clock runs out.
		e.clk.Step(60 * time.Second)
		e.mustReconcile()
		Expect(e.rt.callsWith("list-processes ")).To(HaveLen(1))
		Expect(e.get().DeletionTimestamp).NotTo(BeNil(), "kept forever by a helper that cannot list")

		e2 := newUnitEnv(unitSandbox(true, withLifecycle(0, 60)))
		e2.mustReconcile()
		e2.r.activity.Background(e2.get())
		e2.rt.processesErr = errors.New("helper did not answer")
		e2.clk.Step(60 * time.Second)
		e2.mustReconcile()
		Expect(e2.get().DeletionTimestamp).To(BeNil(), "deleted while the background process it started may run")
		Expect(e2.rt.callsWith("list-processes ")).To(HaveLen(1))
	})

	It("reports a cold-created Sandbox Ready only after waiting for its resident helper", func() {
		e := newUnitEnv(unitSandbox(true))
		e.mustReconcile()
		s := e.get()
		Expect(ready(s)).To(Equal("True/Running"))
		Expect(e.rt.calls).To(ContainElement("await-helper " + s.Status.ContainerID))
		create := slices.Index(e.rt.calls, "create "+string(s.UID))
		await := slices.Index(e.rt.calls, "await-helper "+s.Status.ContainerID)
		Expect(create).To(BeNumerically(">=", 0))
		Expect(await).To(BeNumerically(">", create))
	})
})
