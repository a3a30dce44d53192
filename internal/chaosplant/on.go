//go:build chaosdefects

package chaosplant

import "sync/atomic"

// Enabled: defects are planted in this build.
const Enabled = true

var chances [defects]atomic.Int64

// Plant reports whether to plant d at this chance: at every Nth of its
// chances, counted per process, so that a run with N chances plants it.
func Plant(d Defect) bool {
	if d == MisjudgeRefusal {
		return true
	}
	return chances[d].Add(1)%N == 0
}
