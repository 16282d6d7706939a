package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	jose "gopkg.in/go-jose/go-jose.v2"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// The pure parts of OIDCAuth: its configuration checks, the mapping of
// claims to a caller, its cache, and what it refuses before it contacts
// the issuer. The whole of it against a real issuer is in
// internal/mcpserver/mcpmain (oidc_test.go).
var _ = Describe("OIDCAuth", Label("unit"), func() {
	// unreachable is an issuer no one answers for: nothing here may need it.
	const unreachable = "https://127.0.0.1:1/"
	const resource = "https://mcp.example.com/mcp"

	newAuth := func(mod func(*OIDCOptions)) (*OIDCAuth, error) {
		o := OIDCOptions{IssuerURL: unreachable, Audience: resource}
		if mod != nil {
			mod(&o)
		}
		return NewOIDCAuth(o)
	}

	It("refuses configurations that would weaken the checks or let a claim name a reserved user", func() {
		dir := GinkgoT().TempDir()
		notPEM := filepath.Join(dir, "ca.crt")
		Expect(os.WriteFile(notPEM, []byte("not a certificate"), 0o600)).To(Succeed())
		for name, mod := range map[string]func(*OIDCOptions){
			"an http issuer":            func(o *OIDCOptions) { o.IssuerURL = "http://issuer.example/" },
			"an issuer with a query":    func(o *OIDCOptions) { o.IssuerURL = "https://issuer.example/?a=b" },
			"a relative audience":       func(o *OIDCOptions) { o.Audience = "/mcp" },
			"a system: username prefix": func(o *OIDCOptions) { o.UsernamePrefix = "system:serviceaccount:" },
			"a system: groups prefix":   func(o *OIDCOptions) { o.GroupsPrefix = "system:" },
			"a claim without a map":     func(o *OIDCOptions) { o.NamespaceClaim = "tenant" },
			"a map without a claim":     func(o *OIDCOptions) { o.Namespaces = map[string]string{"a": "team-a"} },
			"a map to a bad namespace": func(o *OIDCOptions) {
				o.NamespaceClaim, o.Namespaces = "tenant", map[string]string{"a": "Team_A"}
			},
			"a missing CA file":   func(o *OIDCOptions) { o.CAFile = filepath.Join(dir, "missing") },
			"a CA file of no PEM": func(o *OIDCOptions) { o.CAFile = notPEM },
		} {
			_, err := newAuth(mod)
			Expect(err).To(HaveOccurred(), name)
		}
		a, err := newAuth(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(a.opts.UsernameClaim).To(Equal("sub"))
		Expect(a.opts.UsernamePrefix).To(Equal("oidc:"))
		Expect(a.opts.GroupsPrefix).To(Equal("oidc:"))
	})

	claims := func(s string) map[string]json.RawMessage {
		GinkgoHelper()
		var c map[string]json.RawMessage
		Expect(json.Unmarshal([]byte(s), &c)).To(Succeed())
		return c
	}

	It("names the caller by the prefixed claim, so that no token names a ServiceAccount or a system group", func() {
		a, err := newAuth(func(o *OIDCOptions) { o.GroupsClaim = "groups" })
		Expect(err).NotTo(HaveOccurred())
		c, err := a.caller(claims(`{"sub":"system:serviceaccount:kube-system:admin","groups":["system:masters","devs"]}`))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Username).To(Equal("oidc:system:serviceaccount:kube-system:admin"))
		Expect(c.ID).To(Equal("kube:oidc:system:serviceaccount:kube-system:admin"))
		Expect(c.Groups).To(Equal([]string{"oidc:system:masters", "oidc:devs"}))
		Expect(c.IsKubernetesUser()).To(BeTrue())

		c, err = a.caller(claims(`{"sub":"alice","groups":"devs"}`))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Groups).To(Equal([]string{"oidc:devs"}), "a single group as a string")

		for name, cl := range map[string]string{
			"no sub":            `{"groups":["devs"]}`,
			"an empty sub":      `{"sub":""}`,
			"a numeric sub":     `{"sub":42}`,
			"groups of numbers": `{"sub":"alice","groups":[1,2]}`,
		} {
			_, err := a.caller(claims(cl))
			Expect(err).To(MatchError(ErrUnauthenticated), name)
		}
	})

	It("maps a claim to a namespace only through the configuration", func() {
		a, err := newAuth(func(o *OIDCOptions) {
			o.NamespaceClaim = "tenants"
			o.Namespaces = map[string]string{"a": "team-a", "a-too": "team-a", "b": "team-b"}
		})
		Expect(err).NotTo(HaveOccurred())
		for cl, want := range map[string]string{
			`{"sub":"u","tenants":"a"}`:                      "team-a",
			`{"sub":"u","tenants":["a","a-too","unknown"]}`:  "team-a",
			`{"sub":"u","tenants":["team-b","kube-system"]}`: "", // namespace names are not values
			`{"sub":"u"}`:                "",
			`{"sub":"u","tenants":null}`: "",
		} {
			c, err := a.caller(claims(cl))
			Expect(err).NotTo(HaveOccurred(), cl)
			Expect(c.Namespace).To(Equal(want), cl)
		}
		c, err := a.caller(claims(`{"sub":"u","tenants":["a","b"]}`))
		Expect(err).To(MatchError(ErrForbidden))
		Expect(err.Error()).To(And(ContainSubstring("team-a, team-b"), ContainSubstring(`"tenants"`)))
		Expect(c.Username).To(Equal("oidc:u"), "the refused caller is named for the log")
		_, err = a.caller(claims(`{"sub":"u","tenants":{"a":1}}`))
		Expect(err).To(MatchError(ErrUnauthenticated))
	})

	It("remembers an accepted token no longer than its expiry", func() {
		now := time.Now()
		a, err := newAuth(func(o *OIDCOptions) { o.Now = func() time.Time { return now } })
		Expect(err).NotTo(HaveOccurred())
		c := contract.Caller{ID: "kube:oidc:u", Username: "oidc:u"}
		a.remember("short", c, now.Add(time.Second))
		a.remember("long", c, now.Add(time.Hour))
		Expect(a.Recognizes("short")).To(BeTrue())
		Expect(a.Recognizes("other")).To(BeFalse())
		now = now.Add(2 * time.Second)
		Expect(a.Recognizes("short")).To(BeFalse(), "remembered past its expiry")
		Expect(a.Recognizes("long")).To(BeTrue())
		now = now.Add(oidcCacheTTL)
		Expect(a.Recognizes("long")).To(BeFalse(), "remembered past the cache lifetime")
	})

	It("refuses what is not a JWT of its issuer before contacting the issuer, and answers unavailable while it cannot", func() {
		a, err := newAuth(nil)
		Expect(err).NotTo(HaveOccurred())
		ctx := context.Background()
		signed := func(iss string) string {
			GinkgoHelper()
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			Expect(err).NotTo(HaveOccurred())
			signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, nil)
			Expect(err).NotTo(HaveOccurred())
			payload, _ := json.Marshal(map[string]any{"iss": iss, "sub": "u", "aud": resource, "exp": time.Now().Add(time.Hour).Unix()})
			jws, err := signer.Sign(payload)
			Expect(err).NotTo(HaveOccurred())
			tok, err := jws.CompactSerialize()
			Expect(err).NotTo(HaveOccurred())
			return tok
		}
		for name, tok := range map[string]string{
			"not a JWT":       "not-a-jwt",
			"too many parts":  "a.b.c.d",
			"too long":        strings.Repeat("a", maxOIDCTokenBytes) + ".b.c",
			"another issuer":  signed("https://evil.example/"),
			"no issuer":       signed(""),
			"a prefix of iss": signed(strings.TrimSuffix(unreachable, "/")),
		} {
			_, err := a.Authenticate(ctx, tok)
			Expect(err).To(MatchError(ErrUnauthenticated), name)
			Expect(a.lastTry.IsZero()).To(BeTrue(), "%s: the issuer was contacted", name)
		}
		_, err = a.Authenticate(ctx, signed(unreachable))
		Expect(err).To(MatchError(contract.ErrUnavailable), "a token of the issuer while the issuer is down is a 503, not a 401")
		Expect(err).NotTo(MatchError(ErrUnauthenticated))
	})
})
