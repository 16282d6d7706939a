/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("LocalSnapshotStore", Label("unit"), func() {
	var (
		dir   string
		store *LocalSnapshotStore
		ctx   = context.Background()
	)
	BeforeEach(func() {
		dir = filepath.Join(GinkgoT().TempDir(), "snaps")
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		var err error
		store, err = NewLocalSnapshotStore(dir, "node-1")
		Expect(err).NotTo(HaveOccurred())
	})

	It("tightens its directory to 0700 and stores 0600 files it can read back and delete", func() {
		st, err := os.Stat(dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o700)))
		key := "0b7e2a4c-1d2e-4f5a-9b8c-7d6e5f4a3b2c"
		n, err := store.Put(ctx, key, func(w io.Writer) error { _, err := io.WriteString(w, "tar bytes"); return err })
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(int64(9)))
		st, err = os.Stat(filepath.Join(dir, key+".tar"))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o600)))
		rc, err := store.Open(ctx, key)
		Expect(err).NotTo(HaveOccurred())
		b, _ := io.ReadAll(rc)
		rc.Close()
		Expect(string(b)).To(Equal("tar bytes"))
		Expect(store.Location(key)).To(Equal("node-local:node-1"))
		Expect(store.Delete(ctx, key)).To(Succeed())
		Expect(store.Delete(ctx, key)).To(Succeed(), "deleting what is gone succeeds")
		_, err = store.Open(ctx, key)
		Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue())
	})

	It("keeps nothing when the write fails, not even a partial file", func() {
		_, err := store.Put(ctx, "abc", func(w io.Writer) error {
			_, _ = io.WriteString(w, "half")
			return errors.New("cut off")
		})
		Expect(err).To(MatchError("cut off"))
		entries, err := os.ReadDir(dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(entries).To(BeEmpty())
	})

	DescribeTable("refuses keys that are not UIDs before building a path",
		func(key string) {
			_, err := store.Put(ctx, key, func(io.Writer) error { return nil })
			Expect(err).To(MatchError(ContainSubstring("invalid snapshot key")))
			_, err = store.Open(ctx, key)
			Expect(err).To(MatchError(ContainSubstring("invalid snapshot key")))
			Expect(store.Delete(ctx, key)).To(MatchError(ContainSubstring("invalid snapshot key")))
		},
		Entry("traversal", "../../etc/passwd"),
		Entry("slash", "a/b"),
		Entry("empty", ""),
		Entry("upper case", "ABC"),
		Entry("dot", ".hidden"),
		Entry("too long", "a123456789012345678901234567890123456789012345678901234567890123456789"),
	)
})
