/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
)

func egressSandbox(hosts ...string) *sandboxv1alpha1.Sandbox {
	sbx := egressOnly()
	sbx.Spec.Network.Egress = &sandboxv1alpha1.EgressPolicy{}
	for _, h := range hosts {
		sbx.Spec.Network.Egress.Allow = append(sbx.Spec.Network.Egress.Allow, sandboxv1alpha1.EgressRule{Host: h})
	}
	return sbx
}

func egressQuota(require bool, hosts ...string) *sandboxv1alpha1.SandboxQuota {
	return teamQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowEgress: true,
		Egress: &sandboxv1alpha1.SandboxQuotaEgress{RequirePolicy: require, AllowedHosts: hosts}})
}

func teamQuota(spec sandboxv1alpha1.SandboxQuotaSpec) *sandboxv1alpha1.SandboxQuota {
	return &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: "ns"}, Spec: spec}
}

// egressOnly is a Sandbox with network mode Egress and no policy.
func egressOnly() *sandboxv1alpha1.Sandbox {
	sbx := sandbox("a", "", "", "")
	sbx.Spec.Image = "busybox"
	sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
	return &sbx
}

var _ = Describe("egress rules", func() {
	It("keeps unrestricted Egress allowed unless a policy is required", func() {
		sbx := egressOnly()
		Expect(quota.Violations(egressQuota(false), sbx)).To(BeEmpty())
		want := `sandbox quota "team" requires an egress policy (spec.network.egress) for network mode Egress: unrestricted egress reaches every public host`
		Expect(quota.Violations(egressQuota(true), sbx)).To(Equal([]string{want}))
		// An allow-list implies it: the internet is outside any list.
		Expect(quota.Violations(egressQuota(false, "*.example.com"), sbx)).To(Equal([]string{want}))
	})

	It("refuses Egress with a policy too when allowEgress is false: one check, not two", func() {
		sbx := egressSandbox("api.example.com")
		Expect(quota.Violations(teamQuota(sandboxv1alpha1.SandboxQuotaSpec{}), sbx)).To(Equal([]string{
			`sandbox quota "team" does not allow network mode Egress (its allowEgress is false); use network mode None`,
		}))
	})

	It("admits a policy inside the allowed hosts and names every host outside them", func() {
		qt := egressQuota(true, "*.example.com", "pypi.org")
		Expect(quota.Violations(qt, egressSandbox("api.example.com", "*.cdn.example.com", "pypi.org", "*.example.com"))).To(BeEmpty())
		Expect(quota.Violations(qt, egressSandbox("api.example.com", "evil.org", "example.com", "*.pypi.org"))).To(Equal([]string{
			`sandbox quota "team" does not allow egress to host "evil.org"; allowed hosts: *.example.com, pypi.org`,
			`sandbox quota "team" does not allow egress to host "example.com"; allowed hosts: *.example.com, pypi.org`,
			`sandbox quota "team" does not allow egress to host "*.pypi.org"; allowed hosts: *.example.com, pypi.org`,
		}))
		// An empty policy (deny all) is inside every list.
		Expect(quota.Violations(qt, egressSandbox())).To(BeEmpty())
	})

	DescribeTable("HostAllowed",
		func(pattern, host string, want bool) {
			Expect(quota.HostAllowed([]string{pattern}, host)).To(Equal(want), "%s covers %s", pattern, host)
		},
		Entry(nil, "api.example.com", "api.example.com", true),
		Entry(nil, "api.example.com", "API.example.com", false),
		Entry(nil, "api.example.com", "api.example.com.", false),
		Entry(nil, "api.example.com", "*.api.example.com", false),
		Entry(nil, "*.example.com", "a.example.com", true),
		Entry(nil, "*.example.com", "a.b.example.com", true),
		Entry(nil, "*.example.com", "*.example.com", true),
		Entry(nil, "*.example.com", "*.a.example.com", true),
		Entry(nil, "*.example.com", "example.com", false),
		Entry(nil, "*.example.com", "badexample.com", false),
		Entry(nil, "*.example.com", "*.badexample.com", false),
		Entry(nil, "*.example.com", "a.example.com.evil.org", false),
		Entry(nil, "*.example.com", ".example.com", false),
		Entry(nil, "*.example.com", "*.com", false),
		Entry(nil, "*.example.com", "*", false),
		Entry(nil, "*.a.example.com", "*.example.com", false),
		Entry(nil, "*.com", "example.com", true), // the CRD refuses *.com; the matcher is still only a suffix test
		Entry(nil, "*", "example.com", false),
		Entry(nil, "a.*.com", "a.b.com", false),
		Entry(nil, "", "", false),
		Entry(nil, "*.", "a.", false),
	)

	It("names each of a huge list's outside hosts", func() {
		hosts := make([]string, sandboxv1alpha1.MaxEgressRules)
		for i := range hosts {
			hosts[i] = fmt.Sprintf("h%d.other.org", i)
		}
		Expect(quota.Violations(egressQuota(true, "*.example.com"), egressSandbox(hosts...))).To(HaveLen(sandboxv1alpha1.MaxEgressRules))
	})
})
