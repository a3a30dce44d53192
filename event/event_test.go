package event_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/event"
)

func TestSameRequestInAnotherEncodingHashesAlike(t *testing.T) {
	t.Parallel()
	a, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u2","u1"],"data":{"b":1,"a":"x"}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := event.Decode([]byte(`{ "data": {"a":"x", "b":1}, "recipients":["u1","u2","u1"], "type":"t" }`), "k")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Hash(), b.Hash()) {
		t.Errorf("hashes differ:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	c, _ := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1","u2"],"data":{"a":"x","b":2}}`), "")
	if bytes.Equal(a.Hash(), c.Hash()) {
		t.Error("different data hashes alike")
	}
	if a.Category != event.DefaultCategory {
		t.Errorf("category = %q, want the default %q", a.Category, event.DefaultCategory)
	}
}

func TestKeyHeaderAcceptsQuotedAndBareValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{`"abc"`, "abc", true},
		{`abc`, "abc", true},
		{` "a\"b\\c" `, `a"b\c`, true},
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"open`, "", false},
		{`""`, "", false},
		{`"a"b`, "", false},
		{`"a\x"`, "", false},
		{"\"caf\u00e9\"", "", false},
	} {
		got, err := event.ParseKeyHeader(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseKeyHeader(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, event.ErrInvalid) {
			t.Errorf("ParseKeyHeader(%q) error %v is not ErrInvalid", tc.in, err)
		}
	}
}

func TestDataPostgresWouldRefuseIsInvalid(t *testing.T) {
	t.Parallel()
	for name, data := range map[string]string{
		"a NUL in a string": `{"a":"x\u0000y"}`,
		"a NUL in a key":    `{"a\u0000":1}`,
		"a NUL deep down":   `{"a":[{"b":"\u0000"}]}`,
		"a huge exponent":   `{"a":1e999999}`,
		"a tiny exponent":   `{"a":1e-999999}`,
		"an endless number": `{"a":` + strings.Repeat("9", 1001) + `}`,
	} {
		_, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u"],"data":`+data+`}`), "")
		if !errors.Is(err, event.ErrInvalid) {
			t.Errorf("%s: Decode = %v; want ErrInvalid", name, err)
		}
	}
	if _, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u"],"data":{"a":1.5e300,"b":"ok\u00e9"}}`), ""); err != nil {
		t.Errorf("ordinary data refused: %v", err)
	}
}
