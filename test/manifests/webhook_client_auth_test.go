/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// config/components/webhook-client-auth, as `make deploy
// WEBHOOK_CLIENT_CA=<pem>` adds it to config/default.
var _ = Describe("The webhook-client-auth component", func() {
	webhookOf := func(dir string) *appsv1.Deployment {
		GinkgoHelper()
		var d appsv1.Deployment
		convert(find(render(dir), "Deployment", "code-sandbox-webhook"), &d)
		return &d
	}

	It("makes the webhook require a client certificate signed by the CA in the ConfigMap code-sandbox-webhook-client-ca", func() {
		overlay := GinkgoT().TempDir()
		rel, err := filepath.Rel(overlay, testenv.RepoPath("config"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(
			"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- "+rel+"/default\n"+
				"components:\n- "+rel+"/components/webhook-client-auth\n"), 0o600)).To(Succeed())

		d := webhookOf(overlay)
		c := d.Spec.Template.Spec.Containers[0]
		path := flags(c.Args)["--webhook-client-ca"]
		Expect(path).NotTo(BeEmpty(), "the webhook runs without --webhook-client-ca")

		var mountedFrom string
		for _, m := range c.VolumeMounts {
			if filepath.Dir(path) == m.MountPath {
				Expect(m.ReadOnly).To(BeTrue())
				mountedFrom = m.Name
			}
		}
		Expect(mountedFrom).NotTo(BeEmpty(), "nothing is mounted at %s", filepath.Dir(path))
		var found bool
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == mountedFrom {
				found = true
				Expect(v.ConfigMap).NotTo(BeNil(), "volume %s is not a ConfigMap", v.Name)
				Expect(v.ConfigMap.Name).To(Equal("code-sandbox-webhook-client-ca"))
				// Not optional: without its CA the webhook must not start
				// (serving unauthenticated instead).
				Expect(v.ConfigMap.Optional).To(Or(BeNil(), HaveValue(BeFalse())))
			}
		}
		Expect(found).To(BeTrue(), "no volume %s", mountedFrom)
		Expect(filepath.Base(path)).To(Equal("ca.crt"), "hack/ensure-webhook-client-ca.sh stores the CA under the key ca.crt")
	})

	It("is not in config/default: the shipped webhook takes any caller unless the flag is set", func() {
		Expect(flags(webhookOf("config/default").Spec.Template.Spec.Containers[0].Args)).NotTo(HaveKey("--webhook-client-ca"))
	})
})
