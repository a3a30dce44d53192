package event

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"github.com/spoolcast/spoolcast/internal/jsonenc"
)

// The relay decodes, checks and re-encodes every event on its hot path. The
// functions here do the common case by hand, byte for byte as encoding/json
// would, and give up (ok = false) on anything unusual — an escape they do not
// handle, a duplicate or differently cased key, a null — so that the
// encoding/json path answers it, with its error messages. The fuzz target
// holds them to that: where they succeed, they agree with encoding/json.

// decodeFast reads the common shape of an event body, which must be valid
// UTF-8: one object of the known fields, strings as strings, recipients as an
// array of strings.
func decodeFast(body []byte) (ev Event, ok bool) {
	p := parser{b: body}
	p.ws()
	if !p.eat('{') {
		return Event{}, false
	}
	p.ws()
	if p.eat('}') {
		return ev, p.end()
	}
	seen := 0
	for {
		p.ws()
		key, ok := p.str()
		if !ok {
			return Event{}, false
		}
		p.ws()
		if !p.eat(':') {
			return Event{}, false
		}
		p.ws()
		var field *string
		bit := 0
		switch key {
		case "idempotency_key":
			field, bit = &ev.IdempotencyKey, 1
		case "type":
			field, bit = &ev.Type, 2
		case "category":
			field, bit = &ev.Category, 4
		case "title":
			field, bit = &ev.Title, 8
		case "body":
			field, bit = &ev.Body, 16
		case "run_id":
			field, bit = &ev.RunID, 32
		case "send_at":
			field, bit = &ev.SendAt, 256
		case "priority":
			field, bit = &ev.Priority, 512
		case "recipients":
			bit = 64
			if ev.Recipients, ok = p.strs(); !ok {
				return Event{}, false
			}
		case "topics":
			bit = 1024
			if ev.Topics, ok = p.strs(); !ok {
				return Event{}, false
			}
		case "data":
			bit = 128
			start := p.i
			if !p.skip(0) {
				return Event{}, false
			}
			ev.Data = json.RawMessage(body[start:p.i])
		default:
			return Event{}, false
		}
		if seen&bit != 0 {
			return Event{}, false
		}
		seen |= bit
		if field != nil {
			if *field, ok = p.str(); !ok {
				return Event{}, false
			}
		}
		p.ws()
		if p.eat('}') {
			return ev, p.end()
		}
		if !p.eat(',') {
			return Event{}, false
		}
	}
}

// canonicalDataFast is canonicalData for data it can read by hand: an object
// re-encoded with sorted keys, numbers kept as written, within the nesting
// and storage rules.
func canonicalDataFast(raw []byte) ([]byte, bool) {
	p := parser{b: bytes.TrimSpace(raw)}
	if len(p.b) == 0 || p.b[0] != '{' {
		return nil, false
	}
	out, ok := p.canon(make([]byte, 0, len(p.b)), 0)
	if !ok || !p.end() {
		return nil, false
	}
	return out, true
}

type parser struct {
	b []byte
	i int
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (p *parser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// str reads a string with at most the simple escapes (\" \\ \/ \b \f \n \r
// \t); \u escapes and raw control characters give up.
func (p *parser) str() (string, bool) {
	if !p.eat('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c == '\\':
			return p.escapedStr(start)
		case c < 0x20:
			return "", false
		default:
			p.i++
		}
	}
	return "", false
}

func (p *parser) escapedStr(start int) (string, bool) {
	var sb strings.Builder
	sb.Write(p.b[start:p.i])
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return sb.String(), true
		case c < 0x20:
			return "", false
		case c != '\\':
			sb.WriteByte(c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			return "", false
		}
		switch e := p.b[p.i+1]; e {
		case '"', '\\', '/':
			sb.WriteByte(e)
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		default:
			return "", false
		}
		p.i += 2
	}
	return "", false
}

// strs reads an array of strings.
func (p *parser) strs() ([]string, bool) {
	if !p.eat('[') {
		return nil, false
	}
	out := []string{}
	p.ws()
	if p.eat(']') {
		return out, true
	}
	for {
		p.ws()
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		p.ws()
		if p.eat(']') {
			return out, true
		}
		if !p.eat(',') {
			return nil, false
		}
	}
}

// skip steps over one JSON value, checking its syntax.
func (p *parser) skip(level int) bool {
	_, ok := p.value(nil, level, false)
	return ok
}

// canon appends the canonical form of the object or value at p to dst.
func (p *parser) canon(dst []byte, level int) ([]byte, bool) {
	return p.value(dst, level, true)
}

// value reads one value; with emit it appends its canonical form to dst and
// applies data's rules (nesting, no NUL, numbers Postgres can hold).
func (p *parser) value(dst []byte, level int, emit bool) ([]byte, bool) {
	if level > maxDataNestLevel {
		return nil, false
	}
	if p.i >= len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		return p.object(dst, level, emit)
	case c == '[':
		p.i++
		if emit {
			dst = append(dst, '[')
		}
		p.ws()
		if p.eat(']') {
			return append(dst, ']'), true
		}
		for n := 0; ; n++ {
			if emit && n > 0 {
				dst = append(dst, ',')
			}
			p.ws()
			var ok bool
			if dst, ok = p.value(dst, level+1, emit); !ok {
				return nil, false
			}
			p.ws()
			if p.eat(']') {
				if emit {
					dst = append(dst, ']')
				}
				return dst, true
			}
			if !p.eat(',') {
				return nil, false
			}
		}
	case c == '"':
		s, ok := p.str()
		if !ok || (emit && strings.IndexByte(s, 0) >= 0) {
			return nil, false
		}
		if emit {
			dst = jsonenc.AppendString(dst, s)
		}
		return dst, true
	case c == '-' || (c >= '0' && c <= '9'):
		start := p.i
		if !p.number() {
			return nil, false
		}
		num := p.b[start:p.i]
		if emit {
			if !storableNumber(string(num)) {
				return nil, false
			}
			dst = append(dst, num...)
		}
		return dst, true
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(p.b[p.i:], []byte(lit)) {
				p.i += len(lit)
				if emit {
					dst = append(dst, lit...)
				}
				return dst, true
			}
		}
		return nil, false
	}
}

type member struct {
	key   string
	value []byte
}

func (p *parser) object(dst []byte, level int, emit bool) ([]byte, bool) {
	var members []member
	p.ws()
	if !p.eat('}') {
		for {
			p.ws()
			key, ok := p.str()
			if !ok || (emit && strings.IndexByte(key, 0) >= 0) {
				return nil, false
			}
			p.ws()
			if !p.eat(':') {
				return nil, false
			}
			p.ws()
			var v []byte
			if v, ok = p.value(nil, level+1, emit); !ok {
				return nil, false
			}
			if emit {
				members = append(members, member{key, v})
			}
			p.ws()
			if p.eat('}') {
				break
			}
			if !p.eat(',') {
				return nil, false
			}
		}
	}
	if !emit {
		return dst, true
	}
	// Keys sorted bytewise, as encoding/json sorts a map's; a repeated key
	// keeps its last value, as decoding into a map does.
	slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	dst = append(dst, '{')
	n := 0
	for i, m := range members {
		if i+1 < len(members) && members[i+1].key == m.key {
			continue
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = jsonenc.AppendString(dst, m.key)
		dst = append(dst, ':')
		dst = append(dst, m.value...)
		n++
	}
	return append(dst, '}'), true
}

// number steps over a JSON number.
func (p *parser) number() bool {
	digits := func() bool {
		start := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		return p.i > start
	}
	p.eat('-')
	if p.eat('0') {
		if p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			return false
		}
	} else if !digits() {
		return false
	}
	if p.eat('.') && !digits() {
		return false
	}
	if p.eat('e') || p.eat('E') {
		if !p.eat('+') {
			p.eat('-')
		}
		if !digits() {
			return false
		}
	}
	return true
}

// appendCanonical appends the event's canonical encoding: what
// encoding/json makes of the Event struct with HTML escaping off.
func (ev Event) appendCanonical(dst []byte) ([]byte, error) {
	dst = append(dst, `{"idempotency_key":`...)
	dst = jsonenc.AppendString(dst, ev.IdempotencyKey)
	dst = append(dst, `,"type":`...)
	dst = jsonenc.AppendString(dst, ev.Type)
	dst = append(dst, `,"category":`...)
	dst = jsonenc.AppendString(dst, ev.Category)
	dst = append(dst, `,"recipients":`...)
	if ev.Recipients == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, r := range ev.Recipients {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsonenc.AppendString(dst, r)
		}
		dst = append(dst, ']')
	}
	if len(ev.Topics) > 0 {
		dst = append(dst, `,"topics":[`...)
		for i, t := range ev.Topics {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsonenc.AppendString(dst, t)
		}
		dst = append(dst, ']')
	}
	if ev.Title != "" {
		dst = append(dst, `,"title":`...)
		dst = jsonenc.AppendString(dst, ev.Title)
	}
	if ev.Body != "" {
		dst = append(dst, `,"body":`...)
		dst = jsonenc.AppendString(dst, ev.Body)
	}
	if len(ev.Data) > 0 {
		dst = append(dst, `,"data":`...)
		var compact bytes.Buffer
		if err := json.Compact(&compact, ev.Data); err != nil {
			return nil, err
		}
		dst = append(dst, compact.Bytes()...)
	}
	if ev.RunID != "" {
		dst = append(dst, `,"run_id":`...)
		dst = jsonenc.AppendString(dst, ev.RunID)
	}
	if ev.SendAt != "" {
		dst = append(dst, `,"send_at":`...)
		dst = jsonenc.AppendString(dst, ev.SendAt)
	}
	if ev.Priority != "" {
		dst = append(dst, `,"priority":`...)
		dst = jsonenc.AppendString(dst, ev.Priority)
	}
	if ev.Digest != nil {
		dst = append(dst, `,"digest":{"key":`...)
		dst = jsonenc.AppendString(dst, ev.Digest.Key)
		dst = append(dst, `,"window":`...)
		dst = jsonenc.AppendString(dst, ev.Digest.Window)
		dst = append(dst, '}')
	}
	return append(dst, '}'), nil
}
