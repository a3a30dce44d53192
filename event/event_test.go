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

func TestInvalidUTF8IsRefusedNamingItsField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body, field string
	}{
		{"{\"idempotency_key\":\"k\xff\",\"type\":\"t\",\"recipients\":[\"u\"]}", "idempotency_key"},
		{"{\"idempotency_key\":\"k\",\"type\":\"t\",\"recipients\":[\"u\",\"v\xc3\"]}", "recipients"},
		{"{\"idempotency_key\":\"k\",\"type\":\"t\",\"recipients\":[\"u\"],\"data\":{\"a\":[\"\xed\xa0\x80\"]}}", "data"},
		{"{\"idempotency_key\":\"k\",\"type\":\"t\",\"recipients\":[\"u\"],\"title\":\"\xfe\"}", "title"},
	} {
		_, err := event.Decode([]byte(tc.body), "")
		var evErr *event.Error
		if !errors.As(err, &evErr) || !errors.Is(err, event.ErrInvalid) || evErr.Field != tc.field || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("Decode(%q) = %v; want invalid UTF-8 in %s", tc.body, err, tc.field)
		}
	}
	// Two keys that differ only in their invalid bytes must never become one.
	a, errA := event.Decode([]byte("{\"idempotency_key\":\"k\xff\",\"type\":\"t\",\"recipients\":[\"u\"]}"), "")
	b, errB := event.Decode([]byte("{\"idempotency_key\":\"k\xfe\",\"type\":\"t\",\"recipients\":[\"u\"]}"), "")
	if errA == nil || errB == nil {
		t.Errorf("keys with invalid UTF-8 were accepted as %q and %q", a.IdempotencyKey, b.IdempotencyKey)
	}
	if _, err := event.ParseKeyHeader("k\xff"); !errors.Is(err, event.ErrInvalid) {
		t.Errorf("ParseKeyHeader of invalid UTF-8 = %v; want ErrInvalid", err)
	}
}

func TestParseChecksASpooledEventAgain(t *testing.T) {
	t.Parallel()
	ev, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u2","u1"],"data":{"a":1}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	back, err := event.Parse(ev.Canonical())
	if err != nil || !bytes.Equal(back.Canonical(), ev.Canonical()) {
		t.Fatalf("Parse(Canonical) = %s, %v; want the same event", back.Canonical(), err)
	}
	for name, payload := range map[string]string{
		"no recipients":        `{"idempotency_key":"k","type":"t","category":"c","recipients":[]}`,
		"no key":               `{"type":"t","category":"c","recipients":["u"]}`,
		"an unknown field":     `{"idempotency_key":"k","type":"t","category":"c","recipients":["u"],"priority":1}`,
		"data that is a list":  `{"idempotency_key":"k","type":"t","category":"c","recipients":["u"],"data":[1]}`,
		"not JSON":             `garbage`,
		"a title over the cap": `{"idempotency_key":"k","type":"t","category":"c","recipients":["u"],"title":"` + strings.Repeat("x", event.MaxTitleLen+1) + `"}`,
	} {
		if _, err := event.Parse([]byte(payload)); err == nil {
			t.Errorf("Parse of a payload with %s succeeded", name)
		}
	}
}
