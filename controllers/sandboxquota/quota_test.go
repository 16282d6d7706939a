/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"
	"errors"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// small keeps the real containers the node starts light.
func small() sandboxv1alpha1.SandboxResources {
	return sandboxv1alpha1.SandboxResources{
		CPU:    ptr.To(resource.MustParse("100m")),
		Memory: ptr.To(resource.MustParse("16Mi")),
		Disk:   ptr.To(resource.MustParse("8Mi")),
	}
}

func newSandbox(ns string, mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "sbx-"},
		Spec: sandboxv1alpha1.SandboxSpec{
			Image:     testenv.BusyboxImage,
			Resources: small(),
			NodeName:  nodeName,
		},
	}
	for _, m := range mutate {
		m(sbx)
	}
	return sbx
}

func withResources(cpu, memory, disk string) func(*sandboxv1alpha1.Sandbox) {
	return func(s *sandboxv1alpha1.Sandbox) {
		s.Spec.Resources = sandboxv1alpha1.SandboxResources{
			CPU:    ptr.To(resource.MustParse(cpu)),
			Memory: ptr.To(resource.MustParse(memory)),
			Disk:   ptr.To(resource.MustParse(disk)),
		}
	}
}

func withImage(image string) func(*sandboxv1alpha1.Sandbox) {
	return func(s *sandboxv1alpha1.Sandbox) { s.Spec.Image = image }
}

func create(sbx *sandboxv1alpha1.Sandbox) error {
	return cp.Client.Create(context.Background(), sbx)
}

func dryRun(sbx *sandboxv1alpha1.Sandbox) error {
	return cp.Client.Create(context.Background(), sbx, client.DryRunAll)
}

// newQuota creates a quota and waits until the controller has counted it,
// as admission requires.
func newQuota(ns, name string, spec sandboxv1alpha1.SandboxQuotaSpec) *sandboxv1alpha1.SandboxQuota {
	GinkgoHelper()
	q := &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	Expect(cp.Client.Create(context.Background(), q)).To(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(q), q)).To(Succeed())
		g.Expect(q.Status.ObservedGeneration).To(Equal(q.Generation))
	}, 20*time.Second, 50*time.Millisecond).Should(Succeed())
	return q
}

func getQuota(q *sandboxv1alpha1.SandboxQuota) *sandboxv1alpha1.SandboxQuota {
	GinkgoHelper()
	out := &sandboxv1alpha1.SandboxQuota{}
	Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(q), out)).To(Succeed())
	return out
}

// settled waits until the quota has been recounted with no pending
// reservations and reports that many Sandboxes.
func settled(q *sandboxv1alpha1.SandboxQuota, sandboxes int64) *sandboxv1alpha1.SandboxQuota {
	GinkgoHelper()
	var out *sandboxv1alpha1.SandboxQuota
	Eventually(func(g Gomega) {
		out = &sandboxv1alpha1.SandboxQuota{}
		g.Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(q), out)).To(Succeed())
		g.Expect(out.Status.Reservations).To(BeEmpty())
		g.Expect(out.Status.Used.Sandboxes).To(Equal(sandboxes))
		g.Expect(meta.IsStatusConditionTrue(out.Status.Conditions, string(sandboxv1alpha1.SandboxQuotaConditionReady))).To(BeTrue())
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	return out
}

func ptrQ(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

// deleteAll removes a namespace's Sandboxes and waits until the node has
// removed their containers (envtest runs no namespace controller).
func deleteAll(ns string) {
	GinkgoHelper()
	ctx := context.Background()
	Expect(cp.Client.DeleteAllOf(ctx, &sandboxv1alpha1.Sandbox{}, client.InNamespace(ns))).To(Succeed())
	Eventually(func(g Gomega) {
		var list sandboxv1alpha1.SandboxList
		g.Expect(cp.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(BeEmpty())
	}, 60*time.Second, 200*time.Millisecond).Should(Succeed())
}

func newNamespace() string {
	GinkgoHelper()
	ns := cp.NewNamespace("quota-")
	DeferCleanup(deleteAll, ns)
	return ns
}

// beForbidden matches an admission denial carrying all of the substrings.
func beForbidden(substrings ...string) OmegaMatcher {
	matchers := []OmegaMatcher{WithTransform(apierrors.IsForbidden, BeTrue())}
	for _, s := range substrings {
		matchers = append(matchers, MatchError(ContainSubstring(s)))
	}
	return And(matchers...)
}

var _ = Describe("SandboxQuota accounting", func() {
	It("charges each Sandbox's count, CPU, memory and disk at admission and refuses what does not fit, naming the limit and the overage", func() {
		ns := newNamespace()
		q := newQuota(ns, "team", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{
			Sandboxes: ptr.To[int64](3), CPU: ptrQ("1"), Memory: ptrQ("256Mi"), Disk: ptrQ("64Mi"),
		}})
		Expect(q.Status.Summary).To(Equal("sandboxes: 0/3, cpu: 0/1, memory: 0/256Mi, disk: 0/64Mi"))

		Expect(create(newSandbox(ns, withResources("500m", "128Mi", "32Mi")))).To(Succeed())
		// Charged by the webhook itself before the create returned, not
		// by a later recount.
		charged := getQuota(q)
		Expect(charged.Status.Used.Sandboxes).To(Equal(int64(1)))
		Expect(charged.Status.Used.CPU.String()).To(Equal("500m"))

		counted := settled(q, 1)
		Expect(counted.Status.Summary).To(Equal("sandboxes: 1/3, cpu: 500m/1, memory: 128Mi/256Mi, disk: 32Mi/64Mi"))
		Expect(meta.IsStatusConditionFalse(counted.Status.Conditions, string(sandboxv1alpha1.SandboxQuotaConditionExhausted))).To(BeTrue())

		err := create(newSandbox(ns, withResources("600m", "192Mi", "16Mi")))
		Expect(err).To(beForbidden(
			`sandbox quota "team" exceeded: `,
			"cpu: requested 600m, used 500m, limit 1 (100m over)",
			"memory: requested 192Mi, used 128Mi, limit 256Mi (64Mi over)",
		))
		Expect(err.Error()).NotTo(ContainSubstring("disk:"), "only the limits that are broken are named")
		// The webhook's typed cause survives kube-apiserver, so clients
		// classify the refusal without reading its text.
		var status apierrors.APIStatus
		Expect(errors.As(err, &status)).To(BeTrue())
		Expect(status.Status().Details).NotTo(BeNil(), "kube-apiserver dropped the webhook's details: %#v", status.Status())
		Expect(status.Status().Details.Causes).To(ContainElement(HaveField("Type", subresource.CauseQuotaExceeded)))

		Expect(create(newSandbox(ns, withResources("500m", "128Mi", "32Mi")))).To(Succeed())
		full := settled(q, 2)
		exhausted := meta.FindStatusCondition(full.Status.Conditions, string(sandboxv1alpha1.SandboxQuotaConditionExhausted))
		Expect(exhausted).NotTo(BeNil())
		Expect(exhausted.Status).To(Equal(metav1.ConditionTrue))
		Expect(exhausted.Reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonLimitReached))
		Expect(exhausted.Message).To(ContainSubstring("cpu 1 of 1"))

		Expect(create(newSandbox(ns, withResources("1m", "6Mi", "1Mi")))).To(beForbidden("cpu: requested 1m, used 1, limit 1 (1m over)"))
	})

	It("applies every quota in the namespace, and all of them or none are charged", func() {
		ns := newNamespace()
		roomy := newQuota(ns, "roomy", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](10)}})
		tight := newQuota(ns, "tight", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1)}})
		Expect(create(newSandbox(ns))).To(Succeed())
		Expect(create(newSandbox(ns))).To(beForbidden(`sandbox quota "tight" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`))
		// The refused create charged "roomy" before "tight" refused it,
		// and took the charge back.
		Expect(getQuota(roomy).Status.Used.Sandboxes).To(Equal(int64(1)))
		settled(roomy, 1)
		settled(tight, 1)
	})

	It("checks dry-run creates without charging them", func() {
		ns := newNamespace()
		q := newQuota(ns, "one", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1)}})
		Expect(dryRun(newSandbox(ns))).To(Succeed())
		Expect(dryRun(newSandbox(ns))).To(Succeed())
		Expect(getQuota(q).Status.Used.Sandboxes).To(BeZero())
		Expect(getQuota(q).Status.Reservations).To(BeEmpty())
		Expect(create(newSandbox(ns))).To(Succeed())
		Expect(dryRun(newSandbox(ns))).To(beForbidden(`sandbox quota "one" exceeded: sandboxes`))
	})

	It("admits exactly hard.sandboxes of 50 parallel creates", func() {
		ns := newNamespace()
		q := newQuota(ns, "ten", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](10)}})

		const parallel = 50
		errs := make([]error, parallel)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = create(newSandbox(ns))
			}()
		}
		close(start)
		wg.Wait()

		admitted := 0
		for _, err := range errs {
			if err == nil {
				admitted++
				continue
			}
			Expect(err).To(beForbidden(`sandbox quota "ten" exceeded: sandboxes: requested 1, used 10, limit 10 (1 over)`))
		}
		Expect(admitted).To(Equal(10))

		var list sandboxv1alpha1.SandboxList
		Expect(cp.Client.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(10))
		Expect(settled(q, 10).Status.Summary).To(Equal("sandboxes: 10/10"))
	})
})

var _ = Describe("SandboxQuota release", func() {
	It("releases usage when a Sandbox is deleted", func() {
		ns := newNamespace()
		q := newQuota(ns, "one", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1)}})
		first := newSandbox(ns)
		Expect(create(first)).To(Succeed())
		Expect(create(newSandbox(ns))).To(beForbidden("sandboxes: requested 1, used 1, limit 1"))

		Expect(cp.Client.Delete(context.Background(), first)).To(Succeed())
		settled(q, 0)
		Expect(create(newSandbox(ns))).To(Succeed())
	})

	It("releases usage when a Sandbox expires, before it is deleted", func() {
		ns := newNamespace()
		q := newQuota(ns, "one", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1)}})
		short := newSandbox(ns, func(s *sandboxv1alpha1.Sandbox) { s.Spec.ActiveDeadlineSeconds = ptr.To[int64](2) })
		Expect(create(short)).To(Succeed())
		Expect(create(newSandbox(ns))).To(beForbidden("sandboxes: requested 1, used 1, limit 1"))

		// The node's manager, not the test, expires it.
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(short), short)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(short.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired))).To(BeTrue())
		}, 60*time.Second, 200*time.Millisecond).Should(Succeed())
		settled(q, 0)
		Expect(create(newSandbox(ns))).To(Succeed())
	})

	It("drops the charge of a create that was admitted but never stored", func() {
		ns := newNamespace()
		q := newQuota(ns, "two", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](2)}})
		Expect(create(newSandbox(ns, func(s *sandboxv1alpha1.Sandbox) { s.GenerateName = ""; s.Name = "taken" }))).To(Succeed())
		settled(q, 1)

		// Admission runs before storage finds the name taken, so this
		// create is charged and then fails.
		err := create(newSandbox(ns, func(s *sandboxv1alpha1.Sandbox) { s.GenerateName = ""; s.Name = "taken" }))
		Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), "got %v", err)
		Expect(getQuota(q).Status.Reservations).To(HaveLen(1))
		Expect(getQuota(q).Status.Used.Sandboxes).To(Equal(int64(2)))

		// Kept while the create could still be in flight, then dropped
		// once the API server confirms no such Sandbox was stored.
		Consistently(func() int64 { return getQuota(q).Status.Used.Sandboxes }, reservationTimeout/2, 200*time.Millisecond).Should(Equal(int64(2)))
		settled(q, 1)
		Expect(create(newSandbox(ns))).To(Succeed())
	})
})

var _ = Describe("SandboxQuota rules", func() {
	It("admits only images that match allowedImages as written or normalized", func() {
		ns := newNamespace()
		newQuota(ns, "images", sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{
			"code-sandbox-test/*", "docker.io/library/python:3.*", "ghcr.io/acme/**",
		}})
		for _, image := range []string{
			testenv.BusyboxImage,
			"python:3.12",                        // normalized: docker.io/library/python:3.12
			"docker.io/library/python:3.12-slim", // as written
			"library/python:3.13",
			"ghcr.io/acme/team/tool:1", // ** crosses /
		} {
			Expect(dryRun(newSandbox(ns, withImage(image)))).To(Succeed(), image)
		}
		for _, image := range []string{
			"python",                             // normalized to :latest, not 3.*
			"code-sandbox-test/nested/busybox:1", // * stops at /
			"evil.example/code-sandbox-test/busybox:1",
			"ghcr.io/acme-evil/tool:1",
			"docker.io/library/pythonista:3.12",
		} {
			Expect(dryRun(newSandbox(ns, withImage(image)))).To(beForbidden(
				`sandbox quota "images" does not allow image "`+image+`"`,
				"allowed images: code-sandbox-test/*, docker.io/library/python:3.*, ghcr.io/acme/**",
			), image)
		}
		err := dryRun(newSandbox(ns, withImage("python")))
		Expect(err).To(MatchError(ContainSubstring(`"python" (docker.io/library/python:latest)`)), "the normalized name is shown")
	})

	It("admits only allowed runtimes and egress only where allowed", func() {
		ns := newNamespace()
		newQuota(ns, "gvisor-only", sandboxv1alpha1.SandboxQuotaSpec{AllowedRuntimes: []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeGVisor}, AllowEgress: true})
		Expect(dryRun(newSandbox(ns))).To(beForbidden(`sandbox quota "gvisor-only" does not allow runtime "runc"; allowed runtimes: gvisor`))
		gvisor := func(s *sandboxv1alpha1.Sandbox) { s.Spec.Runtime = sandboxv1alpha1.RuntimeGVisor }
		egress := func(s *sandboxv1alpha1.Sandbox) { s.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress }
		Expect(dryRun(newSandbox(ns, gvisor, egress))).To(Succeed())

		// A second quota without allowEgress takes egress away: every
		// quota must allow a Sandbox.
		newQuota(ns, "no-network", sandboxv1alpha1.SandboxQuotaSpec{})
		Expect(dryRun(newSandbox(ns, gvisor, egress))).To(beForbidden(`sandbox quota "no-network" does not allow network mode Egress`))
		Expect(dryRun(newSandbox(ns, gvisor))).To(Succeed())
	})

	It("caps activeDeadlineSeconds on create and on update", func() {
		ns := newNamespace()
		newQuota(ns, "short-lived", sandboxv1alpha1.SandboxQuotaSpec{MaxActiveDeadlineSeconds: ptr.To[int64](600)})
		deadline := func(d int64) func(*sandboxv1alpha1.Sandbox) {
			return func(s *sandboxv1alpha1.Sandbox) { s.Spec.ActiveDeadlineSeconds = ptr.To(d) }
		}
		Expect(dryRun(newSandbox(ns))).To(beForbidden(`sandbox quota "short-lived" requires spec.activeDeadlineSeconds of at most 600; the Sandbox sets none`))
		Expect(dryRun(newSandbox(ns, deadline(601)))).To(beForbidden(`allows activeDeadlineSeconds of at most 600; the Sandbox asks for 601 (1 over)`))

		sbx := newSandbox(ns, deadline(600))
		Expect(create(sbx)).To(Succeed())
		// Retried on conflicts only: the node manager updates the
		// Sandbox (finalizer) meanwhile.
		setDeadline := func(d *int64) error {
			for {
				cur := &sandboxv1alpha1.Sandbox{}
				if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(sbx), cur); err != nil {
					return err
				}
				cur.Spec.ActiveDeadlineSeconds = d
				if err := cp.Client.Update(context.Background(), cur); !apierrors.IsConflict(err) {
					return err
				}
			}
		}
		Expect(setDeadline(ptr.To[int64](900))).To(beForbidden("asks for 900 (300 over)"))
		Expect(setDeadline(nil)).To(beForbidden("sets none"))
		Expect(setDeadline(ptr.To[int64](300))).To(Succeed())
	})
})

var _ = Describe("SandboxQuota changes", func() {
	It("takes effect at once, without a restart, and never stops what already runs", func() {
		ns := newNamespace()
		q := newQuota(ns, "team", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](2)}})
		Expect(create(newSandbox(ns))).To(Succeed())
		Expect(create(newSandbox(ns))).To(Succeed())
		Expect(create(newSandbox(ns))).To(beForbidden("limit 2 (1 over)"))

		setHard := func(n int64) {
			Eventually(func() error {
				cur := getQuota(q)
				cur.Spec.Hard.Sandboxes = ptr.To(n)
				return cp.Client.Update(context.Background(), cur)
			}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		}
		setHard(3)
		// No wait for the controller: admission reads the quota itself.
		Expect(create(newSandbox(ns))).To(Succeed())

		setHard(1)
		Expect(create(newSandbox(ns))).To(beForbidden("sandboxes: requested 1, used 3, limit 1 (3 over)"))
		Eventually(func(g Gomega) {
			cond := meta.FindStatusCondition(getQuota(q).Status.Conditions, string(sandboxv1alpha1.SandboxQuotaConditionExhausted))
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonOverLimit))
			g.Expect(cond.Message).To(ContainSubstring("sandboxes 3 used of 1"))
		}, 20*time.Second, 100*time.Millisecond).Should(Succeed())
		var list sandboxv1alpha1.SandboxList
		Expect(cp.Client.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(3))
		for i := range list.Items {
			Expect(list.Items[i].DeletionTimestamp).To(BeNil())
		}
	})
})

var _ = Describe("The webhook being down", func() {
	It("refuses creates (fail closed) but never blocks updates or deletes", func() {
		ns := newNamespace()
		ctx := context.Background()
		existing := newSandbox(ns)
		Expect(create(existing)).To(Succeed())
		// Once the node manager has added its finalizer, deleting the
		// Sandbox needs an update that removes it again.
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(existing), existing)).To(Succeed())
			g.Expect(existing.Finalizers).NotTo(BeEmpty())
		}, 30*time.Second, 100*time.Millisecond).Should(Succeed())

		webhookServer.stop()
		DeferCleanup(func() { webhookServer = startWebhook() })

		err := create(newSandbox(ns))
		Expect(err).To(MatchError(ContainSubstring("failed calling webhook")))
		var list sandboxv1alpha1.SandboxList
		Expect(cp.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(1), "nothing was created past the missing webhook")

		Eventually(func() error {
			cur := &sandboxv1alpha1.Sandbox{}
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(existing), cur); err != nil {
				return err
			}
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			cur.Labels["touched"] = "yes"
			return cp.Client.Update(ctx, cur)
		}, 10*time.Second, 100*time.Millisecond).Should(Succeed())

		Expect(cp.Client.Delete(ctx, existing)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(existing), &sandboxv1alpha1.Sandbox{}))
		}, 60*time.Second, 200*time.Millisecond).Should(BeTrue(), "the manager removed its finalizer without the webhook")
	})
})
