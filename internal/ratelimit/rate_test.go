package ratelimit

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseRateReadsTheFlagForms(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Rate
	}{
		{"20/s", Rate{20, time.Second}},
		{"100/m", Rate{100, time.Minute}},
		{"5/h", Rate{5, time.Hour}},
		{"1/s", Rate{1, time.Second}},
		{" 20/s\n", Rate{20, time.Second}},
		{"020/s", Rate{20, time.Second}},
		{"1000000000/s", Rate{MaxN, time.Second}},
		{"0", Rate{}},
		{"off", Rate{}},
		{"OFF", Rate{}},
		{" off ", Rate{}},
	} {
		got, err := ParseRate(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseRateRejectsWhatIsNotARateSayingWhy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, why string
	}{
		{"", "want N/s"},
		{"20", "want N/s"},
		{"20s", "want N/s"},
		{"/s", "not a whole number"},
		{"-5/s", "not a whole number"},
		{"+5/s", "not a whole number"},
		{"1.5/s", "not a whole number"},
		{"2e3/s", "not a whole number"},
		{"20 /s", "not a whole number"},
		{"0/s", "refuse every request"},
		{"00/m", "refuse every request"},
		{"1000000001/s", "at most 1000000000"},
		{"99999999999999999999999/s", "at most 1000000000"},
		{"20/", `unit ""`},
		{"20/d", `unit "d"`},
		{"20/S", `unit "S"`},
		{"20/sec", `unit "sec"`},
		{"20/1s", `unit "1s"`},
		{"20/s/s", `unit "s/s"`},
		{"none", "want N/s"},
	} {
		got, err := ParseRate(tc.in)
		if err == nil {
			t.Errorf("ParseRate(%q) = %v, want an error", tc.in, got)
			continue
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Errorf("ParseRate(%q) error %q, want it to say %q", tc.in, err, tc.why)
		}
	}
}

func TestARateSpellsItselfAsParseRateReadsIt(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"20/s", "100/m", "5/h", "off"} {
		r, err := ParseRate(in)
		if err != nil {
			t.Fatal(err)
		}
		if r.String() != in {
			t.Errorf("ParseRate(%q).String() = %q", in, r.String())
		}
	}
	if got := (Rate{N: 3, Per: 2 * time.Second}).String(); got != "3/2s" {
		t.Errorf("an invalid rate prints as %q, want 3/2s", got)
	}
}

func TestTheBurstIsTwiceTheWindowsAmount(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"20/s": 40, "100/m": 200, "5/h": 10, "off": 0} {
		r, _ := ParseRate(in)
		if r.Burst() != want {
			t.Errorf("%s: burst %d, want %d", in, r.Burst(), want)
		}
	}
}

func TestARateIsAFlagWithItsDefaultShown(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("central", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var user, ip Rate
	fs.TextVar(&user, "rate-limit-user", Rate{20, time.Second}, "requests per user")
	fs.TextVar(&ip, "rate-limit-ip", Rate{}, "failed authentications per address")
	if err := fs.Parse([]string{"--rate-limit-ip", "5/m"}); err != nil {
		t.Fatal(err)
	}
	if user != (Rate{20, time.Second}) || ip != (Rate{5, time.Minute}) {
		t.Errorf("user %v, ip %v; want 20/s and 5/m", user, ip)
	}
	if got := fs.Lookup("rate-limit-user").DefValue; got != "20/s" {
		t.Errorf("default shown as %q, want 20/s", got)
	}
	if err := fs.Parse([]string{"--rate-limit-user", "fast"}); err == nil || !strings.Contains(err.Error(), `rate "fast"`) {
		t.Errorf("a bad flag value: error %v, want one naming the value", err)
	}
}
