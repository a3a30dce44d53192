package live_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/live"
)

// FuzzWantsEventStream checks the reading of Accept that chooses the event
// stream: it never panics; it takes only a value that names the event
// stream's media type; naming it more never takes the choice back, nor does
// adding a media range; and a WebSocket handshake is never taken for one.
func FuzzWantsEventStream(f *testing.F) {
	for _, seed := range []string{
		"text/event-stream",
		"text/event-stream; charset=utf-8",
		"TEXT/Event-Stream;q=0.5",
		"text/event-stream;q=0",
		"text/event-stream;q=0.000, application/json",
		"application/json, text/event-stream;q=1.0",
		"text/event-stream; q=NaN",
		"text/event-stream;q=\"0\"",
		"*/*",
		"text/*",
		"",
		";;,,;=q",
	} {
		f.Add(seed, false)
	}
	f.Add("text/event-stream", true)
	f.Fuzz(func(t *testing.T, accept string, upgrade bool) {
		wants := func(accept string) bool {
			r, _ := http.NewRequest(http.MethodGet, "http://spoolcast/v1/stream", nil)
			r.Header["Accept"] = []string{accept}
			if upgrade {
				r.Header.Set("Upgrade", "WebSocket")
			}
			return live.WantsEventStream(r)
		}
		got := wants(accept)
		switch {
		case upgrade && got:
			t.Fatalf("a WebSocket handshake with Accept %q is taken for an event stream", accept)
		case upgrade:
			return
		case got && !strings.Contains(strings.ToLower(accept), "text/event-stream"):
			t.Fatalf("Accept %q names no event stream, and is taken for one", accept)
		case !wants(accept + ", text/event-stream"):
			t.Fatalf("Accept %q, text/event-stream is not taken for an event stream", accept)
		case got && !wants(accept+", application/json;q=0"):
			t.Fatalf("adding a media range to Accept %q takes the event stream back", accept)
		}
	})
}
