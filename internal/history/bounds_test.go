package history

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// allocated runs fn and returns how many bytes it allocated on the heap
// (TotalAlloc counts every allocation, even one already collected, so a
// transient spike shows as well as a retained one).
func allocated(fn func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// appendRaw writes bytes to key's file as an older version or a corrupt
// disk could have left them.
func appendRaw(dir, key, raw string) {
	f, err := os.OpenFile(filepath.Join(dir, key+".jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	Expect(err).NotTo(HaveOccurred())
	_, err = f.WriteString(raw)
	Expect(err).NotTo(HaveOccurred())
	Expect(f.Close()).To(Succeed())
}

// hugeLine is a well-formed record whose command is n bytes long.
func hugeLine(id string, n int) string {
	return `{"id":"` + id + `","command":["sh","-c","` + strings.Repeat("x", n) + `"],"startedAt":"2024-01-01T00:00:00Z","durationMillis":1,"exitCode":0}` + "\n"
}

var _ = Describe("Store bounds", Label("unit"), func() {
	It("skips an oversized or corrupt line in the middle without losing the records after it, even through compaction", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 5)
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
		// 20 MiB: longer than any line buffer a reader should hold.
		appendRaw(dir, "sbx-1", hugeLine("huge", 20<<20))
		appendRaw(dir, "sbx-1", "this is not json\n")
		Expect(s.Append("sbx-1", rec("b", 1))).To(Succeed())
		Expect(s.Append("sbx-1", rec("c", 2))).To(Succeed())

		got, err := s.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(got)).To(ContainElements("b", "c"), "records after the bad lines must not disappear")
		Expect(ids(got)).NotTo(ContainElement("huge"))

		// After a restart, enough appends to compact (twice the maximum)
		// must keep the newest records, including those written after the
		// bad lines.
		reopened, err := New(dir, 5)
		Expect(err).NotTo(HaveOccurred())
		for _, id := range []string{"d", "e", "f", "g", "h", "i", "j", "k"} {
			Expect(reopened.Append("sbx-1", rec(id, 0))).To(Succeed())
		}
		got, err = reopened.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(got)).To(Equal([]string{"g", "h", "i", "j", "k"}))
		data, err := os.ReadFile(filepath.Join(dir, "sbx-1.jsonl"))
		Expect(err).NotTo(HaveOccurred())
		Expect(len(data)).To(BeNumerically("<", 1<<20), "compaction must drop the oversized line")
		Expect(string(data)).To(ContainSubstring(`"id":"k"`))
	})

	It("keeps a record of thousands of empty arguments, or of escaped bytes in every field, readable (Low 9)", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 10)
		Expect(err).NotTo(HaveOccurred())
		empty := Record{ID: "empty-args", Command: append([]string{"true"}, make([]string, 30000)...), StartedAt: time.Unix(1, 0)}
		Expect(s.Append("sbx-1", empty)).To(Succeed())
		ctl := strings.Repeat("\x01", MaxCommandBytes)
		escaped := Record{ID: "escaped", Command: []string{ctl}, WorkingDir: "/" + ctl, Error: ctl, Caller: ctl, StartedAt: time.Unix(1, 0)}
		Expect(s.Append("sbx-1", escaped)).To(Succeed())
		Expect(s.Append("sbx-1", rec("after", 0))).To(Succeed())

		data, err := os.ReadFile(filepath.Join(dir, "sbx-1.jsonl"))
		Expect(err).NotTo(HaveOccurred())
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			Expect(len(line)).To(BeNumerically("<=", MaxLineBytes))
		}
		got, err := s.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(got)).To(Equal([]string{"empty-args", "escaped", "after"}))
		Expect(got[0].CommandTruncated).To(BeTrue())
		Expect(got[0].Command[len(got[0].Command)-1]).To(ContainSubstring("command truncated to"))
		Expect(got[1].CommandTruncated).To(BeTrue())
	})

	It("shows a placeholder for a record longer than MaxLineBytes instead of skipping it (Low 9)", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
		appendRaw(dir, "sbx-1", hugeLine("huge", 2*MaxLineBytes))
		Expect(s.Append("sbx-1", rec("b", 0))).To(Succeed())
		got, err := s.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(got)).To(Equal([]string{"a", UnreadableID, "b"}))
		Expect(got[1].Error).To(ContainSubstring("longer than 65536 bytes"))
	})

	It("does not glue a record to a torn last line", func() {
		dir := GinkgoT().TempDir()
		s, err := New(dir, 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Append("sbx-1", rec("a", 0))).To(Succeed())
		appendRaw(dir, "sbx-1", `{"id":"torn","comm`)
		Expect(s.Append("sbx-1", rec("b", 0))).To(Succeed())
		got, err := s.Tail("sbx-1", 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids(got)).To(Equal([]string{"a", "b"}))
	})

	It("reads a tail, and appends after a restart, with bounded memory whatever the file holds", func() {
		dir := GinkgoT().TempDir()
		for i := range 4 {
			appendRaw(dir, "sbx-1", hugeLine("old"+string(rune('0'+i)), 16<<20))
		}
		s, err := New(dir, 1000)
		Expect(err).NotTo(HaveOccurred())
		// The first append after a restart learns the file's size.
		alloc := allocated(func() { Expect(s.Append("sbx-1", rec("new", 0))).To(Succeed()) })
		Expect(alloc).To(BeNumerically("<", 4<<20), "append after restart allocated %d bytes", alloc)

		var got []Record
		alloc = allocated(func() {
			got, err = s.Tail("sbx-1", 0)
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(alloc).To(BeNumerically("<", 4<<20), "tail allocated %d bytes", alloc)
		Expect(ids(got)).To(ContainElement("new"))

		// Records of a normal size: a tail of 10 reads only the end.
		for i := range 3000 {
			Expect(s.Append("sbx-2", Record{ID: string(rune('a'+i%26)) + "x", Shell: strings.Repeat("y", 512), StartedAt: time.Unix(1, 0)})).To(Succeed())
		}
		alloc = allocated(func() {
			got, err = s.Tail("sbx-2", 10)
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(HaveLen(10))
		Expect(alloc).To(BeNumerically("<", 512<<10), "a tail of 10 allocated %d bytes", alloc)
	})

	for _, kind := range []string{"file", "memory"} {
		It("cuts a recorded command to 4 KiB with a marker ("+kind+")", func() {
			dir := ""
			if kind == "file" {
				dir = GinkgoT().TempDir()
			}
			s, err := New(dir, 10)
			Expect(err).NotTo(HaveOccurred())
			long := strings.Repeat("z", 25<<20)
			Expect(s.Append("sbx-1", Record{ID: "argv", Command: []string{"sh", "-c", "true " + long, "more"}})).To(Succeed())
			Expect(s.Append("sbx-1", Record{ID: "shell", Shell: "true " + long, Error: long})).To(Succeed())
			got, err := s.Tail("sbx-1", 0)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(HaveLen(2))

			argv := got[0].Command
			Expect(argv[0]).To(Equal("sh"))
			Expect(argv[1]).To(Equal("-c"))
			Expect(strings.Join(argv, " ")).To(ContainSubstring("truncated"))
			Expect(len(strings.Join(argv, ""))).To(BeNumerically("<=", 4<<10+200))
			Expect(argv[2]).To(HavePrefix("true zzz"))

			Expect(got[1].Shell).To(HavePrefix("true zzz"))
			Expect(got[1].Shell).To(ContainSubstring("truncated"))
			Expect(len(got[1].Shell)).To(BeNumerically("<=", 4<<10+200))
			Expect(len(got[1].Error)).To(BeNumerically("<=", 4<<10+200))
		})

		It("caps the bytes a sandbox keeps, not only the records ("+kind+")", func() {
			dir := ""
			if kind == "file" {
				dir = GinkgoT().TempDir()
			}
			s, err := New(dir, 0)
			Expect(err).NotTo(HaveOccurred())
			// 1,500 records of 3 KiB are under the record maximum but
			// 4.5 MiB.
			for i := range 1500 {
				Expect(s.Append("sbx-1", Record{ID: "r" + strings.Repeat("0", i%7), Shell: strings.Repeat("q", 3<<10), ExitCode: i})).To(Succeed())
			}
			got, err := s.Tail("sbx-1", 0)
			Expect(err).NotTo(HaveOccurred())
			var total int
			for _, r := range got {
				total += len(r.Shell)
			}
			Expect(total).To(BeNumerically("<=", 2<<20), "a tail returned %d bytes of commands", total)
			Expect(got[len(got)-1].ExitCode).To(Equal(1499), "the newest record is kept")
			if kind == "file" {
				fi, err := os.Stat(filepath.Join(dir, "sbx-1.jsonl"))
				Expect(err).NotTo(HaveOccurred())
				Expect(fi.Size()).To(BeNumerically("<=", 4<<20+64<<10), "the file is capped in bytes")
			}
		})
	}
})
