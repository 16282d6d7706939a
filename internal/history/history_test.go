package history

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/leakcheck"
)

func TestHistory(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "history suite")
	leakcheck.VerifyNone(t)
}

func rec(id string, exit int) Record {
	return Record{ID: id, Command: []string{"echo", id}, ExitCode: exit, StartedAt: time.Unix(1700000000, 0).UTC()}
}

func ids(recs []Record) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

var _ = Describe("Store", Label("unit"), func() {
	for _, kind := range []string{"file", "memory"} {
		Context("kept in "+kind, func() {
			var (
				s   *Store
				dir string
			)
			BeforeEach(func() {
				if kind == "file" {
					dir = GinkgoT().TempDir()
				} else {
					dir = ""
				}
				var err error
				s, err = New(dir, 3)
				Expect(err).NotTo(HaveOccurred())
			})

			It("returns records oldest first, keeps only the newest maximum, and tails", func() {
				for i := range 8 {
					Expect(s.Append("sbx-1", rec(string(rune('a'+i)), i))).To(Succeed())
				}
				all, err := s.Tail("sbx-1", 0)
				Expect(err).NotTo(HaveOccurred())
				Expect(ids(all)).To(Equal([]string{"f", "g", "h"}))
				last, err := s.Tail("sbx-1", 2)
				Expect(err).NotTo(HaveOccurred())
				Expect(ids(last)).To(Equal([]string{"g", "h"}))
				Expect(last[1].ExitCode).To(Equal(7))
				Expect(last[1].Command).To(Equal([]string{"echo", "h"}))
			})

			It("keeps sandboxes apart and forgets one on Delete", func() {
				Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
				Expect(s.Append("sbx-2", rec("b", 1))).To(Succeed())
				Expect(s.Delete("sbx-1")).To(Succeed())
				Expect(s.Delete("sbx-1")).To(Succeed(), "Delete is idempotent")
				gone, err := s.Tail("sbx-1", 0)
				Expect(err).NotTo(HaveOccurred())
				Expect(gone).To(BeEmpty())
				kept, err := s.Tail("sbx-2", 0)
				Expect(err).NotTo(HaveOccurred())
				Expect(ids(kept)).To(Equal([]string{"b"}))
			})

			It("follows: the tail first, then new records, until the context ends", func() {
				Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
				Expect(s.Append("sbx-1", rec("b", 0))).To(Succeed())
				ctx, cancel := context.WithCancel(context.Background())
				got := make(chan string, 10)
				done := make(chan error, 1)
				go func() {
					done <- s.Follow(ctx, "sbx-1", 1, func(r Record) error { got <- r.ID; return nil })
				}()
				Eventually(got).Should(Receive(Equal("b")))
				// The subscription is registered before the tail is sent, so
				// an append now cannot be missed.
				Expect(s.Append("sbx-1", rec("c", 0))).To(Succeed())
				Eventually(got).Should(Receive(Equal("c")))
				Consistently(got, 100*time.Millisecond).ShouldNot(Receive())
				cancel()
				Eventually(done).Should(Receive(BeNil()))
			})

			It("stops following when the callback fails", func() {
				Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
				boom := errors.New("client went away")
				err := s.Follow(context.Background(), "sbx-1", 0, func(Record) error { return boom })
				Expect(err).To(MatchError(boom))
			})

			It("rejects keys that could name another file", func() {
				for _, key := range []string{"", ".", "..", "../x", "a/b", "a\x00b", "-leading-dash-is-fine-but/slash-is-not"} {
					Expect(s.Append(key, rec("a", 0))).To(MatchError(ErrInvalidKey), "key %q", key)
					_, err := s.Tail(key, 0)
					Expect(err).To(MatchError(ErrInvalidKey), "key %q", key)
				}
			})
		})
	}

	It("survives a restart and skips a torn last line", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
		Expect(s.Append("sbx-1", rec("b", 2))).To(Succeed())
		f, err := os.OpenFile(filepath.Join(dir, "sbx-1.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
		Expect(err).NotTo(HaveOccurred())
		_, err = f.WriteString(`{"id":"torn","comm`)
		Expect(err).NotTo(HaveOccurred())
		Expect(f.Close()).To(Succeed())

		reopened, err := New(dir, 10)
		Expect(err).NotTo(HaveOccurred())
		got, err := reopened.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(got)).To(Equal([]string{"a", "b"}))
		Expect(got[1].ExitCode).To(Equal(2))
	})

	It("compacts the file so it does not grow without bound", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 5)
		Expect(err).NotTo(HaveOccurred())
		for i := range 100 {
			Expect(s.Append("sbx-1", rec(string(rune('A'+i%26)), i))).To(Succeed())
		}
		data, err := os.ReadFile(filepath.Join(dir, "sbx-1.jsonl"))
		Expect(err).NotTo(HaveOccurred())
		Expect(len(splitLines(data))).To(BeNumerically("<=", 10))
		got, err := s.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(HaveLen(5))
		Expect(got[4].ExitCode).To(Equal(99))
	})

	It("drops a follower that does not keep up instead of blocking appends", func() {
		s, err := New("", 10)
		Expect(err).NotTo(HaveOccurred())
		release := make(chan struct{})
		done := make(chan error, 1)
		started := make(chan struct{})
		go func() {
			first := true
			done <- s.Follow(context.Background(), "sbx-1", 0, func(Record) error {
				if first {
					first = false
					close(started)
					<-release
				}
				return nil
			})
		}()
		Expect(s.Append("sbx-1", rec("first", 0))).To(Succeed())
		Eventually(started).Should(BeClosed())
		appended := make(chan struct{})
		go func() {
			defer close(appended)
			for range 1000 {
				_ = s.Append("sbx-1", rec("x", 0))
			}
		}()
		Eventually(appended, 5*time.Second).Should(BeClosed(), "appends must not block on a slow follower")
		close(release)
		Eventually(done).Should(Receive(MatchError(ContainSubstring("fell behind"))))
	})
})

var _ = Describe("Store locking", Label("unit"), func() {
	// A FIFO in place of sandbox A's history file stands for a slow disk:
	// counting A's lines (its first append) opens it and then reads until
	// the test writes. On 90280d9 that read held the store-wide lock, and
	// every other sandbox's appends and reads waited for it.
	It("lets a long read of one sandbox's history hold up no other sandbox's appends or reads (Low 15)", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Append("sbx-b", rec("b0", 0))).To(Succeed())
		fifo := filepath.Join(dir, "sbx-a.jsonl")
		Expect(syscall.Mkfifo(fifo, 0o600)).To(Succeed())

		appendedA := make(chan error, 1)
		go func() { appendedA <- s.Append("sbx-a", rec("a0", 0)) }()
		// Opening the write end returns once A's read has opened the file:
		// A's read is then under way, blocked in read(2) until we write.
		opened := make(chan *os.File, 1)
		go func() {
			defer GinkgoRecover()
			w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			Expect(err).NotTo(HaveOccurred())
			opened <- w
		}()
		var writer *os.File
		Eventually(opened, 10*time.Second).Should(Receive(&writer))
		DeferCleanup(func() { _ = writer.Close() })

		appendedB := make(chan error, 1)
		go func() { appendedB <- s.Append("sbx-b", rec("b1", 0)) }()
		Eventually(appendedB, 10*time.Second).Should(Receive(BeNil()), "B's append waited for A's read")
		tailB, err := s.Tail("sbx-b", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(tailB)).To(Equal([]string{"b0", "b1"}))
		Expect(appendedA).NotTo(Receive(), "A's read was still blocked while B was served")

		// The end of A's slow file ends its read and its append.
		Expect(writer.Close()).To(Succeed())
		Eventually(appendedA, 10*time.Second).Should(Receive())
	})

	It("serialises one sandbox's appends, and forgets a key's state once deleted", func() {
		s, err := New(GinkgoT().TempDir(), 1000)
		Expect(err).NotTo(HaveOccurred())
		done := make(chan struct{})
		for g := range 4 {
			go func() {
				defer GinkgoRecover()
				defer func() { done <- struct{}{} }()
				for i := range 50 {
					Expect(s.Append("sbx-1", rec(fmt.Sprintf("%d-%d", g, i), 0))).To(Succeed())
				}
			}()
		}
		for range 4 {
			Eventually(done, 10*time.Second).Should(Receive())
		}
		all, err := s.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(all).To(HaveLen(200), "no append was lost or torn")
		Expect(s.Delete("sbx-1")).To(Succeed())
		s.mu.Lock()
		defer s.mu.Unlock()
		Expect(s.keys).To(BeEmpty())
	})

	It("ends a follower with ErrDeleted when its sandbox's history is deleted", func() {
		s, err := New(GinkgoT().TempDir(), 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := make(chan string, 10)
		done := make(chan error, 1)
		go func() {
			done <- s.Follow(ctx, "sbx-1", 0, func(r Record) error { got <- r.ID; return nil })
		}()
		Eventually(got).Should(Receive(Equal("a")))
		Expect(s.Delete("sbx-1")).To(Succeed())
		Eventually(done, 5*time.Second).Should(Receive(MatchError(ErrDeleted)))
	})
})

func splitLines(b []byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == '\n' {
			out = append(out, b[start:i])
			start = i + 1
		}
	}
	return out
}
