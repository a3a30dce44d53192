// Package webhook sends outbound webhooks by the Standard Webhooks
// specification (https://www.standardwebhooks.com): every state change a
// subscriber asked for — a notification created or read, a push sent,
// delivered, failed or held by a delivery policy — becomes a signed POST to
// each endpoint that takes its type.
//
// The outbox is Postgres: triggers (migration 012) write a delivery row per
// (endpoint, event) in the transaction of the change itself, so a delivery
// exists exactly when its change committed. Any replica's Deliverer takes
// due rows with FOR UPDATE SKIP LOCKED and a lease, sends each at least once
// with the same webhook-id, retries with exponential backoff and jitter for
// a bounded time (three days by default) or after a receiver's Retry-After,
// sends nothing more for a while to a receiver that says it is overloaded
// (429, or 502, 503, 504 with a Retry-After), and disables an endpoint that answers 410 Gone or
// has failed for days. Store is the admin API's view: endpoints, their
// secrets and rotation, replay and the delivery log.
package webhook
