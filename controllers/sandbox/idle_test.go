/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// The idle policy and shutdown policy of spec.lifecycle, against real
// Docker and envtest's API server, with short real durations. Activity is
// what the node API reports (nodeapi calls Activity.Begin); here the specs
// call it as the node API would. internal/nodeapi's suite covers an exec
// through the node API thawing an idle-paused sandbox.
var _ = Describe("Sandbox lifecycle", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	lifecycle := func(l sandboxv1alpha1.SandboxLifecycle) func(*sandboxv1alpha1.Sandbox) {
		return func(s *sandboxv1alpha1.Sandbox) { s.Spec.Lifecycle = &l }
	}
	pausedCondition := func(key types.NamespacedName) func() string {
		return func() string {
			c := meta.FindStatusCondition(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
			if c == nil {
				return ""
			}
			return string(c.Status) + "/" + c.Reason
		}
	}
	// touch reports activity as the node API does for one operation.
	touch := func(m *testManager, sbx *sandboxv1alpha1.Sandbox, wake bool) {
		GinkgoHelper()
		end, err := m.reconciler.activity.Begin(context.Background(), getSandbox(client.ObjectKeyFromObject(sbx)), wake)
		Expect(err).NotTo(HaveOccurred())
		end()
	}

	It("pauses an idle sandbox (Paused=True, reason Idle, Ready stays True) and activity thaws it with its processes", func() {
		node := testNodePrefix + "idle-pause"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "idle-pause", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](2)}))))
		key := client.ObjectKeyFromObject(sbx)
		id := sbx.Status.ContainerID
		pid := inspect(id).State.Pid

		Eventually(pausedCondition(key), 30*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
		Expect(inspect(id).State.Paused).To(BeTrue())
		Expect(readyReason(key)()).To(Equal("True/Running"), "an idle-paused sandbox stays Ready: the next exec thaws it")
		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElement(sandboxv1alpha1.SandboxReasonIdle))

		touch(m, sbx, true)
		// Thawed before Begin returned, not on the next reconcile.
		Expect(inspect(id).State.Paused).To(BeFalse())
		Expect(inspect(id).State.Pid).To(Equal(pid))
		Eventually(pausedCondition(key), 10*time.Second, 100*time.Millisecond).Should(Equal("False/Resumed"))
		s := getSandbox(key)
		Expect(s.Status.LastActivityTime).NotTo(BeNil(), "the activity that thawed it is persisted")
		// Idle again after another idlePauseSeconds.
		Eventually(pausedCondition(key), 30*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
		Expect(inspect(id).State.Paused).To(BeTrue())
	})

	It("never thaws a sandbox paused by spec.paused", func() {
		node := testNodePrefix + "idle-user-paused"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "user-paused", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](1)}))))
		key := client.ObjectKeyFromObject(sbx)
		setPaused(key, true)
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("False/Paused"))
		touch(m, sbx, true)
		Expect(inspect(sbx.Status.ContainerID).State.Paused).To(BeTrue(), "activity thawed a sandbox the user paused")
		Consistently(pausedCondition(key), 2*time.Second, 200*time.Millisecond).Should(Equal("True/Paused"))
	})

	It("deletes a sandbox idle for idleDeleteSeconds, and activity resets the clock", func() {
		node := testNodePrefix + "idle-delete"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "idle-delete", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{
			IdlePauseSeconds: ptr.To[int64](1), IdleDeleteSeconds: ptr.To[int64](3),
		}))))
		key := client.ObjectKeyFromObject(sbx)

		// Busy for twice the idle timeout: kept.
		busyUntil := time.Now().Add(6 * time.Second)
		for time.Now().Before(busyUntil) {
			touch(m, sbx, true)
			time.Sleep(500 * time.Millisecond)
		}
		Expect(isGone(key)()).To(BeFalse(), "deleted while in use")
		Expect(getSandbox(key).DeletionTimestamp).To(BeNil())

		// An operation in flight for longer than the idle timeout is use too.
		end, err := m.reconciler.activity.Begin(context.Background(), getSandbox(key), true)
		Expect(err).NotTo(HaveOccurred())
		Consistently(isGone(key), 4*time.Second, 200*time.Millisecond).Should(BeFalse())
		end()

		Eventually(isGone(key), 30*time.Second, 200*time.Millisecond).Should(BeTrue())
		Eventually(containerCount(sbx.UID), 30*time.Second).Should(BeZero())
		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElement(EventReasonDeleted))
	})

	// backgroundSleep starts `sleep secs` as a background process in the
	// sandbox's container, as the node API's processes subresource does.
	backgroundSleep := func(m *testManager, sbx *sandboxv1alpha1.Sandbox, secs int) {
		GinkgoHelper()
		rt, ok := m.reconciler.docker.(*dockerruntime.Client)
		Expect(ok).To(BeTrue())
		_, err := rt.StartProcess(context.Background(), sbx.Status.ContainerID, dockerruntime.NewProcessHandle(),
			execio.Request{Command: []string{"sleep", strconv.Itoa(secs)}}, 0)
		Expect(err).NotTo(HaveOccurred())
	}
	// neverPausedFor samples the container for d: it must stay running.
	neverPausedFor := func(id string, d time.Duration) {
		GinkgoHelper()
		until := time.Now().Add(d)
		for time.Now().Before(until) {
			Expect(inspect(id).State.Paused).To(BeFalse(), "frozen while its background process ran")
			time.Sleep(200 * time.Millisecond)
		}
	}

	It("counts a running background process as activity: not paused while it runs, paused after it ends", func() {
		node := testNodePrefix + "idle-background"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "idle-background", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](1)}))))
		key := client.ObjectKeyFromObject(sbx)
		id := sbx.Status.ContainerID

		touch(m, sbx, true)
		backgroundSleep(m, sbx, 10)
		m.reconciler.activity.Background(getSandbox(key))
		started := time.Now()
		// Ten idle pause periods with no exec, transfer or log read.
		neverPausedFor(id, 9*time.Second)
		Expect(pausedCondition(key)()).NotTo(Equal("True/Idle"))

		// The sleep ends at 10 s; idle one second later, and a check of at
		// most a period after that.
		Eventually(pausedCondition(key), 15*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
		Expect(inspect(id).State.Paused).To(BeTrue())
		Expect(time.Since(started)).To(BeNumerically(">=", 10*time.Second), "paused before the background process ended")
	})

	It("counts a background process the manager did not see start (started before a manager restart)", func() {
		node := testNodePrefix + "idle-background-unseen"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "idle-bg-unseen", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](1)}))))
		key := client.ObjectKeyFromObject(sbx)
		id := sbx.Status.ContainerID

		touch(m, sbx, true)
		backgroundSleep(m, sbx, 6) // no Activity.Background: this manager never heard of it
		started := time.Now()
		neverPausedFor(id, 5*time.Second)
		Eventually(pausedCondition(key), 15*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
		Expect(time.Since(started)).To(BeNumerically(">=", 6*time.Second), "paused before the background process ended")
	})

	It("keeps the idle clock across a manager restart: lastActivityTime is persisted and not reset", func() {
		node := testNodePrefix + "idle-restart"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "idle-restart", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{
			IdleDeleteSeconds: ptr.To[int64](3600),
		}))))
		key := client.ObjectKeyFromObject(sbx)
		Expect(getSandbox(key).Status.LastActivityTime).To(BeNil(), "no activity yet")
		touch(m, sbx, true)
		Eventually(func() *metav1.Time { return getSandbox(key).Status.LastActivityTime }, 10*time.Second, 100*time.Millisecond).ShouldNot(BeNil())
		persisted := getSandbox(key).Status.LastActivityTime.DeepCopy()
		m.stop()

		time.Sleep(1100 * time.Millisecond) // a reset would now write a later second
		startManager(node, managerConfig{})
		// The new manager takes the Sandbox over (it reconciles it: the
		// endpoint it publishes is its own) and keeps the persisted time.
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
		Consistently(func() time.Time { return getSandbox(key).Status.LastActivityTime.Time }, 3*time.Second, 200*time.Millisecond).
			Should(BeTemporally("==", persisted.Time))
	})

	It("keeps an idle-paused sandbox paused across a manager restart, and a new manager's activity thaws it", func() {
		node := testNodePrefix + "idle-restart-paused"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "idle-restart-paused", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{
			IdlePauseSeconds: ptr.To[int64](1),
		}))))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(pausedCondition(key), 30*time.Second, 100*time.Millisecond).Should(Equal("True/Idle"))
		m.stop()
		m = startManager(node, managerConfig{})
		Consistently(func() bool { return inspect(sbx.Status.ContainerID).State.Paused }, 3*time.Second, 200*time.Millisecond).Should(BeTrue(),
			"a restarted manager thawed an idle-paused sandbox nobody used")
		touch(m, sbx, true)
		Expect(inspect(sbx.Status.ContainerID).State.Paused).To(BeFalse())
	})

	It("deletes an expired Sandbox with shutdownPolicy Delete, and keeps one with Retain", func() {
		node := testNodePrefix + "shutdown"
		startManager(node, managerConfig{})
		del := createSandbox(newSandbox(ns, "shutdown-delete", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{ShutdownPolicy: sandboxv1alpha1.ShutdownDelete}),
			func(s *sandboxv1alpha1.Sandbox) { s.Spec.ActiveDeadlineSeconds = ptr.To[int64](2) }))
		keep := createSandbox(newSandbox(ns, "shutdown-retain", node, lifecycle(sandboxv1alpha1.SandboxLifecycle{ShutdownPolicy: sandboxv1alpha1.ShutdownRetain}),
			func(s *sandboxv1alpha1.Sandbox) { s.Spec.ActiveDeadlineSeconds = ptr.To[int64](2) }))

		Eventually(isGone(client.ObjectKeyFromObject(del)), 30*time.Second, 200*time.Millisecond).Should(BeTrue())
		Eventually(containerCount(del.UID), 30*time.Second).Should(BeZero())
		Eventually(eventReasons(del), 10*time.Second).Should(ContainElement(EventReasonDeleted))

		keepKey := client.ObjectKeyFromObject(keep)
		Eventually(readyReason(keepKey), 30*time.Second, 100*time.Millisecond).Should(Equal("False/Expired"))
		Consistently(isGone(keepKey), 2*time.Second, 200*time.Millisecond).Should(BeFalse())
		Expect(getSandbox(keepKey).DeletionTimestamp).To(BeNil())
		Expect(containerCount(keep.UID)()).To(BeZero())
	})
})
