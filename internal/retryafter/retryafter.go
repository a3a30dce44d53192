// Package retryafter reads HTTP's Retry-After header (RFC 9110 §10.2.3):
// a number of seconds, or an HTTP date. Every client of a provider that
// may ask to wait (Expo, FCM, Web Push services, webhook receivers, the
// relay for producers) reads it here.
package retryafter

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Max caps a wait: a longer one is a misreading (a date in another zone, a
// typo), and waiting it would hold the work for good.
const Max = 24 * time.Hour

// Parse returns the wait v asks for at now, at most Max (a date already
// past asks for none), and whether v said one: false when v is absent or
// unreadable.
func Parse(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, int64(Max/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(0, t.Sub(now)), Max), true
	}
	return 0, false
}
