package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxN is the largest N a Rate may have: past it the interval between two
// units, Per/N, would round to nothing.
const MaxN = 1_000_000_000

// Rate is N events per Per. The zero Rate is no limit.
type Rate struct {
	// N is the events allowed each Per, 1 to MaxN; 0 means no limit.
	N int
	// Per is time.Second, time.Minute or time.Hour.
	Per time.Duration
}

// ParseRate reads a rate as a flag spells it: "20/s", "100/m", "5/h", or "0"
// or "off" for no limit. Surrounding spaces are ignored.
func ParseRate(s string) (Rate, error) {
	v := strings.TrimSpace(s)
	if v == "0" || strings.EqualFold(v, "off") {
		return Rate{}, nil
	}
	num, unit, ok := strings.Cut(v, "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want N/s, N/m or N/h (e.g. 20/s), or off", s)
	}
	if num == "" || strings.Trim(num, "0123456789") != "" {
		return Rate{}, fmt.Errorf("rate %q: %q is not a whole number of requests", s, num)
	}
	n, err := strconv.Atoi(num)
	if err != nil || n > MaxN {
		return Rate{}, fmt.Errorf("rate %q: at most %d requests a unit", s, MaxN)
	}
	if n == 0 {
		return Rate{}, fmt.Errorf("rate %q: 0 a unit would refuse every request; for no limit write 0 or off", s)
	}
	per, ok := units[unit]
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: unit %q: want s, m or h", s, unit)
	}
	return Rate{N: n, Per: per}, nil
}

var units = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}

// String spells r the way ParseRate reads it: "20/s", or "off".
func (r Rate) String() string {
	if r.N == 0 {
		return "off"
	}
	switch r.Per {
	case time.Second:
		return strconv.Itoa(r.N) + "/s"
	case time.Minute:
		return strconv.Itoa(r.N) + "/m"
	case time.Hour:
		return strconv.Itoa(r.N) + "/h"
	}
	return fmt.Sprintf("%d/%s", r.N, r.Per) // invalid, but printable
}

// Off reports whether r is no limit.
func (r Rate) Off() bool { return r.N == 0 }

// Burst is how many requests a full bucket holds: twice N.
func (r Rate) Burst() int { return 2 * r.N }

// MarshalText spells r as String does, so that flag.TextVar shows it.
func (r Rate) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads r as ParseRate does, so that flag.TextVar sets it.
func (r *Rate) UnmarshalText(text []byte) error {
	v, err := ParseRate(string(text))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// validate reports what makes r unusable; ParseRate never returns such a rate.
func (r Rate) validate() error {
	switch {
	case r.N == 0:
		return nil
	case r.N < 0 || r.N > MaxN:
		return fmt.Errorf("rate %s: N must be 1 to %d, or 0 for no limit", r, MaxN)
	case r.Per != time.Second && r.Per != time.Minute && r.Per != time.Hour:
		return fmt.Errorf("rate %s: Per must be a second, a minute or an hour", r)
	}
	return nil
}
