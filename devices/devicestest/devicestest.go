// Package devicestest reads the device store for tests: each device's
// state as a user would see it in GET /v1/devices.
package devicestest

import (
	"context"
	"testing"

	"github.com/spoolcast/spoolcast/devices"
)

// States is every device of user: its token's disabled_reason when
// disabled, "" when enabled. A device whose enabled flag and disabled
// columns disagree fails the test.
func States(tb testing.TB, store *devices.Store, user string) map[string]string {
	tb.Helper()
	devs, err := store.List(context.Background(), user)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range devs {
		switch {
		case d.Enabled && d.DisabledReason == nil && d.DisabledAt == nil:
			out[d.Token] = ""
		case !d.Enabled && d.DisabledReason != nil && d.DisabledAt != nil:
			out[d.Token] = *d.DisabledReason
		default:
			tb.Fatalf("device %+v: enabled and disabled_reason/disabled_at disagree", d)
		}
	}
	return out
}
