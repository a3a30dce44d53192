package ratelimit

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseRate holds ParseRate to its contract on any input: no panic; a
// rate it returns is valid and spells itself back to the same rate; an error
// names the input it refuses.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{
		"20/s", "100/m", "5/h", "0", "off", "OFF", " 1/s ", "0/s", "-1/s", "+1/s",
		"1000000000/s", "1000000001/h", "18446744073709551617/s", "20", "/s", "20/",
		"20/d", "1.5/s", "20/s/s", "٣/s", "20/ｓ", "\x00", "off/s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Errorf("ParseRate(%q) error %q does not name the input", s, err)
			}
			if r != (Rate{}) {
				t.Errorf("ParseRate(%q) failed but returned %v", s, r)
			}
			return
		}
		if err := r.validate(); err != nil {
			t.Errorf("ParseRate(%q) = %v, invalid: %v", s, r, err)
		}
		back, err := ParseRate(r.String())
		if err != nil || back != r {
			t.Errorf("ParseRate(%q) = %v, which spells %q and reads back as %v, %v", s, r, r.String(), back, err)
		}
		if r.Burst() < 0 || r.Burst() > 2*MaxN {
			t.Errorf("ParseRate(%q) = %v with burst %d", s, r, r.Burst())
		}
	})
}
