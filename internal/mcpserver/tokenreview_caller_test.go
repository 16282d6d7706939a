package mcpserver

import (
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
)

// A Kubernetes backend reviews access for exactly the reviewed user, so the
// Caller must carry all of its user info.
func TestKubeCallerKeepsUserInfo(t *testing.T) {
	c := kubeCaller(authnv1.UserInfo{
		Username: "system:serviceaccount:team-a:agent", UID: "u-1", Groups: []string{"g"},
		Extra: map[string]authnv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"p"}},
	})
	if c.ID != "kube:system:serviceaccount:team-a:agent" || c.Username != "system:serviceaccount:team-a:agent" || c.UID != "u-1" ||
		len(c.Groups) != 1 || c.Extra["authentication.kubernetes.io/pod-name"][0] != "p" || !c.IsKubernetesUser() {
		t.Errorf("caller = %+v", c)
	}
	if (Caller{ID: LocalIdentity}).IsKubernetesUser() {
		t.Error("the stdio caller counts as a Kubernetes user")
	}
}
