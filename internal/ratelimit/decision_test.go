package ratelimit

import (
	"net/http"
	"testing"
	"time"
)

func TestHeadersOfAnAllowedAnswer(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "user", "20/s", 0)
	var d Decision
	for range 28 {
		d = l.Allow("alice")
	}
	h := http.Header{}
	d.SetHeaders(h)
	want := http.Header{
		"Ratelimit-Policy": {`"user";q=40;w=2`},
		"Ratelimit":        {`"user";r=12;t=1`},
	}
	assertHeaders(t, h, want)
}

func TestHeadersOfARefusedAnswer(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "ip", "5/h", 0)
	spend(l, "203.0.113.9")
	clk.Advance(100 * time.Second)
	h := http.Header{"Retry-After": {"999"}, "Ratelimit": {"stale"}}
	l.Allow("203.0.113.9").SetHeaders(h)
	want := http.Header{
		"Ratelimit-Policy": {`"ip";q=10;w=7200`},
		"Ratelimit":        {`"ip";r=0;t=620`},
		"Retry-After":      {"620"},
	}
	assertHeaders(t, h, want)
}

func TestThePolicyOfAPerMinuteRate(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "user", "100/m", 0)
	h := http.Header{}
	l.Allow("bob").SetHeaders(h)
	assertHeaders(t, h, http.Header{
		"Ratelimit-Policy": {`"user";q=200;w=120`},
		"Ratelimit":        {`"user";r=199;t=1`},
	})
}

func TestAPolicyNameIsQuotedAsAStructuredFieldString(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `a"b\c`, "1/s", 0)
	h := http.Header{}
	l.Allow("k").SetHeaders(h)
	if got, want := h.Get("RateLimit-Policy"), `"a\"b\\c";q=2;w=2`; got != want {
		t.Errorf("RateLimit-Policy: %s, want %s", got, want)
	}
}

func TestANilLimitersDecisionWritesNoHeaders(t *testing.T) {
	t.Parallel()
	var l *Limiter
	h := http.Header{}
	l.Allow("x").SetHeaders(h)
	if len(h) != 0 {
		t.Errorf("headers %v, want none", h)
	}
}

func TestTheFieldNamesAreCanonical(t *testing.T) {
	t.Parallel()
	for name, key := range map[string]string{"RateLimit-Policy": policyKey, "RateLimit": limitKey, "Retry-After": retryAfterKey} {
		if http.CanonicalHeaderKey(name) != key {
			t.Errorf("%s is stored as %s, not its canonical key", name, key)
		}
	}
}

func assertHeaders(t *testing.T, got, want http.Header) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if len(got[k]) != 1 || got[k][0] != v[0] {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}
