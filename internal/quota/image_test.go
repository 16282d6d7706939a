/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

var _ = Describe("MatchImage", func() {
	DescribeTable("matches the whole image against one glob",
		func(pattern, image string, want bool) {
			Expect(quota.MatchImage(pattern, image)).To(Equal(want), "MatchImage(%q, %q)", pattern, image)
		},
		// Literal patterns and anchoring.
		Entry("exact", "python:3.12", "python:3.12", true),
		Entry("no prefix match", "python:3.1", "python:3.12", false),
		Entry("no suffix match", "ython:3.12", "python:3.12", false),
		Entry("no infix match", "ghcr.io/acme", "evil.io/ghcr.io/acme/x", false),
		Entry("pattern longer than image", "python:3.12-slim", "python:3.12", false),
		Entry("empty pattern matches only the empty image", "", "", true),
		Entry("empty pattern does not match an image", "", "python", false),
		Entry("case matters", "Python:3.12", "python:3.12", false),

		// `*` stays within one path segment.
		Entry("* matches a tag", "python:*", "python:3.12", true),
		Entry("* matches an empty run", "python:*", "python:", true),
		Entry("* does not cross /", "ghcr.io/acme/*", "ghcr.io/acme/team/tool:1", false),
		Entry("* matches one repository", "ghcr.io/acme/*", "ghcr.io/acme/tool:1", true),
		Entry("* cannot be used to climb out", "ghcr.io/acme/*", "ghcr.io/acme/../other:1", false),
		Entry("* alone does not match a path", "*", "a/b", false),
		Entry("* in the middle", "ghcr.io/*/tool:1", "ghcr.io/acme/tool:1", true),
		Entry("* in the middle still stops at /", "ghcr.io/*/tool:1", "ghcr.io/acme/x/tool:1", false),
		Entry("*/* matches two segments", "*/*", "a/b", true),
		Entry("*/* does not match three", "*/*", "a/b/c", false),
		Entry("* does not match a different prefix", "ghcr.io/acme/*", "ghcr.io/acmex/tool", false),

		// `**` crosses `/`.
		Entry("** crosses /", "ghcr.io/acme/**", "ghcr.io/acme/team/tool:1", true),
		Entry("** matches an empty run", "ghcr.io/acme/**", "ghcr.io/acme/", true),
		Entry("** keeps the literal prefix", "ghcr.io/acme/**", "ghcr.io/acmex/tool", false),
		Entry("** keeps the literal prefix (no slash)", "ghcr.io/acme/**", "ghcr.io/acme", false),
		Entry("** alone matches anything", "**", "a/b/c:d@e", true),
		Entry("*** is ** then *", "***", "a/b", true),
		Entry("** in the middle", "ghcr.io/**/tool:1", "ghcr.io/a/b/c/tool:1", true),
		Entry("** in the middle keeps the suffix", "ghcr.io/**/tool:1", "ghcr.io/a/b/c/tool:2", false),

		// `?` is exactly one character other than `/`.
		Entry("? matches one character", "python:3.1?", "python:3.12", true),
		Entry("? does not match none", "python:3.1?", "python:3.1", false),
		Entry("? does not match two", "python:3.1?", "python:3.123", false),
		Entry("? does not match /", "a?b", "a/b", false),
		Entry("?? matches two", "a??d", "abcd", true),

		// Regexp metacharacters are literal.
		Entry(". is literal (no match)", "a.b", "axb", false),
		Entry(". is literal (match)", "a.b", "a.b", true),
		Entry("+ is literal (no repetition)", "python:3.1+", "python:3.11", false),
		Entry("+ is literal (match)", "python:3.1+", "python:3.1+", true),
		Entry("( is literal", "(", "(", true),
		Entry("unbalanced ( does not match anything else", "a(", "a", false),
		Entry("[ is literal", "[", "[", true),
		Entry("a class is literal", "[a-z]", "a", false),
		Entry("a class matches itself", "[a-z]", "[a-z]", true),
		Entry("| is literal", "a|b", "a", false),
		Entry("^ and $ are literal", "^a$", "a", false),
		Entry("^ and $ match themselves", "^a$", "^a$", true),
		Entry(`\d is literal`, `\d`, "1", false),
		Entry(`backslash matches itself`, `a\b`, `a\b`, true),
		Entry("{n} is literal", "a{2}", "aa", false),
		Entry(".* is not a wildcard", ".*", "anything", false),

		// Non-ASCII characters are literal too, and `?` is one character.
		Entry("non-ASCII literal", "café:1", "café:1", true),
		Entry("? matches one non-ASCII character", "caf?:1", "café:1", true),
	)

	It("does not panic on any byte sequence", func() {
		for _, p := range []string{"(", ")", "[", "]", "{", "}", "\\", "(?", "*(", "[**", "\xff", "a\x00b", strings.Repeat("(", 100)} {
			Expect(func() { quota.MatchImage(p, "x") }).NotTo(Panic(), "pattern %q", p)
		}
	})
})

var _ = Describe("NormalizeImage", func() {
	DescribeTable("spells references out the way Docker resolves them",
		func(image, want string) {
			Expect(quota.NormalizeImage(image)).To(Equal(want))
		},
		Entry("official image with tag", "python:3.12", "docker.io/library/python:3.12"),
		Entry("no tag gets latest", "python", "docker.io/library/python:latest"),
		Entry("user repository", "acme/tool:1", "docker.io/acme/tool:1"),
		Entry("docker.io without library", "docker.io/python:3", "docker.io/library/python:3"),
		Entry("legacy index.docker.io", "index.docker.io/library/python:3", "docker.io/library/python:3"),
		Entry("already normalized", "docker.io/library/python:3.12", "docker.io/library/python:3.12"),
		Entry("other registry keeps its name", "ghcr.io/acme/tool", "ghcr.io/acme/tool:latest"),
		Entry("registry with port", "localhost:5000/tool", "localhost:5000/tool:latest"),
		Entry("digest gets no tag", "python@"+digest, "docker.io/library/python@"+digest),
		Entry("tag and digest are kept", "python:3@"+digest, "docker.io/library/python:3@"+digest),
		Entry("uppercase repository is invalid", "Python:3.12", ""),
		Entry("empty", "", ""),
		Entry("bad digest", "python@sha256:abc", ""),
		Entry("whitespace", "python 3", ""),
		Entry("trailing colon", "python:", ""),
		Entry("path traversal", "ghcr.io/acme/../other", ""),
	)
})

var _ = Describe("ImageAllowed", func() {
	DescribeTable("matches the image as written or normalized",
		func(patterns []string, image string, want bool) {
			Expect(quota.ImageAllowed(patterns, image)).To(Equal(want), "ImageAllowed(%q, %q)", patterns, image)
		},
		Entry("short pattern, short image", []string{"python:3.12"}, "python:3.12", true),
		Entry("normalized pattern admits the short image", []string{"docker.io/library/python:3.12"}, "python:3.12", true),
		Entry("normalized pattern admits docker.io/python", []string{"docker.io/library/python:3.12"}, "docker.io/python:3.12", true),
		Entry("normalized pattern admits index.docker.io", []string{"docker.io/library/python:3.12"}, "index.docker.io/library/python:3.12", true),
		// A pattern's Docker Hub repository is spelt out like an image's.
		Entry("short pattern admits the long spelling", []string{"python:3.12"}, "docker.io/library/python:3.12", true),
		Entry("short glob admits the long spelling", []string{"python:*"}, "docker.io/library/python:3.12-slim", true),
		Entry("user-repository pattern admits the long spelling", []string{"acme/*"}, "docker.io/acme/tool:1", true),
		Entry("short pattern does not admit another registry", []string{"python:*"}, "ghcr.io/library/python:3", false),
		Entry("user-repository pattern does not admit another registry", []string{"acme/*"}, "ghcr.io/acme/tool:1", false),
		Entry("registry pattern is not re-rooted on Docker Hub", []string{"localhost/tool:*"}, "docker.io/localhost/tool:1", false),
		Entry("wildcard registry is left alone", []string{"*/tool:*"}, "docker.io/acme/tool:1", false),
		Entry("normalized glob admits any official tag", []string{"docker.io/library/python:*"}, "python:3.12-slim", true),
		Entry("normalized glob does not admit another image", []string{"docker.io/library/python:*"}, "pythonx:3", false),
		Entry("no tag means latest", []string{"docker.io/library/python:latest"}, "python", true),
		Entry("no tag is not any tag", []string{"docker.io/library/python:3"}, "python", false),
		Entry("a pattern without a tag does not admit the normalized :latest", []string{"docker.io/library/python"}, "python", false),
		Entry("a pattern without a tag admits the image as written", []string{"python"}, "python", true),
		Entry("digest pattern", []string{"docker.io/library/python@sha256:*"}, "python@"+digest, true),
		Entry("digest is not latest", []string{"docker.io/library/python:latest"}, "python@"+digest, false),
		Entry("ghcr wildcard, normalized latest", []string{"ghcr.io/acme/*"}, "ghcr.io/acme/tool", true),
		Entry("ghcr wildcard does not admit nested", []string{"ghcr.io/acme/*"}, "ghcr.io/acme/team/tool", false),
		Entry("ghcr ** admits nested", []string{"ghcr.io/acme/**"}, "ghcr.io/acme/team/tool", true),
		Entry("library wildcard does not admit user repositories", []string{"docker.io/library/*"}, "acme/tool:1", false),
		Entry("invalid image matches only as written", []string{"Python:3.12"}, "Python:3.12", true),
		Entry("invalid image is not normalized", []string{"docker.io/library/**"}, "Python:3.12", false),
		Entry("invalid image, catch-all pattern", []string{"**"}, "Python:3.12", true),
		Entry("second pattern matches", []string{"busybox:1", "ghcr.io/acme/*"}, "ghcr.io/acme/tool:1", true),
		Entry("no pattern matches", []string{"busybox:1", "ghcr.io/acme/*"}, "ghcr.io/evil/tool:1", false),
		Entry("metacharacters stay literal after normalization", []string{"docker.io/library/python:3.1+"}, "python:3.11", false),
		Entry("no patterns allow nothing (callers treat empty as allow-all)", []string{}, "python:3.12", false),
		Entry("nil patterns allow nothing", nil, "python:3.12", false),
	)
})
