package problem_test

import (
	"os"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/internal/problem"
)

func TestEveryProblemTypeIsListedInTheAPIDocsOnce(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, pt := range problem.Types {
		if seen[pt.Slug] {
			t.Errorf("problem type %q is in the table twice", pt.Slug)
		}
		seen[pt.Slug] = true
		row := "| `" + pt.Slug + "` | " + pt.Title + " |"
		if n := strings.Count(string(doc), row); n != 1 {
			t.Errorf("docs/api.md lists %q with its title %d times, want once (a row starting %s)", pt.Slug, n, row)
		}
	}
}
