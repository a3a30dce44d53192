package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// liveFlags are central's live stream settings.
type liveFlags struct {
	allowedOrigins originList
	pollInterval   time.Duration
	pingInterval   time.Duration
	queueBytes     byteSize
	maxPerUser     int
	maxSockets     int
}

func (l *liveFlags) register(fs *flag.FlagSet) {
	l.queueBytes = 1 << 20
	fs.Var(&l.allowedOrigins, "allowed-origins", "browser origins that may call the API from their pages (CORS, without cookies) and open /v1/stream, comma-separated (https://app.example.com), or * for any; native apps (no Origin) and central's own host always may")
	fs.DurationVar(&l.pollInterval, "live-poll-interval", 500*time.Millisecond, "how often the live stream reads new notifications without a wake-up: the longest a lost wake-up delays a frame")
	fs.DurationVar(&l.pingInterval, "ws-ping-interval", 30*time.Second, "how often each stream socket is pinged; a socket silent for two intervals is dropped")
	fs.IntVar(&l.maxPerUser, "max-sockets-per-user", 16, "most stream sockets one user may hold on this replica; the next handshake is answered 429 with Retry-After before the upgrade (an app needs one; a few tabs or devices a few; 0 is the default)")
	fs.IntVar(&l.maxSockets, "max-sockets", 0, "most stream sockets this replica holds; past it a handshake is answered 503 with Retry-After, so that the load balancer sends the app to another replica. 0: no cap (budget about 7 KB of memory per idle socket)")
	fs.Var(&l.queueBytes, "ws-queue-bytes", "most bytes waiting to be written to one stream socket (and at most 1024 frames); a burst past it is read from Postgres at the pace the socket reads, instead of queued. Idle sockets hold none of it")
}

func (l *liveFlags) validate() error {
	switch {
	case l.pollInterval < 0:
		return errors.New("--live-poll-interval must not be negative")
	case l.pingInterval < time.Second && l.pingInterval != 0:
		return fmt.Errorf("--ws-ping-interval %v: want at least 1s", l.pingInterval)
	case l.maxPerUser < 0 || l.maxSockets < 0:
		return errors.New("--max-sockets-per-user and --max-sockets must not be negative")
	case l.queueBytes < 4<<10 && l.queueBytes != 0:
		return fmt.Errorf("--ws-queue-bytes %s: want at least 4KiB", formatBytes(int64(l.queueBytes)))
	}
	return nil
}

// originList is a comma-separated list of origins.
type originList []string

func (o *originList) String() string { return strings.Join(*o, ",") }

func (o *originList) Set(v string) error {
	*o = nil
	for s := range strings.SplitSeq(v, ",") {
		s = strings.TrimSuffix(strings.TrimSpace(s), "/")
		if s == "" {
			continue
		}
		if s != "*" {
			u, err := url.Parse(s)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" {
				return fmt.Errorf("%q is not an origin: want scheme://host[:port], such as https://app.example.com", s)
			}
		}
		*o = append(*o, s)
	}
	return nil
}
