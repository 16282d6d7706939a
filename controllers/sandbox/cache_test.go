/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// bigSpec gives a Sandbox a command and env of nearly 64 KiB each, the most
// the CRD allows, that still do something checkable.
func bigSpec(s *sandboxv1alpha1.Sandbox) {
	pad := strings.Repeat("x", 4000)
	s.Spec.Command = []string{"sh", "-c", `echo "$GREETING" > /app/greeting; exec sleep 3600`}
	for range 15 {
		s.Spec.Command = append(s.Spec.Command, pad)
	}
	s.Spec.Env = []sandboxv1alpha1.EnvVar{{Name: "GREETING", Value: "hello"},
		{Name: "PAD1", Value: strings.Repeat("y", 30000)}, {Name: "PAD2", Value: strings.Repeat("z", 30000)}}
}

// heapInUse is the process's live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

var _ = Describe("The node manager's cache", func() {
	ctx := context.Background()

	It("holds command and env only for its own node's Sandboxes, and runs one it claims with them", func() {
		ns := newNamespace()
		node := testNodePrefix + "cache"
		m := startManager(node, managerConfig{})
		// Unbound until the claim: the cache held it stripped, and the
		// container must still get its command and env.
		mine := waitReady(createSandbox(newSandbox(ns, "mine", node, bigSpec)))
		foreign := createSandbox(newSandbox(ns, "foreign", testNodePrefix+"nowhere", bigSpec))

		Eventually(func(g Gomega) {
			f := &sandboxv1alpha1.Sandbox{}
			g.Expect(m.reconciler.client.Get(ctx, client.ObjectKeyFromObject(foreign), f)).To(Succeed())
			g.Expect(f.Spec.Image).To(Equal(busyboxImage))
			g.Expect(f.Spec.Command).To(BeNil())
			g.Expect(f.Spec.Env).To(BeNil())
			g.Expect(f.ManagedFields).To(BeNil())
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		Eventually(func(g Gomega) {
			own := &sandboxv1alpha1.Sandbox{}
			g.Expect(m.reconciler.client.Get(ctx, client.ObjectKeyFromObject(mine), own)).To(Succeed())
			g.Expect(own.Spec.Command).To(Equal(mine.Spec.Command))
			g.Expect(own.Spec.Env).To(Equal(mine.Spec.Env))
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		Expect(dockerExecOutput(mine.Status.ContainerID, "cat", "/app/greeting")).To(Equal("hello\n"))
		Expect(inspect(mine.Status.ContainerID).Config.Env).To(ContainElement("PAD2=" + strings.Repeat("z", 30000)))
	})

	It("keeps other nodes' big Sandboxes out of the heap (measured)", func() {
		n := 200
		if v := os.Getenv("CACHE_MEASURE_SANDBOXES"); v != "" {
			_, err := fmt.Sscan(v, &n)
			Expect(err).NotTo(HaveOccurred())
		}
		ns := newNamespace()
		for i := range n {
			// Pinned to a node without a manager: never claimed.
			sbx := newSandbox(ns, fmt.Sprintf("big-%03d", i), testNodePrefix+"nowhere", bigSpec)
			Expect(k8sClient.Create(ctx, sbx)).To(Succeed())
		}
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(context.Background(), &sandboxv1alpha1.Sandbox{}, client.InNamespace(ns))).To(Succeed())
		})
		// The Sandbox cache a manager starts, alone, with and without the
		// transform; its heap is what the cache holds.
		measure := func(opts cache.Options) uint64 {
			opts.Scheme = k8sClient.Scheme()
			before := heapInUse()
			c, err := cache.New(cfg, opts)
			Expect(err).NotTo(HaveOccurred())
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() { _ = c.Start(cctx) }()
			_, err = c.GetInformer(cctx, &sandboxv1alpha1.Sandbox{})
			Expect(err).NotTo(HaveOccurred())
			Expect(c.WaitForCacheSync(cctx)).To(BeTrue())
			var list sandboxv1alpha1.SandboxList
			Expect(c.List(cctx, &list, client.InNamespace(ns))).To(Succeed())
			Expect(list.Items).To(HaveLen(n))
			list = sandboxv1alpha1.SandboxList{}
			after := heapInUse()
			runtime.KeepAlive(c)
			if after < before {
				return 0
			}
			return after - before
		}
		full := measure(cache.Options{})
		stripped := measure(CacheOptions(testNodePrefix + "cache"))
		AddReportEntry("Sandbox cache heap", fmt.Sprintf("%d Sandboxes of ~128 KiB on another node: %.1f MiB without the transform, %.1f MiB with it",
			n, float64(full)/(1<<20), float64(stripped)/(1<<20)))
		GinkgoWriter.Printf("Sandbox cache heap for %d big Sandboxes on another node: full %.1f MiB, stripped %.1f MiB\n",
			n, float64(full)/(1<<20), float64(stripped)/(1<<20))
		// Each holds ~124 KiB of command and env: the full cache needs at
		// least that, the stripped one a small fraction.
		Expect(full).To(BeNumerically(">", uint64(n)*100<<10))
		Expect(stripped).To(BeNumerically("<", full/10))
	})

	It("holds warm pools whole, bounded by the template cap (measured)", func() {
		// 300 pools with the biggest command the CRD allows. Before the
		// cap (CACHE_MEASURE_POOL_KIB=1024 on the old CRD) a command
		// could be 1 MiB.
		n, kib := 300, 64
		if v := os.Getenv("CACHE_MEASURE_POOLS"); v != "" {
			_, err := fmt.Sscan(v, &n)
			Expect(err).NotTo(HaveOccurred())
		}
		if v := os.Getenv("CACHE_MEASURE_POOL_KIB"); v != "" {
			_, err := fmt.Sscan(v, &kib)
			Expect(err).NotTo(HaveOccurred())
		}
		ns := newNamespace()
		command := make([]string, kib/4)
		for i := range command {
			command[i] = strings.Repeat("x", 4096)
		}
		for i := range n {
			pool := &sandboxv1alpha1.SandboxWarmPool{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pool-%03d", i)},
				Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To[int32](0),
					Template: sandboxv1alpha1.SandboxTemplate{Image: busyboxImage, Command: command}},
			}
			Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		}
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(context.Background(), &sandboxv1alpha1.SandboxWarmPool{}, client.InNamespace(ns))).To(Succeed())
		})
		opts := CacheOptions(testNodePrefix + "cache")
		opts.Scheme = k8sClient.Scheme()
		before := heapInUse()
		c, err := cache.New(cfg, opts)
		Expect(err).NotTo(HaveOccurred())
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _ = c.Start(cctx) }()
		_, err = c.GetInformer(cctx, &sandboxv1alpha1.SandboxWarmPool{})
		Expect(err).NotTo(HaveOccurred())
		Expect(c.WaitForCacheSync(cctx)).To(BeTrue())
		after := heapInUse()
		runtime.KeepAlive(c)
		used := float64(after-before) / (1 << 20)
		AddReportEntry("SandboxWarmPool cache heap", fmt.Sprintf("%d pools with a %d KiB command: %.1f MiB", n, kib, used))
		GinkgoWriter.Printf("SandboxWarmPool cache heap for %d pools with a %d KiB command: %.1f MiB\n", n, kib, used)
	})
})
