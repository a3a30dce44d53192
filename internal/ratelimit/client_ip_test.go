package ratelimit

import (
	"net/http/httptest"
	"testing"
)

func TestClientIPKeysByTheConnectionsAddress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		remote, want string
	}{
		{"192.0.2.1:1234", "192.0.2.1"},
		{"192.0.2.1", "192.0.2.1"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:443", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.1]:80", "192.0.2.1"},
		{"[fe80::1%eth0]:80", "fe80::/64"},
		{"@", "@"},
		{"", ""},
	} {
		r := httptest.NewRequest("GET", "/v1/feed", nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("X-Forwarded-For", "198.51.100.1")
		r.Header.Set("Forwarded", "for=198.51.100.1")
		if got := ClientIP(r); got != tc.want {
			t.Errorf("ClientIP(RemoteAddr %q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}
