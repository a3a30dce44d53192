//go:build !chaosdefects

package chaosplant

// Enabled: defects are planted in this build.
const Enabled = false

// Plant reports whether to plant d at this chance: never, in this build.
func Plant(Defect) bool { return false }
