package ratelimit

import (
	"net/http/httptest"
	"strings"
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

func TestClientIPBelievesForwardedForOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	var proxies Proxies
	for _, flag := range []string{" 10.0.0.0/8, 192.168.1.7 ,2001:db8:aaaa::/48", "::ffff:172.16.0.0/108"} { // the flag given twice
		if err := proxies.UnmarshalText([]byte(flag)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := proxies.String(), "10.0.0.0/8,192.168.1.7/32,2001:db8:aaaa::/48,172.16.0.0/12"; got != want {
		t.Fatalf("proxies %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name   string
		remote string
		xff    []string
		want   string
	}{
		{"a peer that is not a proxy is the client, whatever it forwards", "198.51.100.9:1", []string{"203.0.113.5"}, "198.51.100.9"},
		{"a trusted proxy's client", "10.1.2.3:1", []string{"203.0.113.5"}, "203.0.113.5"},
		{"the client's own entries, left of what the proxy appended, are not believed", "10.1.2.3:1", []string{"1.1.1.1, 8.8.8.8, 203.0.113.5"}, "203.0.113.5"},
		{"a chain of trusted proxies", "10.1.2.3:1", []string{"1.1.1.1, 203.0.113.5, 192.168.1.7, 10.9.9.9"}, "203.0.113.5"},
		{"fields read in order, the last field's entries first", "10.1.2.3:1", []string{"1.1.1.1", "203.0.113.5, 10.9.9.9"}, "203.0.113.5"},
		{"an entry with a port", "10.1.2.3:1", []string{"203.0.113.5:4711"}, "203.0.113.5"},
		{"an IPv6 client with a port, keyed by its /64", "10.1.2.3:1", []string{"[2001:db8:1:2::9]:4711"}, "2001:db8:1:2::/64"},
		{"a mapped IPv4 client", "10.1.2.3:1", []string{"::ffff:203.0.113.5"}, "203.0.113.5"},
		{"an IPv6 proxy", "[2001:db8:aaaa:1::5]:443", []string{"203.0.113.5"}, "203.0.113.5"},
		{"no header: the proxy itself", "10.1.2.3:1", nil, "10.1.2.3"},
		{"garbage ends the walk at the proxy that passed it on", "10.1.2.3:1", []string{"203.0.113.5, unknown, 10.9.9.9"}, "10.9.9.9"},
		{"an empty entry is garbage", "10.1.2.3:1", []string{"203.0.113.5,"}, "10.1.2.3"},
		{"a zone is garbage", "10.1.2.3:1", []string{"fe80::1%eth0"}, "10.1.2.3"},
		{"only trusted addresses: the leftmost", "10.1.2.3:1", []string{"10.5.5.5, 10.9.9.9"}, "10.5.5.5"},
		{"a mapped prefix matches a mapped peer", "[::ffff:172.16.9.9]:1", []string{"203.0.113.5"}, "203.0.113.5"},
		{"a long header is read from the right", "10.1.2.3:1", []string{strings.Repeat("198.51.100.1, ", 5000) + "203.0.113.5"}, "203.0.113.5"},
	} {
		r := httptest.NewRequest("GET", "/v1/feed", nil)
		r.RemoteAddr = tc.remote
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := proxies.ClientIP(r); got != tc.want {
			t.Errorf("%s: ClientIP(RemoteAddr %q, X-Forwarded-For %q) = %q, want %q", tc.name, tc.remote, tc.xff, got, tc.want)
		}
	}
}

func TestParseProxiesRefusesWhatIsNotAnAddress(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"10.0.0.0/33", "example.com", "fe80::1%eth0", "10.0.0.0/8;"} {
		if _, err := ParseProxies(s); err == nil {
			t.Errorf("ParseProxies(%q) took it", s)
		}
	}
	if p, err := ParseProxies(""); err != nil || len(p) != 0 {
		t.Errorf("ParseProxies(\"\") = %v, %v; want none", p, err)
	}
}

// A long X-Forwarded-For through a trusted proxy costs what its last
// entries do: the walk never splits the whole header.
func BenchmarkClientIPOfALongForwardedFor(b *testing.B) {
	proxies, _ := ParseProxies("10.0.0.0/8")
	r := httptest.NewRequest("GET", "/v1/feed", nil)
	r.RemoteAddr = "10.1.2.3:1"
	r.Header.Set("X-Forwarded-For", strings.Repeat("198.51.100.1, ", 5000)+"203.0.113.5")
	b.ReportAllocs()
	for b.Loop() {
		if proxies.ClientIP(r) != "203.0.113.5" {
			b.Fatal("wrong client")
		}
	}
}
