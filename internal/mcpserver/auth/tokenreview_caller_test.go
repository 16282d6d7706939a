package auth

import (
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
)

// A Kubernetes backend reviews access for exactly the reviewed user, so the
// Caller must carry all of its user info.
var _ = Describe("kubeCaller", Label("unit"), func() {
	It("keeps all of the user info", func() {
		c := kubeCaller(authnv1.UserInfo{
			Username: "system:serviceaccount:team-a:agent", UID: "u-1", Groups: []string{"g"},
			Extra: map[string]authnv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"p"}},
		})
		Expect(c.ID).To(Equal("kube:system:serviceaccount:team-a:agent"), "caller = %+v", c)
		Expect(c.Username).To(Equal("system:serviceaccount:team-a:agent"), "caller = %+v", c)
		Expect(c.UID).To(Equal("u-1"), "caller = %+v", c)
		Expect(c.Groups).To(HaveLen(1), "caller = %+v", c)
		Expect(c.Extra["authentication.kubernetes.io/pod-name"][0]).To(Equal("p"), "caller = %+v", c)
		Expect(c.IsKubernetesUser()).To(BeTrue(), "caller = %+v", c)
	})

	It("does not count the stdio caller as a Kubernetes user", func() {
		Expect((contract.Caller{ID: contract.LocalIdentity}).IsKubernetesUser()).To(BeFalse(), "the stdio caller counts as a Kubernetes user")
	})
})
