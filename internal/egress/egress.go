// Package egress guards the requests spoolcast makes to addresses its users
// choose (webhook endpoints, Web Push subscriptions): by default none may
// reach loopback, link-local or private ranges, so that whoever can name a
// URL cannot make central probe its own network.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// ErrPrivate: the address is loopback, link-local, private or otherwise
// not public.
var ErrPrivate = errors.New("the target address is loopback, link-local or private")

// nonPublic are the ranges a webhook may not reach by default: what would
// let anyone who can create an endpoint probe the deployment's own network.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this" network
	netip.MustParsePrefix("10.0.0.0/8"),     // private
	netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata
	netip.MustParsePrefix("172.16.0.0/12"),  // private
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("192.168.0.0/16"), // private
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("224.0.0.0/3"),    // multicast, reserved, broadcast
	netip.MustParsePrefix("::/128"),         // unspecified
	netip.MustParsePrefix("::1/128"),        // loopback
	netip.MustParsePrefix("::/96"),          // IPv4-compatible (deprecated), would carry any IPv4
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("2001::/32"),      // Teredo: relayed to an obfuscated IPv4 we do not check
	netip.MustParsePrefix("fc00::/7"),       // unique local
	netip.MustParsePrefix("fec0::/10"),      // site-local (deprecated), still private where used
	netip.MustParsePrefix("fe80::/10"),      // link-local
	netip.MustParsePrefix("ff00::/8"),       // multicast
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
	netip.MustParsePrefix("100::/64"),       // discard
}

// Prefixes that translate or tunnel to an IPv4 address embedded in them:
// NAT64/DNS64 (RFC 6052) makes 64:ff9b::a00:1 reach 10.0.0.1, and 6to4
// (RFC 3056) carries it in bits 16-48, so the IPv4 rules must apply to it.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// Public reports whether addr may be reached by default.
func Public(addr netip.Addr) bool {
	// ::ffff:10.0.0.1 is 10.0.0.1; a zone (fe80::1%eth0) would make every
	// Prefix.Contains below false.
	addr = addr.Unmap().WithZone("")
	if !addr.IsValid() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(addr) {
			return false
		}
	}
	b := addr.As16()
	switch {
	case nat64.Contains(addr):
		return Public(netip.AddrFrom4([4]byte(b[12:16])))
	case sixTo4.Contains(addr):
		return Public(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return true
}

// Dialer returns a dialer that, unless allowPrivate, refuses at connect
// time every address Public refuses, whatever the name resolved to.
func Dialer(timeout time.Duration, allowPrivate bool) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if !Public(ap.Addr()) {
				return fmt.Errorf("%s: %w", ap.Addr(), ErrPrivate)
			}
			return nil
		}
	}
	return d
}

// CheckHost reports an error unless rawURL's host resolves only to public
// addresses (within 5 s).
func CheckHost(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return errors.New("not a URL with a host")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		return fmt.Errorf("%s does not resolve: %w", u.Hostname(), err)
	}
	for _, a := range addrs {
		if !Public(a) {
			return fmt.Errorf("%s is %s: %w", u.Hostname(), a, ErrPrivate)
		}
	}
	return nil
}

// Client returns an HTTP client for user-chosen targets: no proxy (which
// would hide the address dialled from the guard), no redirects (a 3xx is the
// target's answer, and following it could reach an address no check saw),
// each connection refused unless Public (or allowPrivate), timeout on each
// request, and perHost connections kept alive per target.
func Client(timeout time.Duration, allowPrivate bool, perHost int) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           Dialer(timeout, allowPrivate).DialContext,
			TLSHandshakeTimeout:   timeout,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   perHost,
			IdleConnTimeout:       90 * time.Second,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
