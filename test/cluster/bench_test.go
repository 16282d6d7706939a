//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// benchSpecs measures Sandbox create-to-Ready through the real cluster (the
// API server, the quota webhook, the DaemonSet's manager, Docker, the
// status write, and the watch that reports it) against a raw Docker create
// + start of the same image with the same hardening, in the same run, and
// reports the ratio of the medians. Both sides are driven from this process
// with Go clients (client-go's watch; the Docker API), so that neither pays
// for starting a CLI. The goal is at most 1.3×; it is reported, not
// enforced, because on a shared 2-core machine the noise is larger than the
// margin.
func benchSpecs() {
	Describe("create-to-Ready against raw Docker", Ordered, Label("bench"), func() {
		const (
			ns     = "cluster-bench"
			rounds = 9
		)
		var (
			kube   client.WithWatch
			docker *dockerclient.Client
		)
		BeforeAll(func(ctx SpecContext) {
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			Expect(err).NotTo(HaveOccurred())
			scheme := runtime.NewScheme()
			Expect(corev1.AddToScheme(scheme)).To(Succeed())
			Expect(sandboxv1alpha1.AddToScheme(scheme)).To(Succeed())
			kube, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme})
			Expect(err).NotTo(HaveOccurred())
			docker, err = dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(docker.Close)

			_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout=120s")
			mustKubectl(ctx, "create", "namespace", ns)
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", ns, "--wait", "--timeout=90s")
				_, _ = kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
			}, NodeTimeout(3*time.Minute))
		}, NodeTimeout(3*time.Minute))

		// createToReady creates a Sandbox and returns when a watch, opened
		// before the create, reports it Ready.
		createToReady := func(ctx context.Context, name string) time.Duration {
			GinkgoHelper()
			// List, then watch from the list's resourceVersion, as kubectl
			// wait and informers do.
			byName := client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)}
			var list sandboxv1alpha1.SandboxList
			Expect(kube.List(ctx, &list, client.InNamespace(ns), byName)).To(Succeed())
			w, err := kube.Watch(ctx, &sandboxv1alpha1.SandboxList{}, client.InNamespace(ns), byName,
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
			Expect(err).NotTo(HaveOccurred())
			defer w.Stop()
			sbx := &sandboxv1alpha1.Sandbox{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: sandboxv1alpha1.SandboxSpec{Image: sampleImage, ImagePullPolicy: sandboxv1alpha1.PullNever,
					ActiveDeadlineSeconds: ptr.To[int64](600)},
			}
			start := time.Now()
			Expect(kube.Create(ctx, sbx)).To(Succeed())
			timeout := time.After(2 * time.Minute)
			for {
				select {
				case ev, ok := <-w.ResultChan():
					Expect(ok).To(BeTrue(), "the watch ended")
					Expect(ev.Type).NotTo(Equal(watch.Error), "the watch failed: %+v", ev.Object)
					if ev.Type != watch.Added && ev.Type != watch.Modified {
						continue
					}
					got := ev.Object.(*sandboxv1alpha1.Sandbox)
					if meta.IsStatusConditionTrue(got.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
						return time.Since(start)
					}
				case <-timeout:
					Fail("sandbox " + name + " not Ready within 2m\n" + describeSandbox(ctx, ns, name))
				}
			}
		}

		// rawCreateStart creates and starts a container of the same image
		// with the manager's main hardening settings.
		rawCreateStart := func(ctx context.Context, name string) time.Duration {
			GinkgoHelper()
			start := time.Now()
			created, err := docker.ContainerCreate(ctx, &container.Config{
				Image: sampleImage, User: "65534:65534", Cmd: []string{"sleep", "600"},
			}, &container.HostConfig{
				NetworkMode: "none", ReadonlyRootfs: true, CapDrop: []string{"ALL"},
				SecurityOpt: []string{"no-new-privileges"}, Init: ptr.To(true),
				Resources: container.Resources{PidsLimit: ptr.To[int64](256), Memory: 512 << 20, MemorySwap: 512 << 20, NanoCPUs: 1e9},
			}, nil, nil, name)
			Expect(err).NotTo(HaveOccurred())
			Expect(docker.ContainerStart(ctx, created.ID, container.StartOptions{})).To(Succeed())
			elapsed := time.Since(start)
			_ = docker.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
			return elapsed
		}

		It("reports the ratio of the medians", func(ctx SpecContext) {
			var cluster, raw []time.Duration
			// One round of each first, unmeasured: the first create pays
			// for cold caches on both sides.
			createToReady(ctx, "bench-warmup")
			rawCreateStart(ctx, fmt.Sprintf("code-sandbox-cluster-bench-%d-warmup", GinkgoRandomSeed()))
			for i := range rounds {
				cluster = append(cluster, createToReady(ctx, fmt.Sprintf("bench-%d", i)))
				raw = append(raw, rawCreateStart(ctx, fmt.Sprintf("code-sandbox-cluster-bench-%d-%d", GinkgoRandomSeed(), i)))
			}
			mc, mr := median(cluster), median(raw)
			ratio := float64(mc) / float64(mr)
			AddReportEntry("create-to-Ready", fmt.Sprintf("cluster median %v (%v), raw docker create+start median %v (%v), ratio %.2f× (goal ≤ 1.3×)",
				mc.Round(time.Millisecond), cluster, mr.Round(time.Millisecond), raw, ratio))
			fmt.Fprintf(GinkgoWriter, "create-to-Ready: cluster %v, raw %v, ratio %.2f×\n", mc, mr, ratio)
		}, NodeTimeout(10*time.Minute))
	})
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
