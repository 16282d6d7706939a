/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package execio

import (
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// manyEmptyArgs is a reader of {"command":["","",...]} with n empty
// arguments, generated as it is read.
func manyEmptyArgs(field string, n int) io.Reader {
	return io.MultiReader(strings.NewReader(`{"`+field+`":["x"`), io.LimitReader(repeatReader(`,""`), int64(3*n)), strings.NewReader(`]}`))
}

type repeatReader string

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r[i%len(r)]
	}
	return len(p) - len(p)%len(r), nil
}

var _ = Describe("DecodeRequest", Label("unit"), func() {
	It("decodes what encoding/json decodes, field names in any case (TestDecodeRequestMatchesJSON)", func() {
		in := Request{Command: []string{"ls", "-l"}, Shell: "sh", WorkingDir: "/w", Env: []string{"A=b"},
			Stdin: []byte("in\x00put"), TimeoutSeconds: 7, OutputLimitBytes: 9}
		b, err := json.Marshal(in)
		Expect(err).NotTo(HaveOccurred())
		got, err := DecodeRequest(strings.NewReader(string(b)))
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(in))
		// Every field of Request is known to DecodeRequest: a field added
		// later and not listed there would be silently dropped.
		var asMap map[string]any
		Expect(json.Unmarshal(b, &asMap)).To(Succeed())
		Expect(asMap).To(HaveLen(7))

		got, err = DecodeRequest(strings.NewReader(`{"COMMAND":["a"],"Env":["X=1"],"unknown":{"x":[1]},"shell":"s","shell":"t"}`))
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Command).To(Equal([]string{"a"}))
		Expect(got.Env).To(Equal([]string{"X=1"}))
		Expect(got.Shell).To(Equal("t"))
	})

	DescribeTable("refuses argv and env past their bounds while streaming, with ErrInvalidRequest (A7)",
		func(body io.Reader, want string) {
			_, err := DecodeRequest(body)
			Expect(errors.Is(err, ErrInvalidRequest)).To(BeTrue(), "%v", err)
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("too many arguments", manyEmptyArgs("command", MaxArgs), "command has more than the 4096 entries allowed"),
		Entry("too many arguments, field name in capitals", manyEmptyArgs("Command", MaxArgs), "command has more than"),
		Entry("too many env entries", manyEmptyArgs("env", MaxEnv), "env has more than the 1024 entries allowed"),
		Entry("argv too long", strings.NewReader(`{"command":["`+strings.Repeat("a", MaxArgBytes)+`"]}`), "command is more than the 1048576 bytes allowed"),
		Entry("not an array", strings.NewReader(`{"command":"ls"}`), "command must be an array of strings"),
		Entry("not a string", strings.NewReader(`{"command":[1]}`), "command[0] is not a string"),
	)

	It("stops at the bound: 8.8 M empty arguments cost little heap (High 3)", func() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := DecodeRequest(manyEmptyArgs("command", 8_800_000))
		runtime.ReadMemStats(&after)
		Expect(errors.Is(err, ErrInvalidRequest)).To(BeTrue())
		Expect(after.TotalAlloc - before.TotalAlloc).To(BeNumerically("<", 16<<20))
	})

	It("Normalize bounds argv, env and shell for callers that decoded on their own", func() {
		argv := make([]string, MaxArgs+1)
		for i := range argv {
			argv[i] = "a"
		}
		_, err := Request{Command: argv}.Normalize()
		Expect(err).To(MatchError(ContainSubstring("command has 4097 entries, more than the 4096 allowed")))
		_, err = Request{Command: []string{"ls", strings.Repeat("a", MaxArgBytes)}}.Normalize()
		Expect(err).To(MatchError(ContainSubstring("more than the 1048576 allowed")))
		_, err = Request{Shell: "x", Env: make([]string, MaxEnv+1)}.Normalize()
		Expect(err).To(MatchError(ContainSubstring("env has 1025 entries")))
		_, err = Request{Shell: strings.Repeat("a", MaxArgBytes+1)}.Normalize()
		Expect(errors.Is(err, ErrInvalidRequest)).To(BeTrue())
	})
})
