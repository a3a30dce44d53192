package egress_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/egress"
)

func TestOnlyPublicAddressesAreReachableByDefault(t *testing.T) {
	for addr, public := range map[string]bool{
		"8.8.8.8": true, "2606:4700::1111": true, "93.184.216.34": true,
		"127.0.0.1": false, "10.0.0.1": false, "172.16.5.4": false, "192.168.1.1": false, "169.254.169.254": false,
		"100.64.0.1": false, "0.0.0.0": false, "224.0.0.1": false, "::1": false, "fd00::1": false, "fe80::1": false,
		"::ffff:10.0.0.1": false, "::ffff:8.8.8.8": true,
	} {
		if got := egress.Public(netip.MustParseAddr(addr)); got != public {
			t.Errorf("Public(%s) = %v, want %v", addr, got, public)
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	guarded := &http.Client{Transport: &http.Transport{DialContext: egress.Dialer(time.Second, false).DialContext}}
	if _, err := guarded.Get(srv.URL); !errors.Is(err, egress.ErrPrivate) {
		t.Errorf("a loopback server through the guard: %v, want ErrPrivate", err)
	}
	open := &http.Client{Transport: &http.Transport{DialContext: egress.Dialer(time.Second, true).DialContext}}
	resp, err := open.Get(srv.URL)
	if err != nil {
		t.Fatalf("allowed: %v", err)
	}
	resp.Body.Close()
}

// IPv6 forms that embed, translate to or tunnel to an IPv4 address must not
// become a way around the IPv4 rules.
func TestEmbeddedIPv4IsJudgedAsIPv4(t *testing.T) {
	for _, tc := range []struct {
		name, addr string
		public     bool
	}{
		{"NAT64 private", "64:ff9b::a00:1", false},
		{"NAT64 metadata", "64:ff9b::a9fe:a9fe", false},
		{"NAT64 loopback", "64:ff9b::127.0.0.1", false},
		{"NAT64 CGNAT", "64:ff9b::100.64.0.1", false},
		{"NAT64 public", "64:ff9b::808:808", true},
		{"NAT64 public dotted", "64:ff9b::93.184.216.34", true},
		{"NAT64 local-use", "64:ff9b:1::808:808", false},
		{"6to4 private", "2002:a00:1::1", false},
		{"6to4 metadata", "2002:a9fe:a9fe::", false},
		{"6to4 loopback", "2002:7f00:1:1::1", false},
		{"6to4 public", "2002:808:808::1", true},
		{"IPv4-compatible private", "::10.0.0.1", false},
		{"IPv4-compatible public", "::8.8.8.8", false},
		{"IPv4-compatible low", "::2", false},
		{"IPv4-mapped private", "::ffff:169.254.169.254", false},
		{"IPv4-mapped public", "::ffff:93.184.216.34", true},
		{"site-local", "fec0::1", false},
		{"site-local top", "feff:ffff::1", false},
		{"Teredo private client", "2001:0:4136:e378:8000:63bf:f5ff:fffe", false},
		{"Teredo public client", "2001:0:4136:e378:8000:63bf:f7f7:f7f7", false},
		{"zoned link-local", "fe80::1%eth0", false},
		{"zoned NAT64 private", "64:ff9b::a00:1%eth0", false},
		{"just outside NAT64", "64:ff9b:0:0:0:1:a00:1", true},
		{"just outside Teredo", "2001:1::a00:1", true},
		{"ordinary public", "2606:4700::1111", true},
	} {
		if got := egress.Public(netip.MustParseAddr(tc.addr)); got != tc.public {
			t.Errorf("%s: Public(%s) = %v, want %v", tc.name, tc.addr, got, tc.public)
		}
	}
}
