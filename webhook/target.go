package webhook

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

// MaxURLLen bounds an endpoint's URL.
const MaxURLLen = 2048

// ErrPrivateTarget: the URL's host is, or resolves to, an address on
// loopback, link-local or a private range, which only
// --webhook-allow-private permits.
var ErrPrivateTarget = errors.New("webhook: the target address is loopback, link-local or private")

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
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("fc00::/7"),       // unique local
	netip.MustParsePrefix("fe80::/10"),      // link-local
	netip.MustParsePrefix("ff00::/8"),       // multicast
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
	netip.MustParsePrefix("100::/64"),       // discard
}

// Public reports whether addr may be a webhook's target by default.
func Public(addr netip.Addr) bool {
	addr = addr.Unmap() // ::ffff:10.0.0.1 is 10.0.0.1
	if !addr.IsValid() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// CheckURL says whether raw can be an endpoint: an absolute http or https
// URL without credentials, whose host resolves (through resolver; nil: the
// default) only to public addresses unless allowPrivate. The check at
// delivery is the dialer's (Client): a name may resolve differently later.
func CheckURL(ctx context.Context, raw string, allowPrivate bool, resolver *net.Resolver) error {
	if len(raw) > MaxURLLen {
		return fmt.Errorf("longer than %d bytes", MaxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return errors.New("want an http or https URL")
	}
	if u.User != nil {
		return errors.New("credentials in the URL are not accepted; the signature authenticates spoolcast to the receiver")
	}
	if u.Hostname() == "" || u.Opaque != "" {
		return errors.New("no host")
	}
	if u.Fragment != "" {
		return errors.New("a fragment is never sent")
	}
	if allowPrivate {
		return nil
	}
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := resolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		return fmt.Errorf("%s does not resolve: %w", u.Hostname(), err)
	}
	for _, a := range addrs {
		if !Public(a) {
			return fmt.Errorf("%s is %s: %w", u.Hostname(), a, ErrPrivateTarget)
		}
	}
	return nil
}

// Client returns the HTTP client deliveries use: no proxy (which would hide
// the address dialled), no redirects (a 3xx is the receiver's answer, and
// following it could reach an address the URL check never saw), and unless
// allowPrivate a dialer that refuses non-public addresses at connect time,
// whatever the name resolved to when the endpoint was created.
func Client(timeout time.Duration, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if !Public(ap.Addr()) {
				return fmt.Errorf("%s: %w", ap.Addr(), ErrPrivateTarget)
			}
			return nil
		}
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   timeout,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
