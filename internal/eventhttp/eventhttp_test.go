package eventhttp

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"
)

func TestTheAnswerBodyIsWhatEncodingJSONWrites(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)
	for _, a := range []Answer{
		{Status: StatusAccepted, IdempotencyKey: "meeting:u_1", ReceivedAt: at},
		{Status: StatusDuplicate, IdempotencyKey: "quote \" back\\slash \n é \u2028 <tag>", ReceivedAt: at.Truncate(time.Second)},
	} {
		w := httptest.NewRecorder()
		WriteAnswer(w, a)
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(a)
		if w.Body.String() != want.String() {
			t.Errorf("answer body %q; encoding/json writes %q", w.Body, want.String())
		}
	}
}
