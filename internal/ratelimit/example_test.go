package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/ratelimit"
)

// A route limited per user: every answer carries the fields, a refusal is a
// 429 with Retry-After.
func Example() {
	rate, err := ratelimit.ParseRate("1/s") // from --rate-limit-user
	if err != nil {
		panic(err)
	}
	clk := clock.NewFake(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	users, err := ratelimit.New(ratelimit.Config{Name: "user", Rate: rate, Clock: clk})
	if err != nil {
		panic(err)
	}
	handler := func(w http.ResponseWriter, r *http.Request) {
		d := users.Allow("alice") // central: the authenticated user's id
		d.SetHeaders(w.Header())
		if !d.Allowed {
			w.WriteHeader(http.StatusTooManyRequests) // central: a problem document
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	for range 3 {
		w := httptest.NewRecorder()
		handler(w, httptest.NewRequest("GET", "/v1/feed", nil))
		h := w.Header()
		fmt.Printf("%d RateLimit-Policy: %s RateLimit: %s", w.Code, h.Get("RateLimit-Policy"), h.Get("RateLimit"))
		if v := h.Get("Retry-After"); v != "" {
			fmt.Printf(" Retry-After: %s", v)
		}
		fmt.Println()
	}
	// Output:
	// 200 RateLimit-Policy: "user";q=2;w=2 RateLimit: "user";r=1;t=1
	// 200 RateLimit-Policy: "user";q=2;w=2 RateLimit: "user";r=0;t=1
	// 429 RateLimit-Policy: "user";q=2;w=2 RateLimit: "user";r=0;t=1 Retry-After: 1
}
