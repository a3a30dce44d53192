package topics

// Loops is how many background loops Start runs for f.
func Loops(f *Fanout) int { return len(f.loops()) }
