package feed

import (
	"strconv"
	"time"

	"github.com/spoolcast/spoolcast/internal/jsonenc"
)

// AppendPageJSON appends the API's page document, {"data":[…],"has_more":…,
// "next_cursor":…|null} with "refresh_cursor" when refresh is not nil, and a
// newline: byte for byte what encoding/json's Encoder (HTML escaped) makes
// of it, held to it by FuzzPageJSONMatchesEncodingJSON, without reflection.
// With encoding/json a page of 20 cost more than its query's round trip,
// and each item's data was validated and compacted again though Postgres
// sends valid jsonb.
func AppendPageJSON(dst []byte, items []Notification, hasMore bool, next, refresh *string) []byte {
	dst = append(dst, `{"data":[`...)
	for i, n := range items {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = n.appendItemJSON(dst)
	}
	dst = append(dst, `],"has_more":`...)
	dst = strconv.AppendBool(dst, hasMore)
	dst = append(dst, `,"next_cursor":`...)
	dst = appendStringOrNull(dst, next)
	if refresh != nil {
		dst = append(dst, `,"refresh_cursor":`...)
		dst = jsonenc.AppendHTMLString(dst, *refresh)
	}
	return append(dst, "}\n"...)
}

// appendItemJSON appends the notification as its Item encodes.
func (n Notification) appendItemJSON(dst []byte) []byte {
	dst = append(dst, `{"id":"`...)
	dst = n.PublicID().append(dst) // base64url: nothing to escape
	dst = append(dst, '"')
	dst = append(dst, `,"type":`...)
	dst = jsonenc.AppendHTMLString(dst, n.Type)
	dst = append(dst, `,"category":`...)
	dst = jsonenc.AppendHTMLString(dst, n.Category)
	dst = append(dst, `,"title":`...)
	dst = jsonenc.AppendHTMLString(dst, n.Title)
	dst = append(dst, `,"body":`...)
	dst = jsonenc.AppendHTMLString(dst, n.Body)
	dst = append(dst, `,"data":`...)
	if len(n.Data) == 0 { // none; encoding/json fails on an empty RawMessage
		dst = append(dst, "null"...)
	} else {
		dst = appendCompactJSON(dst, n.Data)
	}
	dst = append(dst, `,"producer":`...)
	dst = jsonenc.AppendHTMLString(dst, n.Producer)
	dst = append(dst, `,"created_at":`...)
	dst = appendTime(dst, n.CreatedAt)
	dst = append(dst, `,"received_at":`...)
	dst = appendTimeOrNull(dst, n.ReceivedAt)
	dst = append(dst, `,"read_at":`...)
	dst = appendTimeOrNull(dst, n.ReadAt)
	dst = append(dst, `,"seen_at":`...)
	dst = appendTimeOrNull(dst, n.SeenAt)
	dst = append(dst, `,"archived_at":`...)
	dst = appendTimeOrNull(dst, n.ArchivedAt)
	return append(dst, '}')
}

func appendStringOrNull(dst []byte, s *string) []byte {
	if s == nil {
		return append(dst, "null"...)
	}
	return jsonenc.AppendHTMLString(dst, *s)
}

func appendTimeOrNull(dst []byte, t *time.Time) []byte {
	if t == nil {
		return append(dst, "null"...)
	}
	return appendTime(dst, *t)
}

// appendTime appends t as time.Time.MarshalJSON does, for the years it
// encodes (0 to 9999; timestamptz holds no others it could answer).
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}

// appendCompactJSON appends valid JSON (a jsonb value as Postgres writes
// it) as encoding/json writes a json.RawMessage: without the whitespace
// between tokens, and with <, >, &, U+2028 and U+2029 inside strings
// escaped. It does not validate: Postgres never sends invalid jsonb.
func appendCompactJSON(dst, src []byte) []byte {
	const hex = "0123456789abcdef"
	inString, escaped := false, false
	start := 0
	for i := 0; i < len(src); i++ {
		b := src[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case b == '\\':
				escaped = true
			case b == '"':
				inString = false
			case b == '<' || b == '>' || b == '&':
				dst = append(dst, src[start:i]...)
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
				start = i + 1
			case b == 0xE2 && i+2 < len(src) && src[i+1] == 0x80 && src[i+2]&^1 == 0xA8: // U+2028, U+2029
				dst = append(dst, src[start:i]...)
				dst = append(dst, '\\', 'u', '2', '0', '2', hex[src[i+2]&0xF])
				i += 2
				start = i + 1
			}
			continue
		}
		switch b {
		case '"':
			inString = true
		case ' ', '\t', '\n', '\r':
			dst = append(dst, src[start:i]...)
			start = i + 1
		}
	}
	return append(dst, src[start:]...)
}
