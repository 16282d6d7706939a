/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpserver

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

var _ = Describe("tailText (a finished task's output)", Label("unit"), func() {
	It("shows a chunk from the stream's start as it is", func() {
		text, cut := tailText(execio.StreamChunk{Offset: 0, Data: []byte("all\n"), Next: 4}, "stdout", 100)
		Expect(text).To(Equal("all\n"))
		Expect(cut).To(BeFalse())
	})

	It("marks what the cap or the ring dropped before the chunk", func() {
		text, cut := tailText(execio.StreamChunk{Offset: 1000, Data: []byte("end\n"), Next: 1004}, "stderr", 100)
		Expect(text).To(Equal(execio.TailMarker("stderr", 1000) + "end\n"))
		Expect(cut).To(BeTrue())
	})

	It("keeps only the end within the budget, never starting inside a UTF-8 sequence", func() {
		data := []byte("aé" + "bcd") // é is 2 bytes: keeping 4 would start inside it
		text, cut := tailText(execio.StreamChunk{Offset: 10, Data: data, Next: 10 + int64(len(data))}, "stdout", 4)
		Expect(cut).To(BeTrue())
		Expect(text).To(Equal(execio.TailMarker("stdout", 13) + "bcd"))
	})
})
