package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/spool"
)

func TestSpoolLsTellsCancellationsFromEvents(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	ctx := context.Background()
	sp, err := spool.Open(ctx, spool.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []spool.Entry{
		{Producer: "billing", Key: "invoice:7", Hash: []byte("h1"), Payload: []byte(`{}`)},
		{Producer: spool.CancelProducer("billing"), Key: "invoice:7", Hash: []byte("h2"), Payload: []byte(`{}`)},
	} {
		if _, err := sp.Claim(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.Close(ctx); err != nil {
		t.Fatal(err)
	}
	p := proctest.Start(t, nil, "spool", "ls", "--spool", path, "--json")
	deadline := time.Now().Add(30 * time.Second)
	for p.Output() == "" || !strings.HasSuffix(p.Output(), "\n") || strings.Count(p.Output(), "\n") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("spool ls printed %q", p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	var kinds, producers []string
	for _, line := range strings.Split(strings.TrimSpace(p.Output()), "\n") {
		var row struct{ Kind, Producer string }
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		kinds, producers = append(kinds, row.Kind), append(producers, row.Producer)
	}
	if strings.Join(kinds, ",") != "event,cancel" || strings.Join(producers, ",") != "billing,billing" {
		t.Errorf("kinds %v, producers %v; want an event and a cancellation, both billing's", kinds, producers)
	}
}
