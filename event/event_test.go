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

func TestTopicsAreSortedOnceEachAndChecked(t *testing.T) {
	t.Parallel()
	a, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","title":"x","topics":["news","alerts.eu","news"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(a.Topics, ","); got != "alerts.eu,news" {
		t.Errorf("topics = %s, want alerts.eu,news", got)
	}
	if len(a.Recipients) != 0 {
		t.Errorf("recipients = %v, want none", a.Recipients)
	}
	b, err := event.Decode([]byte(`{"topics":["alerts.eu","news"],"title":"x","type":"t","recipients":[]}`), "k")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Hash(), b.Hash()) {
		t.Errorf("hashes differ:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	if want := `{"idempotency_key":"k","type":"t","category":"general","recipients":null,"topics":["alerts.eu","news"],"title":"x"}`; string(a.Canonical()) != want {
		t.Errorf("canonical = %s\nwant        %s", a.Canonical(), want)
	}
	parsed, err := event.Parse(a.Canonical())
	if err != nil || !bytes.Equal(parsed.Canonical(), a.Canonical()) {
		t.Fatalf("Parse = %s, %v", parsed.Canonical(), err)
	}
	// An event without topics hashes as it did before topics existed.
	c, _ := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"],"topics":[]}`), "")
	if strings.Contains(string(c.Canonical()), "topics") {
		t.Errorf("an empty topics list is in the canonical form: %s", c.Canonical())
	}
	for body, field := range map[string]string{
		`{"idempotency_key":"k","type":"t"}`:                                                        "recipients",
		`{"idempotency_key":"k","type":"t","topics":[]}`:                                            "recipients",
		`{"idempotency_key":"k","type":"t","topics":["News"]}`:                                      "topics",
		`{"idempotency_key":"k","type":"t","topics":[".hidden"]}`:                                   "topics",
		`{"idempotency_key":"k","type":"t","topics":["a/b"]}`:                                       "topics",
		`{"idempotency_key":"k","type":"t","topics":["` + strings.Repeat("a", 129) + `"]}`:          "topics",
		`{"idempotency_key":"k","type":"t","topics":["a","b","c","d","e","f","g","h","i","j","k"]}`: "topics",
	} {
		_, err := event.Decode([]byte(body), "")
		var e *event.Error
		if !errors.As(err, &e) || e.Field != field || !errors.Is(err, event.ErrInvalid) {
			t.Errorf("Decode(%s) = %v, want invalid %s", body, err, field)
		}
	}
	if !event.ValidTopic(strings.Repeat("a", 128)) || !event.ValidTopic("0-a_b.c") {
		t.Error("a valid topic name is refused")
	}
}
