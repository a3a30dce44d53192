package apiversion_test

import (
	"testing"

	"github.com/spoolcast/spoolcast/apiversion"
)

func TestTheShippedVersionsAreValid(t *testing.T) {
	t.Parallel()
	r := apiversion.Default()
	if r.Latest() != "2026-11-30" {
		t.Errorf("latest = %s", r.Latest())
	}
}

func TestRegistryRefusesMistakes(t *testing.T) {
	t.Parallel()
	for name, vs := range map[string][]apiversion.Version{
		"no versions":                 nil,
		"a date that is not a date":   {{Date: "2026-13-01"}},
		"a version listed twice":      {{Date: "2026-01-01"}, {Date: "2026-01-01"}},
		"a deprecated newest version": {{Date: "2026-01-01"}, {Date: "2026-02-01", Deprecated: true}},
	} {
		if _, err := apiversion.NewRegistry(vs...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestAppVersionsCompareNumerically(t *testing.T) {
	t.Parallel()
	v := func(s string) apiversion.AppVersion {
		a, err := apiversion.ParseAppVersion(s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		a, b string
		less bool
	}{{"1.9", "1.10", true}, {"2.0", "2", false}, {"2", "2.0.1", true}, {"10.0.0", "9.9.9", false}} {
		if got := v(tc.a).Less(v(tc.b)); got != tc.less {
			t.Errorf("%s < %s = %v", tc.a, tc.b, got)
		}
	}
	for _, bad := range []string{"", "1..2", "v1.2", "1.2.3.4.5", "01.2", "-1"} {
		if _, err := apiversion.ParseAppVersion(bad); err == nil {
			t.Errorf("ParseAppVersion(%q) accepted", bad)
		}
	}
}
