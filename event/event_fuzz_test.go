package event_test

import (
	"bytes"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/spoolcast/spoolcast/event"
)

// FuzzDecode checks that any body either decodes to a valid canonical event or
// fails with ErrMalformed or ErrInvalid, and that canonical encoding is a fixed
// point: decoding it again yields the same bytes and the same hash.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"idempotency_key":"meeting_assignment:u_123:m_456","type":"meeting.assigned","category":"meetings","recipients":["u_123"],"title":"You were added","body":"Mon","data":{"meeting_id":"m_456"},"run_id":"r1"}`), "")
	f.Add([]byte(`{"type":"t","recipients":["b","a","a"],"data":{"z":1.50,"a":[1,{"b":null}]}}`), `"k"`)
	f.Add([]byte(`{"idempotency_key":"k","type":"t","recipients":[]}`), "")
	f.Add([]byte(`{"idempotency_key":"k"`), "")
	f.Add([]byte(`[]`), "k")
	f.Add([]byte(`{"idempotency_key":"k","type":"t","recipients":["u"],"data":"x"}`), "")
	f.Add([]byte("{\"idempotency_key\":\"k\\u0000\",\"type\":\"t\",\"recipients\":[\"u\"]}"), "")
	f.Add([]byte("{\"idempotency_key\":\"k\xff\",\"type\":\"t\",\"recipients\":[\"u\"]}"), "")
	f.Add([]byte(`{"type":"t","recipients":["u"]}`), "k\xc3")
	f.Fuzz(func(t *testing.T, body []byte, header string) {
		key := ""
		if header != "" {
			k, err := event.ParseKeyHeader(header)
			if err != nil {
				if !errors.Is(err, event.ErrInvalid) {
					t.Fatalf("ParseKeyHeader(%q) error %v is not ErrInvalid", header, err)
				}
				return
			}
			key = k
		}
		ev, err := event.Decode(body, key)
		if err != nil {
			if !errors.Is(err, event.ErrMalformed) && !errors.Is(err, event.ErrInvalid) {
				t.Fatalf("Decode error %v is neither ErrMalformed nor ErrInvalid", err)
			}
			return
		}
		if !utf8.Valid(body) || !utf8.ValidString(key) {
			t.Fatalf("a body or key that is not valid UTF-8 decoded: %q", body)
		}
		if ev.IdempotencyKey == "" || ev.Type == "" || len(ev.Recipients)+len(ev.Topics) == 0 {
			t.Fatalf("decoded event lacks a required field: %+v", ev)
		}
		canon := ev.Canonical()
		again, err := event.Decode(canon, "")
		if err != nil {
			t.Fatalf("canonical form %s does not decode: %v", canon, err)
		}
		if !bytes.Equal(again.Canonical(), canon) || !bytes.Equal(again.Hash(), ev.Hash()) {
			t.Fatalf("canonical form is not stable:\n%s\n%s", canon, again.Canonical())
		}
		parsed, err := event.Parse(canon)
		if err != nil || !bytes.Equal(parsed.Canonical(), canon) {
			t.Fatalf("Parse(canonical) = %v, %v", parsed, err)
		}
	})
}
