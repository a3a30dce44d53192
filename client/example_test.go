package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/spoolcast/spoolcast/client"
	"github.com/spoolcast/spoolcast/relay"
	"github.com/spoolcast/spoolcast/spool"
)

// Emitting the same event twice stores it once; reusing its key for another
// event is a conflict; a broken event is refused before it is sent.
func ExampleClient_Emit() {
	// A relay as it runs beside a producer: a spool on local disk, HTTP on
	// loopback. In production it is already there, at client.DefaultRelayURL.
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "client-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)
	sp, err := spool.Open(ctx, spool.Config{Path: filepath.Join(dir, "spool.db"), Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sp.Close(ctx)
	srv, err := relay.New(relay.Config{Producer: "scheduler", Spool: sp, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	c, err := client.New(client.Config{RelayURL: ts.URL})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.CloseIdleConnections()
	ev := client.Event{
		IdempotencyKey: "meeting_assignment:u_123:m_456",
		Type:           "meeting.assigned",
		Category:       "meetings",
		Recipients:     []string{"u_123"},
		Title:          "You were added to Weekly sync",
		Data:           map[string]any{"meeting_id": "m_456"},
	}

	first, err := c.Emit(ctx, ev)
	fmt.Println(first.Status, err)
	again, err := c.Emit(ctx, ev) // a retry, a redelivered job: safe
	fmt.Println(again.Status, again.ReceivedAt.Equal(first.ReceivedAt), err)

	ev.Title = "You were added to Monthly sync" // another event under the same key
	_, err = c.Emit(ctx, ev)
	fmt.Println(errors.Is(err, client.ErrConflict))

	_, err = c.Emit(ctx, client.Event{IdempotencyKey: "meeting_assignment:u_123:m_789", Type: "meeting.assigned", Title: "You were added to Weekly sync"})
	var invalid *client.InvalidEventError
	if errors.As(err, &invalid) {
		fmt.Println(invalid.Field, invalid.Detail)
	}
	// Output:
	// accepted <nil>
	// duplicate true <nil>
	// true
	// recipients at least one recipient or topic is required
}

// A relay that listens beyond loopback requires service tokens. TokenSource
// is asked before every attempt, so a rotated token file is picked up.
func ExampleNew_serviceToken() {
	c, err := client.New(client.Config{
		RelayURL: "http://relay.billing.svc:7070",
		TokenSource: func(context.Context) (string, error) {
			tok, err := os.ReadFile("/var/run/secrets/spoolcast/token")
			return strings.TrimSpace(string(tok)), err
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = c
}
