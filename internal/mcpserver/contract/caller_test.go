package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("IdentityHash", Label("unit"), func() {
	It("is keyed with the owner key: stable under one key, unpredictable without it", func() {
		saved := *identityKey.Load()
		DeferCleanup(func() { identityKey.Store(&saved) })
		dir := GinkgoT().TempDir()
		keyA, keyB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
		Expect(os.WriteFile(keyA, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)).To(Succeed())
		Expect(os.WriteFile(keyB, []byte("fedcba9876543210fedcba9876543210"), 0o600)).To(Succeed())

		generated, err := LoadIdentityKey(keyA)
		Expect(err).NotTo(HaveOccurred())
		Expect(generated).To(BeFalse())
		a := IdentityHash("system:serviceaccount:team:agent")
		Expect(a).To(MatchRegexp(`^id-[0-9a-f]{16}$`))
		Expect(IdentityHash("system:serviceaccount:team:agent")).To(Equal(a))
		// The unkeyed digest the server used to write, which anyone could
		// compute, is not what it writes now.
		Expect(a).NotTo(Equal("id-" + unkeyed("system:serviceaccount:team:agent")))
		_, err = LoadIdentityKey(keyB)
		Expect(err).NotTo(HaveOccurred())
		Expect(IdentityHash("system:serviceaccount:team:agent")).NotTo(Equal(a), "another key gave the same hash")
		Expect(IdentityHash(LocalIdentity)).To(Equal(LocalIdentity))

		Expect(os.WriteFile(keyA, []byte("short\n"), 0o600)).To(Succeed())
		_, err = LoadIdentityKey(keyA)
		Expect(err).To(MatchError(ContainSubstring("at least 16")))
		generated, err = LoadIdentityKey(filepath.Join(dir, "missing"))
		Expect(err).NotTo(HaveOccurred())
		Expect(generated).To(BeTrue())
	})
})

func unkeyed(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return hex.EncodeToString(sum[:8])
}
