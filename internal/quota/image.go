/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota

import (
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// NormalizeImage spells an image reference out the way Docker resolves it:
// python:3.12 is docker.io/library/python:3.12 and a reference without a tag
// or digest gets :latest. It returns "" for a reference Docker could not
// parse either; such an image never matches a normalized pattern.
func NormalizeImage(image string) string {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return ""
	}
	return reference.TagNameOnly(named).String()
}

// ImageAllowed reports whether any pattern matches the image as written, or
// the pattern or its Docker Hub spelling matches the image's normalized
// form.
func ImageAllowed(patterns []string, image string) bool {
	norm := NormalizeImage(image)
	for _, p := range patterns {
		if MatchImage(p, image) {
			return true
		}
		if norm != "" && (MatchImage(p, norm) || MatchImage(normalizePattern(p), norm)) {
			return true
		}
	}
	return false
}

// normalizePattern spells out the Docker Hub repository of a pattern the
// way Docker does for an image (python:* is docker.io/library/python:*,
// acme/* is docker.io/acme/*), so that it also matches images written in
// full. A first component that is a registry (it has a dot or a colon, or is
// localhost) or holds a wildcard is left alone. Tags are not touched: a
// pattern means what it says about them.
func normalizePattern(pattern string) string {
	first, _, found := strings.Cut(pattern, "/")
	switch {
	case !found:
		return "docker.io/library/" + pattern
	case strings.ContainsAny(first, ".:*?") || first == "localhost":
		return pattern
	}
	return "docker.io/" + pattern
}

// MatchImage matches an image against one pattern: `*` is any run of
// characters but `/`, `**` any run including `/`, `?` one character but `/`;
// everything else is literal. The whole image must match.
//
// `*` stops at `/` so that ghcr.io/acme/* cannot admit
// ghcr.io/acme/../other or a nested repository the platform team did not
// mean; write ** to allow those.
func MatchImage(pattern, image string) bool {
	return globRegexp(pattern).MatchString(image)
}

func globRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	// Walk runes, not bytes: string(byte) of a UTF-8 continuation byte is a
	// different character, so a non-ASCII literal would never match itself.
	runes := []rune(pattern)
	for i := 0; i < len(runes); i++ {
		switch c := runes[i]; c {
		case '*':
			if i+1 < len(runes) && runes[i+1] == '*' {
				b.WriteString(".*")
				i++
			} else {
				b.WriteString("[^/]*")
			}
		case '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	// Every piece is quoted or a fixed construct, so this always compiles.
	return regexp.MustCompile(b.String())
}
