// Package chaosplant plants defects in a binary built for the chaos run's
// self-check (go build -tags chaosdefects), so that the self-check proves,
// through the running system, that the chaos run's ordinary checks catch
// each kind: an event acknowledged and never stored, a push sent twice, a
// live frame dropped, a device's refusal taken for the deployment's. Every other build compiles Plant to false, and each
// call site to nothing.
package chaosplant

// Defect is one kind of planted defect.
type Defect int

// The defects, each planted at every Nth chance.
const (
	// LoseEvent: the relay answers 202 for an event it does not spool.
	LoseEvent Defect = iota
	// DoublePush: a push is sent to the provider twice.
	DoublePush
	// DropFrame: a live frame is not sent to a socket.
	DropFrame
	// MisjudgeRefusal: a device's refusal (its token another app's) is
	// taken for the deployment's: counted for the credentials alert, the
	// device kept. At every chance: a run refuses only a few devices.
	MisjudgeRefusal
	defects
)

// N is how rare each planted defect is: one chance in N, but for
// MisjudgeRefusal, planted at each.
const N = 1000
