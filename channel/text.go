package channel

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Ellipsis marks text Shorten cut.
const Ellipsis = "…"

// Shorten cuts s to at most n bytes, at a rune boundary, ending it with
// Ellipsis; s itself when it fits, "" when not even the mark does. Every
// provider's limit cuts the banner, never the feed, which keeps the text.
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= len(Ellipsis)
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.TrimRightFunc(s[:n], unicode.IsSpace) + Ellipsis
}

// ShortID is id within max bytes: itself, or its SHA-256 in hex when
// longer (max at least 64), the same on every resend, so that a collapse
// id still replaces what it replaced.
func ShortID(id string, max int) string {
	if len(id) <= max {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}
