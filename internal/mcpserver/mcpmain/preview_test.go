/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("--preview-addr", func() {
	It("refuses a non-loopback address without --allow-remote, and a base URL that is not http(s)", func() {
		err := startupError(func(o *Config) { o.PreviewAddr, o.WarmPool = "0.0.0.0:0", "0" }, loopbackNoAuth)
		Expect(isUsageError(err)).To(BeTrue(), errString(err))
		Expect(err).To(MatchError(ContainSubstring("--allow-remote")))
		err = startupError(func(o *Config) { o.PreviewAddr, o.PreviewURL, o.WarmPool = "127.0.0.1:0", "ftp://x", "0" }, loopbackNoAuth)
		Expect(isUsageError(err)).To(BeTrue(), errString(err))
		Expect(err).To(MatchError(ContainSubstring("--preview-url")))
	})
})
