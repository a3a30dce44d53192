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
