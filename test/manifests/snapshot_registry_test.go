/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// config/components/snapshot-registry, as config/kind/deploy (make
// kind-deploy) adds it to config/default.
var _ = Describe("The snapshot-registry component (config/kind/deploy)", func() {
	managerOf := func(dir string) *appsv1.DaemonSet {
		GinkgoHelper()
		var d appsv1.DaemonSet
		convert(find(render(dir), "DaemonSet", "code-sandbox-controller-manager"), &d)
		return &d
	}

	It("points the managers at the registry's Service over TLS, trusting only the CA in its ConfigMap", func() {
		objs := render("config/kind/deploy")
		var ds appsv1.DaemonSet
		convert(find(objs, "DaemonSet", "code-sandbox-controller-manager"), &ds)
		c := ds.Spec.Template.Spec.Containers[0]
		f := flags(c.Args)
		base := f["--snapshot-registry"]
		Expect(base).NotTo(BeEmpty(), "the managers run without --snapshot-registry")
		host, _, _ := strings.Cut(base, "/")

		var svc corev1.Service
		convert(find(objs, "Service", "code-sandbox-snapshot-registry"), &svc)
		var reg appsv1.Deployment
		convert(find(objs, "Deployment", "code-sandbox-snapshot-registry"), &reg)
		expectServiceReaches(find(objs, "Service", "code-sandbox-snapshot-registry"), &reg)
		// The managers (hostNetwork, the node's resolv.conf) address it by
		// the Service's fixed ClusterIP, which its certificate names
		// (hack/ensure-snapshot-registry-tls.sh's default).
		Expect(svc.Spec.ClusterIP).NotTo(BeEmpty())
		Expect(host).To(Equal(svc.Spec.ClusterIP + ":5000"))
		Expect(svc.Spec.Ports).To(HaveLen(1))
		Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(5000))

		ca := f["--snapshot-registry-ca"]
		Expect(filepath.Base(ca)).To(Equal("ca.crt"))
		var from string
		for _, m := range c.VolumeMounts {
			if m.MountPath == filepath.Dir(ca) {
				Expect(m.ReadOnly).To(BeTrue())
				from = m.Name
			}
		}
		Expect(from).NotTo(BeEmpty(), "nothing is mounted at %s", filepath.Dir(ca))
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == from {
				Expect(v.ConfigMap).NotTo(BeNil(), "the CA comes from a ConfigMap, never the registry's Secret (its key)")
				Expect(v.ConfigMap.Name).To(Equal("code-sandbox-snapshot-registry-ca"))
			}
		}

		// The registry serves TLS from its Secret, hardened like the
		// operator's own pods, off the workers.
		Expect(reg.Spec.Template.Spec.NodeSelector).To(HaveKey("node-role.kubernetes.io/control-plane"))
		Expect(reg.Spec.Template.Spec.AutomountServiceAccountToken).To(HaveValue(BeFalse()))
		rc := reg.Spec.Template.Spec.Containers[0]
		Expect(rc.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(rc.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(rc.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		Expect(reg.Spec.Template.Spec.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(rc.ReadinessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTPS))
		var secret bool
		for _, v := range reg.Spec.Template.Spec.Volumes {
			secret = secret || (v.Secret != nil && v.Secret.SecretName == "code-sandbox-snapshot-registry-tls")
		}
		Expect(secret).To(BeTrue(), "the registry mounts its TLS Secret")
		cfg := find(objs, "ConfigMap", "code-sandbox-snapshot-registry-config")
		data, _, _ := unstructured.NestedString(cfg.Object, "data", "config.yml")
		Expect(data).To(ContainSubstring("tls:"))
		Expect(data).To(MatchRegexp(`delete:\s+enabled: true`), "deleting a snapshot deletes its manifest")
	})

	It("is not in config/default: production managers keep snapshots on their nodes unless configured", func() {
		Expect(flags(managerOf("config/default").Spec.Template.Spec.Containers[0].Args)).NotTo(HaveKey("--snapshot-registry"))
	})
})
