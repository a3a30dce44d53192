package ratelimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns the key for the address r came from, read from
// r.RemoteAddr only (the package doc says why not X-Forwarded-For): an IPv4
// address, or the /64 prefix of an IPv6 one. A RemoteAddr that is not an IP
// address (a Unix socket) is returned as it is.
func ClientIP(r *http.Request) string { return Proxies(nil).ClientIP(r) }

// Proxies are the addresses of the load balancers and ingresses in front of
// the server, whose X-Forwarded-For is believed.
type Proxies []netip.Prefix

// ParseProxies reads a comma-separated list of CIDR prefixes or single
// addresses ("10.0.0.0/8, 192.168.1.7"); empty is none.
func ParseProxies(s string) (Proxies, error) {
	var out Proxies
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if p, err := netip.ParsePrefix(part); err == nil {
			if p.Addr().Is4In6() && p.Bits() >= 96 { // peers are compared unmapped
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("trusted proxy %q: want a CIDR prefix (10.0.0.0/8) or an address", part)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// String lists the prefixes as ParseProxies reads them.
func (p Proxies) String() string {
	s := make([]string, len(p))
	for i, x := range p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// trusts reports whether a is one of the proxies.
func (p Proxies) trusts(a netip.Addr) bool {
	for _, x := range p {
		if x.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns ClientIP's key for the client of r. While the address
// at hand is a trusted proxy's, starting with the connection's peer, the
// client is taken from X-Forwarded-For, read from the right: each proxy
// appends the address it was reached from, and only what trusted proxies
// wrote is believed. The first address there that is not a trusted proxy is
// the client; what lies left of it was written by the client. An entry that
// is not an address ends the walk at the proxy that passed it on.
func (p Proxies) ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if len(p) > 0 && p.trusts(addr) {
		addr = p.forwardedFor(r.Header.Values("X-Forwarded-For"), addr)
	}
	if addr.Is4() {
		return addr.String()
	}
	prefix, _ := addr.Prefix(64)
	return prefix.String()
}

// forwardedFor walks the X-Forwarded-For lists (every field, in order) from
// the right while the address at hand, first peer, is trusted. It reads
// only as far as it walks: a long header costs no more than its last
// entries.
func (p Proxies) forwardedFor(fields []string, peer netip.Addr) netip.Addr {
	addr := peer
	for i := len(fields) - 1; i >= 0; i-- {
		rest := fields[i]
		for more := true; more; {
			entry := rest
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				entry, rest = rest[j+1:], rest[:j]
			} else {
				more = false
			}
			next, ok := forwardedAddr(strings.TrimSpace(entry))
			if !ok {
				return addr
			}
			addr = next
			if !p.trusts(addr) {
				return addr
			}
		}
	}
	return addr
}

// forwardedAddr reads one X-Forwarded-For entry: an address, an address and
// port ("192.0.2.7:4711", "[2001:db8::1]:4711", as some load balancers
// write), or a bracketed IPv6 address.
func forwardedAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// MarshalText is String, for flag.TextVar.
func (p Proxies) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText adds what ParseProxies reads, for flag.TextVar: a flag
// given twice trusts both lists.
func (p *Proxies) UnmarshalText(b []byte) error {
	v, err := ParseProxies(string(b))
	if err != nil {
		return err
	}
	*p = append(*p, v...)
	return nil
}
