package event_test

import (
	"fmt"

	"github.com/spoolcast/spoolcast/event"
)

// Two encodings of the same request decode to the same canonical form, so a
// retry is told from a conflict by its hash.
func ExampleDecode() {
	a, _ := event.Decode([]byte(`{"idempotency_key":"invoice:7","type":"invoice.paid","recipients":["u2","u1","u1"],"data":{"total":12.50,"currency":"EUR"}}`), "")
	b, _ := event.Decode([]byte(`{"data":{"currency":"EUR","total":12.50},"recipients":["u1","u2"],"type":"invoice.paid"}`), "invoice:7")
	fmt.Println(string(a.Canonical()))
	fmt.Println(string(a.Hash()) == string(b.Hash()))
	// Output:
	// {"idempotency_key":"invoice:7","type":"invoice.paid","category":"general","recipients":["u1","u2"],"data":{"currency":"EUR","total":12.50}}
	// true
}

func ExampleParseKeyHeader() {
	quoted, _ := event.ParseKeyHeader(`"meeting:42"`)
	bare, _ := event.ParseKeyHeader(`meeting:42`)
	_, err := event.ParseKeyHeader(`"meeting:42`)
	fmt.Println(quoted, bare)
	fmt.Println(err)
	// Output:
	// meeting:42 meeting:42
	// invalid event: Idempotency-Key: unterminated quoted key
}
