// Command testreport runs go test with the arguments it is given, prints
// what go test prints without -v (each package's line, the output of the
// tests that fail, a package's own output), and then the ten slowest tests
// and packages, so that every run of `make test` says where its time went.
// It exits with go test's status.
//
//	go run ./internal/testreport -race -count=1 ./...
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// slowest is how many tests and packages the report names.
const slowest = 10

func main() {
	cmd := exec.Command("go", append([]string{"test", "-json"}, os.Args[1:]...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r := newReport(os.Stdout)
	if err := r.read(out); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
	}
	err = cmd.Wait()
	r.summary()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
}

type timing struct {
	name    string
	elapsed time.Duration
}

type report struct {
	w        io.Writer
	output   map[string][]string // a running test's output, printed if it fails
	tests    []timing
	packages []timing
	started  time.Time
}

func newReport(w io.Writer) *report {
	return &report{w: w, output: map[string][]string{}, started: time.Now()}
}

// read prints events as go test without -v would, and keeps the timings.
func (r *report) read(in io.Reader) error {
	s := bufio.NewScanner(in)
	s.Buffer(make([]byte, 1<<20), 16<<20)
	for s.Scan() {
		var e event
		if err := json.Unmarshal(s.Bytes(), &e); err != nil {
			fmt.Fprintln(r.w, s.Text()) // not an event: a build error, say
			continue
		}
		r.event(e)
	}
	return s.Err()
}

func (r *report) event(e event) {
	key := e.Package + " " + e.Test
	elapsed := time.Duration(e.Elapsed * float64(time.Second))
	switch {
	case e.Test == "" && e.Action == "output":
		if !progress(e.Output) {
			fmt.Fprint(r.w, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
		r.packages = append(r.packages, timing{e.Package, elapsed})
	case e.Action == "output":
		r.output[key] = append(r.output[key], e.Output)
	case e.Action == "pass" || e.Action == "skip":
		delete(r.output, key)
		if e.Action == "pass" && !strings.Contains(e.Test, "/") { // a subtest's time is its parent's too
			r.tests = append(r.tests, timing{strings.TrimPrefix(e.Package, "github.com/spoolcast/spoolcast/") + " " + e.Test, elapsed})
		}
	case e.Action == "fail":
		fmt.Fprint(r.w, strings.Join(r.output[key], ""))
		delete(r.output, key)
		if !strings.Contains(e.Test, "/") {
			r.tests = append(r.tests, timing{strings.TrimPrefix(e.Package, "github.com/spoolcast/spoolcast/") + " " + e.Test, elapsed})
		}
	}
}

// progress reports whether a package-level line is go test -v's own
// chatter, which a run without -v does not print.
func progress(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- SKIP", "PASS\n"} {
		if strings.HasPrefix(strings.TrimLeft(line, " "), p) {
			return true
		}
	}
	return false
}

// summary prints the slowest tests and packages.
func (r *report) summary() {
	byTime := func(a, b timing) int { return cmp.Compare(b.elapsed, a.elapsed) }
	slices.SortFunc(r.tests, byTime)
	slices.SortFunc(r.packages, byTime)
	fmt.Fprintf(r.w, "\nThe %d slowest tests (of %d):\n", min(slowest, len(r.tests)), len(r.tests))
	for _, t := range r.tests[:min(slowest, len(r.tests))] {
		fmt.Fprintf(r.w, "  %8.1fs  %s\n", t.elapsed.Seconds(), t.name)
	}
	fmt.Fprintf(r.w, "The %d slowest packages (of %d), in %.0fs in all:\n", min(slowest, len(r.packages)), len(r.packages), time.Since(r.started).Seconds())
	for _, p := range r.packages[:min(slowest, len(r.packages))] {
		fmt.Fprintf(r.w, "  %8.1fs  %s\n", p.elapsed.Seconds(), p.name)
	}
}
