package main

// The subscriber's system: a webhook receiver that verifies every
// delivery's signature as a receiver must, fails some, stalls some past the
// sender's timeout, and otherwise takes them.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/webhook"
)

// receiver records what it verified.
type receiver struct {
	mu      sync.Mutex
	rng     *rand.Rand
	secret  string
	created map[string]int // notification id → notification.created deliveries taken
	ids     map[string]int // webhook-id → times taken
	refused int            // signatures that did not verify
	failed  int            // answered 503 on purpose
	stalled int            // held past the sender's timeout, after taking it
}

func newReceiver(seed uint64) *receiver {
	return &receiver{rng: rand.New(rand.NewPCG(seed, 7)), created: map[string]int{}, ids: map[string]int{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	rc.mu.Lock()
	secret := rc.secret
	roll := rc.rng.IntN(1000)
	rc.mu.Unlock()
	id := r.Header.Get("webhook-id")
	if err := webhook.Verify(secret, id, r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), body, time.Now(), 0); err != nil {
		rc.mu.Lock()
		rc.refused++
		rc.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if roll < 30 { // 3 %: the receiver fails before taking it
		rc.mu.Lock()
		rc.failed++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	var ev struct {
		Type string `json:"type"`
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&ev); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.ids[id]++
	if ev.Type == webhook.NotificationCreated {
		rc.created[ev.Data.ID]++
	}
	stall := roll < 32 // 0.2 %: taken, but the answer comes after the sender gave up
	if stall {
		rc.stalled++
	}
	rc.mu.Unlock()
	if stall {
		select {
		case <-time.After(webhook.DefaultTimeout + time.Second):
		case <-r.Context().Done():
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// subscribe creates the endpoint at central, as an operator would.
func (w *world) subscribe(ctx context.Context) error {
	admin, err := w.issuer.Mint("chaos-admin", []string{"admin"}, 24*time.Hour)
	if err != nil {
		return err
	}
	body := fmt.Sprintf(`{"url":%q,"events":["notification.created","push.delivered","push.failed"],"description":"chaos"}`, w.receiverURL)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, w.centrals[0].base+"/v1/admin/webhooks", bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var ep webhook.Endpoint
	if err := json.NewDecoder(resp.Body).Decode(&ep); err != nil || resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("create the webhook endpoint: %d %v", resp.StatusCode, err)
	}
	w.receiver.mu.Lock()
	w.receiver.secret = ep.Secret
	w.receiver.mu.Unlock()
	return nil
}

// checkWebhooks: every stored notification reached the receiver, signed,
// at least once, and no delivery ended failed.
func checkWebhooks(ctx context.Context, db *pgx.Conn, rc *receiver) ([]invariant, error) {
	rows, err := db.Query(ctx, `SELECT spoolcast_public_id(created_at, id) FROM notifications WHERE topic IS NULL`) // a topic's members make one topic.fanout.completed instead
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var failed, pending int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'failed'), count(*) FILTER (WHERE state = 'pending') FROM webhook_deliveries`).Scan(&failed, &pending); err != nil {
		return nil, err
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	missing, twice := 0, 0
	for _, id := range ids {
		switch n := rc.created[id]; {
		case n == 0:
			missing++
		case n > 1:
			twice++
		}
	}
	retried := 0
	for _, n := range rc.ids {
		if n > 1 {
			retried++
		}
	}
	return []invariant{
		{"every stored notification reached the webhook receiver, signed, at least once", missing == 0 && rc.refused == 0,
			fmt.Sprintf("%d notifications; %d never delivered; %d signatures refused; %d taken more than once (%d webhook-ids repeated after %d answers lost to stalls, %d 503s)",
				len(ids), missing, rc.refused, twice, retried, rc.stalled, rc.failed)},
		{"no webhook delivery failed or was left pending", failed == 0 && pending == 0,
			fmt.Sprintf("%d failed, %d pending", failed, pending)},
	}, nil
}
