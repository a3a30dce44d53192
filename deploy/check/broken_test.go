package check

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder collects what the checks report, to test the checks themselves.
type recorder struct{ errs *[]string }

func (r recorder) Helper() {}

func (r recorder) Errorf(format string, args ...any) {
	*r.errs = append(*r.errs, fmt.Sprintf(format, args...))
}

func (r recorder) Run(_ string, f func(reporter)) { f(r) }

// TestChecksCatch renders each kustomization in testdata/broken (the real
// overlay or example with one mistake patched in) and expects the checks to
// report the mistake: every "# want: " line of its kustomization.yaml must
// appear in a report.
func TestChecksCatch(t *testing.T) {
	cli := spoolcastCLI(t)
	cases, err := filepath.Glob(filepath.Join("testdata", "broken", "*", "kustomization.yaml"))
	if err != nil || len(cases) == 0 {
		t.Fatalf("no cases in testdata/broken (%v)", err)
	}
	for _, k := range cases {
		dir := filepath.Dir(k)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(k)
			if err != nil {
				t.Fatal(err)
			}
			var wants []string
			for _, line := range strings.Split(string(data), "\n") {
				if w, ok := strings.CutPrefix(line, "# want: "); ok {
					wants = append(wants, w)
				}
			}
			if len(wants) == 0 {
				t.Fatalf("%s has no # want: line", k)
			}
			var errs []string
			check(recorder{&errs}, dir, filepath.Base(dir), cli)
			for _, w := range wants {
				found := false
				for _, e := range errs {
					found = found || strings.Contains(e, w)
				}
				if !found {
					t.Errorf("no report says %q; the reports:\n%s", w, strings.Join(errs, "\n"))
				}
			}
		})
	}
}
