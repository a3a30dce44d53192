// Package eventtest makes valid producer events for tests.
package eventtest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/spoolcast/spoolcast/event"
)

// Event returns a valid "job.finished" event with key for recipients.
func Event(t testing.TB, key string, recipients ...string) event.Event {
	t.Helper()
	to, _ := json.Marshal(recipients)
	body := fmt.Sprintf(`{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":%s,"title":"Export ready","data":{"rows":12345}}`, key, to)
	ev, err := event.Decode([]byte(body), "")
	if err != nil {
		t.Fatal(err)
	}
	return ev
}
