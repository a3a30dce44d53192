package main

import (
	"flag"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/webhook"
)

// webhookFlags configure outbound webhooks.
type webhookFlags struct {
	enabled      bool
	allowPrivate bool
	timeout      time.Duration
	retryFor     time.Duration
	disableAfter time.Duration
	retention    time.Duration
	concurrency  int
	perEndpoint  int
}

func (f *webhookFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "webhooks", true, "deliver outbound webhooks from this replica (the endpoints' outbox is written either way; any replica delivers it)")
	fs.BoolVar(&f.allowPrivate, "webhook-allow-private", false, "let webhook endpoints target loopback, link-local and private addresses (development; `spoolcast dev` sets it). Off, such URLs are refused when created and their addresses refused when dialled")
	fs.DurationVar(&f.timeout, "webhook-timeout", webhook.DefaultTimeout, "how long a receiver has to answer 2xx; no answer in time counts as failed and is sent again")
	fs.DurationVar(&f.retryFor, "webhook-retry-for", webhook.DefaultRetryFor, "how long a webhook delivery is retried (exponential backoff with jitter, 5s to 6h apart) before it ends failed")
	fs.DurationVar(&f.disableAfter, "webhook-disable-after", webhook.DefaultDisableAfter, "disable an endpoint whose every attempt has failed for this long (replay turns it back on)")
	fs.DurationVar(&f.retention, "webhook-retention", webhook.DefaultRetention, "how long ended deliveries and the attempt log are kept, the reach of a replay; at least --webhook-retry-for")
	fs.IntVar(&f.concurrency, "webhook-concurrency", webhook.DefaultConcurrency, "webhook attempts in flight per replica")
	fs.IntVar(&f.perEndpoint, "webhook-per-endpoint", webhook.DefaultPerEndpoint, "webhook attempts in flight per endpoint per replica, so that a slow receiver holds only its share")
}

// deliverer returns the replica's webhook deliverer; nil with --webhooks=false.
func (f *webhookFlags) deliverer(db webhook.DB, reg prometheus.Registerer, logger *slog.Logger) (*webhook.Deliverer, error) {
	if !f.enabled {
		return nil, nil
	}
	return webhook.NewDeliverer(webhook.DelivererConfig{
		DB: db, AllowPrivate: f.allowPrivate, Timeout: f.timeout, RetryFor: f.retryFor, DisableAfter: f.disableAfter,
		Retention: f.retention, Concurrency: f.concurrency, PerEndpoint: f.perEndpoint,
		Metrics: webhook.NewMetrics(reg), Logger: logger,
	})
}
