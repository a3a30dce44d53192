package ratelimit

import (
	"net"
	"net/http"
	"net/netip"
)

// ClientIP returns the key for the address r came from, read from
// r.RemoteAddr only (the package doc says why not X-Forwarded-For): an IPv4
// address, or the /64 prefix of an IPv6 one. A RemoteAddr that is not an IP
// address (a Unix socket) is returned as it is.
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	p, _ := addr.Prefix(64)
	return p.String()
}
