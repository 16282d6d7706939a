package auth

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

var _ = Describe("StaticTokens", Label("unit"), func() {
	It("authenticates, reloads on rotation and keeps the tokens of a broken file", func() {
		f := filepath.Join(GinkgoT().TempDir(), "tokens")
		write := func(s string) {
			GinkgoHelper()
			Expect(os.WriteFile(f, []byte(s), 0o600)).To(Succeed())
		}
		write("# comment\n\naaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n")
		st, err := NewStaticTokens(f, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		ctx := context.Background()
		c, err := st.Authenticate(ctx, "bbbbbbbbbbbbbbbbbbbb")
		Expect(err).NotTo(HaveOccurred(), "got %+v", c)
		Expect(c.ID).To(Equal("bob"), "got %+v", c)
		_, err = st.Authenticate(ctx, "cccccccccccccccccccc")
		Expect(err).To(MatchError(ErrUnauthenticated), "unknown token")
		// Rotation: the file changes, the old token stops working.
		write("cccccccccccccccccccc carol\n")
		future := time.Now().Add(2 * time.Second)
		_ = os.Chtimes(f, future, future)
		st.checkedAt = time.Time{}
		c, err = st.Authenticate(ctx, "cccccccccccccccccccc")
		Expect(err).NotTo(HaveOccurred(), "after reload: %+v", c)
		Expect(c.ID).To(Equal("carol"), "after reload: %+v", c)
		_, err = st.Authenticate(ctx, "aaaaaaaaaaaaaaaaaaaa")
		Expect(err).To(HaveOccurred(), "rotated-out token still works")
		// A broken file keeps the previous tokens.
		write("short carol\n")
		future = future.Add(2 * time.Second)
		_ = os.Chtimes(f, future, future)
		st.checkedAt = time.Time{}
		_, err = st.Authenticate(ctx, "cccccccccccccccccccc")
		Expect(err).NotTo(HaveOccurred(), "broken file dropped the tokens")
	})

	DescribeTable("parseTokens refuses a malformed file",
		func(bad string) {
			_, err := parseTokens([]byte(bad))
			Expect(err).To(HaveOccurred(), "parseTokens(%q) accepted", bad)
		},
		Entry("empty", ""),
		Entry("short token", "short alice\n"),
		Entry("no identity", "aaaaaaaaaaaaaaaaaaaa\n"),
		Entry("duplicate token", "aaaaaaaaaaaaaaaaaaaa a\naaaaaaaaaaaaaaaaaaaa b\n"),
	)
})

type fakeReviewer struct {
	calls  int
	status authnv1.TokenReviewStatus
}

func (f *fakeReviewer) Create(_ context.Context, r *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.calls++
	out := r.DeepCopy()
	out.Status = f.status
	return out, nil
}

var _ = Describe("TokenReview authentication", Label("unit"), func() {
	It("accepts reviewed tokens for the audience, caches them and refuses the rest", func() {
		fr := &fakeReviewer{status: authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:team-a:agent", Groups: []string{"g"}}, Audiences: []string{"code-sandbox-mcp"}}}
		a := NewTokenReviewAuthWith(fr, []string{"code-sandbox-mcp"})
		ctx := context.Background()
		c, err := a.Authenticate(ctx, "tok")
		Expect(err).NotTo(HaveOccurred(), "got %+v", c)
		Expect(c.ID).To(Equal("kube:system:serviceaccount:team-a:agent"), "got %+v", c)
		Expect(c.Groups).To(HaveLen(1), "got %+v", c)
		_, err = a.Authenticate(ctx, "tok")
		Expect(err).NotTo(HaveOccurred(), "cache not used")
		Expect(fr.calls).To(Equal(1), "cache not used")
		fr.status.Audiences = []string{"https://kubernetes.default.svc"}
		_, err = a.Authenticate(ctx, "other")
		Expect(err).To(MatchError(ErrUnauthenticated), "wrong audience accepted")
		fr.status = authnv1.TokenReviewStatus{Authenticated: false, Error: "expired"}
		_, err = a.Authenticate(ctx, "third")
		Expect(err).To(MatchError(ErrUnauthenticated), "unauthenticated token accepted")
	})
})

var _ = Describe("caller authorization", Label("unit"), func() {
	ctx := context.Background()
	alice := contract.Caller{ID: "kube:alice", Username: "alice", Groups: []string{"devs", "system:authenticated"}}
	bob := contract.Caller{ID: "kube:bob", Username: "bob", Groups: []string{"system:authenticated"}}

	It("admits the users and groups of an allow-list and no one else", func() {
		Expect(AllowList{Users: []string{"alice"}}.Authorize(ctx, alice)).To(Succeed())
		Expect(AllowList{Groups: []string{"devs"}}.Authorize(ctx, alice)).To(Succeed())
		err := AllowList{Users: []string{"alice"}, Groups: []string{"devs"}}.Authorize(ctx, bob)
		Expect(err).To(MatchError(ErrForbidden))
		Expect(err.Error()).To(ContainSubstring(`"bob"`))
		Expect(AllowList{Users: []string{"anonymous"}}.Authorize(ctx, contract.Caller{ID: AnonymousIdentity})).To(MatchError(ErrForbidden), "a non-Kubernetes caller was admitted")
		Expect(AllowList{Users: []string{"Alice"}}.Authorize(ctx, alice)).To(MatchError(ErrForbidden), "names are not compared exactly")
	})

})
