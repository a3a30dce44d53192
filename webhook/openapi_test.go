package webhook_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/spoolcast/spoolcast/docs"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
	"github.com/spoolcast/spoolcast/webhook"
)

// webhookSchemas are the bodies docs/openapi.yaml's webhooks section
// describes, by event type.
func webhookSchemas(t *testing.T) map[string]*openapi3.Schema {
	t.Helper()
	spec, err := openapi3.NewLoader().LoadFromData(docs.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(context.Background()); err != nil {
		t.Fatalf("docs/openapi.yaml is not valid OpenAPI: %v", err)
	}
	body := func(name string) *openapi3.Schema {
		item := spec.Webhooks[name]
		if item == nil || item.Post == nil {
			t.Fatalf("docs/openapi.yaml has no webhook %q", name)
		}
		return item.Post.RequestBody.Value.Content.Get("application/json").Schema.Value
	}
	out := map[string]*openapi3.Schema{
		webhook.NotificationCreated:  body("notificationCreated"),
		webhook.NotificationRead:     body("notificationRead"),
		webhook.NotificationArchived: body("notificationArchived"),
		webhook.TopicFanoutCompleted: body("topicFanoutCompleted"),
	}
	for _, typ := range []string{webhook.PushSent, webhook.PushDelivered, webhook.PushFailed, webhook.PushSkipped, webhook.PushDeferred,
		webhook.PushDigested, webhook.PushThrottled, webhook.PushSuppressed, webhook.PushCancelled} {
		out[typ] = body("push")
	}
	return out
}

// Every kind of body a receiver gets is the one docs/openapi.yaml
// describes: a notification, a read and a read-all, and pushes with and
// without a device, a ticket or an error. An archive and an archive-all
// send notification.archived; unread and unarchive send nothing.
func TestEveryDeliveryBodyIsTheOneTheOpenAPIWebhooksDescribe(t *testing.T) {
	schemas := webhookSchemas(t)
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	e.endpoint(r.URL, webhook.NotificationCreated, webhook.NotificationRead, webhook.NotificationArchived, webhook.PushSent, webhook.PushDelivered, webhook.PushFailed, webhook.PushSkipped,
		webhook.TopicFanoutCompleted)
	e.ingest("export-1", "alice")
	e.ingest("export-2", "alice")
	// A topic event: its members' notifications send no notification.created,
	// its fan-out one topic.fanout.completed.
	if _, err := topics.NewStore(e.pool).ChangeMembers(context.Background(), "launch", []string{"bob", "carol"}, nil); err != nil {
		t.Fatal(err)
	}
	launch, err := event.Decode([]byte(`{"idempotency_key":"launch-1","type":"launch","title":"We launched","topics":["launch"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.Ingest(context.Background(), e.pool, []ingest.Item{{Producer: "news", Event: launch}}); err != nil {
		t.Fatal(err)
	}
	fanout, err := topics.NewFanout(topics.FanoutConfig{DB: e.pool})
	if err != nil {
		t.Fatal(err)
	}
	if err := fanout.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	var id feed.ID
	if err := e.pool.QueryRow(context.Background(), `SELECT created_at, id FROM notifications WHERE user_id = 'alice' AND idempotency_key = 'export-1'`).Scan(&id.CreatedAt, &id.Seq); err != nil {
		t.Fatal(err)
	}
	store := feed.NewStore(e.pool, nil)
	if err := store.MarkRead(context.Background(), "alice", id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.MarkAllRead(context.Background(), "alice"); err != nil {
		t.Fatal(err)
	}
	if err := store.MarkUnread(context.Background(), "alice", id); err != nil {
		t.Fatal(err)
	}
	if err := store.Archive(context.Background(), "alice", id); err != nil {
		t.Fatal(err)
	}
	if err := store.Unarchive(context.Background(), "alice", id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.MarkAllArchived(context.Background(), "alice"); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state, error)
		VALUES ($1, $2, 'alice', NULL, 'skipped', 'no device'), ($1, $2, 'alice', 'ExponentPushToken[abcdefghijklmnop]', 'queued', NULL)`, id.Seq, id.CreatedAt)
	e.exec(`UPDATE push_dispatches SET state = 'sent', ticket_id = 'ticket-1', updated_at = now() WHERE state = 'queued'`)
	e.exec(`UPDATE push_dispatches SET state = 'receipt_error', error = 'DeviceNotRegistered', updated_at = now() WHERE state = 'sent'`)
	e.pass()

	seen := map[string]int{}
	for _, d := range r.deliveries() {
		var body struct {
			Type string `json:"type"`
		}
		var value any
		if err := json.Unmarshal(d.Body, &body); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(d.Body, &value); err != nil {
			t.Fatal(err)
		}
		schema := schemas[body.Type]
		if schema == nil {
			t.Errorf("a delivery of type %q, which docs/openapi.yaml does not describe: %s", body.Type, d.Body)
			continue
		}
		if err := schema.VisitJSON(value, openapi3.EnableFormatValidation()); err != nil {
			t.Errorf("a %s body does not match docs/openapi.yaml: %v\n%s", body.Type, err, d.Body)
		}
		seen[body.Type]++
	}
	want := map[string]int{webhook.NotificationCreated: 2, webhook.NotificationRead: 2, webhook.NotificationArchived: 2, webhook.PushSkipped: 1, webhook.PushSent: 1, webhook.PushFailed: 1,
		webhook.TopicFanoutCompleted: 1}
	for typ, n := range want {
		if seen[typ] != n {
			t.Errorf("%d deliveries of %s, want %d (got %v)", seen[typ], typ, n, seen)
		}
	}
}
