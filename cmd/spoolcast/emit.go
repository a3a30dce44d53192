package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// emitCommand is `spoolcast emit`: post one sample event to a relay and print
// the answer.
func emitCommand() (*flag.FlagSet, runFunc) {
	var relayURL, key, recipients, title, body, typ, category, tokenFile string
	fs := newFlagSet("emit", "spoolcast emit [--relay URL] [--key KEY] [--recipients u1,u2] [--title TEXT]")
	fs.StringVar(&relayURL, "relay", "http://127.0.0.1:7070", "relay base URL")
	fs.StringVar(&key, "key", "", "idempotency key (default: a new one per call)")
	fs.StringVar(&recipients, "recipients", "u_123", "comma-separated recipient user ids")
	fs.StringVar(&title, "title", "Hello from spoolcast", "notification title")
	fs.StringVar(&body, "body", "", "notification body")
	fs.StringVar(&typ, "type", "demo.hello", "event type")
	fs.StringVar(&category, "category", "demo", "event category")
	fs.StringVar(&tokenFile, "token-file", "", "file with a service bearer token, for a relay that requires one")
	return fs, func(ctx context.Context, _ []string) error {
		if key == "" {
			key = fmt.Sprintf("emit:%d", time.Now().UnixNano())
		}
		var to []string
		for _, r := range strings.Split(recipients, ",") {
			if r = strings.TrimSpace(r); r != "" {
				to = append(to, r)
			}
		}
		if len(to) == 0 {
			return errors.New("--recipients: name at least one user id")
		}
		payload, err := json.Marshal(map[string]any{
			"idempotency_key": key, "type": typ, "category": category, "recipients": to, "title": title, "body": body,
			"data": map[string]any{"sent_by": "spoolcast emit"},
		})
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(relayURL, "/")+"/v1/events", strings.NewReader(string(payload)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if tokenFile != "" {
			tok, err := os.ReadFile(tokenFile)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		}
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			return fmt.Errorf("post to relay: %w", err)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		fmt.Printf("%s %s\n%s", resp.Proto, resp.Status, answer)
		if resp.StatusCode >= 300 {
			return fmt.Errorf("relay answered %s", resp.Status)
		}
		return nil
	}
}
