package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Scheduler runs a maintenance pass at start and then every interval, in
// every replica; the advisory lock makes all but one skip.
type Scheduler struct {
	cfg       Config
	interval  time.Duration
	watchOnly bool // read the partitions present; run no pass
	failLog   *lograte.Limiter
	svc       startstop.Service
}

// NewScheduler returns a scheduler of passes with cfg; Start runs it.
func NewScheduler(cfg Config, interval time.Duration) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DB == nil || interval <= 0 {
		return nil, errors.New("maintenance: a database and a positive interval are required")
	}
	return &Scheduler{cfg: cfg.withDefaults(), interval: interval, failLog: lograte.New(10 * time.Minute)}, nil
}

// NewWatcher returns a scheduler that runs no pass: every interval it reads
// which partitions are present, so that their gauges, and the alert on
// partitions ahead, hold where passes run elsewhere (a `spoolcast maintain`
// CronJob).
func NewWatcher(cfg Config, interval time.Duration) (*Scheduler, error) {
	s, err := NewScheduler(cfg, interval)
	if err != nil {
		return nil, err
	}
	s.watchOnly = true
	return s, nil
}

// Start runs passes in the background and returns at once. Only the first
// call starts them.
func (s *Scheduler) Start(ctx context.Context) {
	s.svc.Start(ctx, func(ctx context.Context) {
		startstop.Every(ctx, startstop.Schedule{Interval: s.interval, Clock: s.cfg.Clock}, s.pass)
	})
}

// Stop cancels a pass in flight and waits for the loop to end, until ctx
// ends. Safe to call twice, and before Start (which then never starts).
func (s *Scheduler) Stop(ctx context.Context) error { return s.svc.Stop(ctx) }

func (s *Scheduler) pass(ctx context.Context) bool {
	if s.watchOnly {
		parts, err := Partitions(ctx, s.cfg.DB)
		if err == nil {
			s.cfg.Metrics.observePartitions(parts, s.cfg.Clock)
		} else if ctx.Err() == nil {
			s.failLog.Do(func(suppressed int64) {
				s.cfg.Logger.Warn("cannot read the partitions present; the next look retries", "component", "maintenance", "err", err, "suppressed", suppressed)
			})
		}
	} else if _, err := Run(ctx, s.cfg); err != nil && ctx.Err() == nil {
		s.failLog.Do(func(suppressed int64) {
			s.cfg.Logger.Error("maintenance pass failed; the next one retries", "component", "maintenance", "err", err, "suppressed", suppressed)
		})
	}
	return false
}
