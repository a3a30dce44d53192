package event

import (
	"bytes"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/spoolcast/spoolcast/internal/jsonenc"
)

// FuzzFastPathsAgree holds the hand-written decoder and encoders to
// encoding/json: wherever the fast path answers, it answers what
// encoding/json would, byte for byte.
func FuzzFastPathsAgree(f *testing.F) {
	f.Add([]byte(`{"idempotency_key":"k","type":"t","category":"c","recipients":["b","a"],"title":"T \"q\"\n","body":"é \u2028","data":{"z":[1,2.5e3,{"y":null,"x":true}],"a":"s","a":"dup"},"run_id":"r"}`))
	f.Add([]byte(` { "type" : "t" , "recipients" : [ ] , "data" : { } } `))
	f.Add([]byte(`{"Type":"t","recipients":["u"]}`))
	f.Add([]byte(`{"idempotency_key":"k","type":"t","recipients":["u"],"data":{"n":-0.0E+10,"s":"\u0041\/\b\f\r\t"}}`))
	f.Add([]byte(`{"idempotency_key":"k","type":"t","recipients":["u"]} {}`))
	f.Add([]byte(`{"idempotency_key":null,"type":"t","recipients":["u"]}`))
	f.Add([]byte(`{"data":{"a":{"b":{"c":[[[["deep"]]]]}}},"recipients":["u"],"type":"t","idempotency_key":"k"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) {
			return // Decode refuses it before either path reads it
		}
		fast, ok := decodeFast(body)
		if ok {
			ref, err := decodeJSON(body)
			if err != nil {
				t.Fatalf("decodeFast read %q; encoding/json refuses it: %v", body, err)
			}
			if !reflect.DeepEqual(fast, ref) {
				t.Fatalf("decodeFast(%q) = %#v; encoding/json reads %#v", body, fast, ref)
			}
		}
		ev, err := decodeJSON(body)
		if err != nil {
			return
		}
		if trimmed := bytes.TrimSpace(ev.Data); len(trimmed) > 0 && trimmed[0] == '{' {
			if out, ok := canonicalDataFast(trimmed); ok {
				ref, err := canonicalDataJSON(trimmed)
				if err != nil {
					t.Fatalf("canonicalDataFast took %s; encoding/json refuses it: %v", trimmed, err)
				}
				if !bytes.Equal(out, ref) {
					t.Fatalf("canonical data of %s:\nfast %s\njson %s", trimmed, out, ref)
				}
			}
		}
		if err := ev.canonicalize(); err != nil {
			return
		}
		want, err := jsonenc.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if got := ev.Canonical(); !bytes.Equal(got, want) {
			t.Fatalf("Canonical:\nfast %s\njson %s", got, want)
		}
	})
}
