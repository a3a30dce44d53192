package lograte_test

import (
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/lograte"
)

func TestOneLineAnIntervalCarryingTheCountLeftOut(t *testing.T) {
	t.Parallel()
	l := lograte.New(20 * time.Millisecond)
	lines := 0
	l.Do(func(suppressed int64) {
		lines++
		if suppressed != 0 {
			t.Errorf("first line: suppressed = %d, want 0", suppressed)
		}
	})
	calls := 0
	for ran := false; !ran; {
		calls++
		l.Do(func(suppressed int64) {
			ran = true
			if suppressed != int64(calls-1) {
				t.Errorf("next line: suppressed = %d, want the %d calls turned away", suppressed, calls-1)
			}
		})
	}
	if lines != 1 {
		t.Errorf("lines = %d before the interval passed, want 1", lines)
	}
}
