package event

import (
	"strings"
	"unicode/utf8"
)

// ParseKeyHeader reads an Idempotency-Key header value. The IETF
// httpapi-idempotency-key draft makes it a structured-field string ("abc");
// many clients send the bare value (abc). Both are accepted; a quoted value that
// is not a valid structured-field string is an error, never a guess.
func ParseKeyHeader(v string) (string, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return "", invalid("Idempotency-Key", "header is empty")
	}
	if v[0] != '"' {
		if !utf8.ValidString(v) {
			return "", invalid("Idempotency-Key", "is not valid UTF-8")
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", invalid("Idempotency-Key", `a quoted key may escape only '"' and '\'`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if strings.TrimSpace(v[i+1:]) != "" {
				return "", invalid("Idempotency-Key", "unexpected text after the quoted key")
			}
			if b.Len() == 0 {
				return "", invalid("Idempotency-Key", "header is empty")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", invalid("Idempotency-Key", "a quoted key holds only printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return "", invalid("Idempotency-Key", "unterminated quoted key")
}
