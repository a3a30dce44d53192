package preferences

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/push/policy"
)

// Source says which categories users have turned push off for: Builtin or
// External, as the dispatcher asks it.
type Source interface {
	// PushOff returns, per user, the categories whose push is off; a user or
	// category absent pushes. A source that cannot answer for a user leaves
	// that user out (fail open): it never errors for one user's sake.
	PushOff(ctx context.Context, users []string) map[string]map[string]bool
}

var (
	_ Source = (*Builtin)(nil)
	_ Source = (*External)(nil)
)

// CategorySetting is one category's preference, as the API shows it.
type CategorySetting struct {
	Push bool `json:"push"`
}

// Doc is a user's preferences as the API and the external
// preference service speak them: {"categories":{"<category>":{"push":false}}}.
type Doc struct {
	Categories map[string]CategorySetting `json:"categories"`
	// QuietHours are the built-in store's; nil: none.
	QuietHours *policy.QuietHours `json:"quiet_hours"`
}

// Update is a PUT /v1/preferences: the categories it names are
// set and the others kept; quiet_hours absent are kept, null removed.
type Update struct {
	Categories map[string]CategorySetting `json:"categories"`
	QuietHours policy.QuietHoursSetting   `json:"quiet_hours"`
}

// Builtin keeps preferences in Postgres (GET|PUT /v1/preferences).
type Builtin struct {
	db      DB
	metrics *Metrics
	log     *slog.Logger
	failLog *lograte.Limiter
}

// NewBuiltin returns the preference store over db; metrics and
// log may be nil.
func NewBuiltin(db DB, metrics *Metrics, log *slog.Logger) *Builtin {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Builtin{db: db, metrics: metrics, log: log.With("component", "preferences"), failLog: lograte.New(10 * time.Second)}
}

// Get returns the user's settings; categories not listed push.
func (p *Builtin) Get(ctx context.Context, userID string) (Doc, error) {
	rows, err := p.db.Query(ctx, `SELECT category, push FROM push_preferences WHERE user_id = $1 ORDER BY category`, userID)
	if err != nil {
		return Doc{}, fmt.Errorf("read preferences: %w", err)
	}
	defer rows.Close()
	doc := Doc{Categories: map[string]CategorySetting{}}
	for rows.Next() {
		var category string
		var push bool
		if err := rows.Scan(&category, &push); err != nil {
			return Doc{}, err
		}
		doc.Categories[category] = CategorySetting{Push: push}
	}
	if err := rows.Err(); err != nil {
		return Doc{}, err
	}
	quiet, err := QuietHours(ctx, p.db, []string{userID})
	if err != nil {
		return Doc{}, err
	}
	if q, ok := quiet[userID]; ok {
		doc.QuietHours = &q
	}
	return doc, nil
}

// Merge sets the categories in doc and keeps the others as they were, and
// sets or removes the quiet hours if doc says so, in one statement.
func (p *Builtin) Merge(ctx context.Context, userID string, doc Update) (Doc, error) {
	categories := make([]string, 0, len(doc.Categories))
	pushes := make([]bool, 0, len(doc.Categories))
	for c, s := range doc.Categories {
		categories, pushes = append(categories, c), append(pushes, s.Push)
	}
	// $4: 0 keeps the quiet hours, 1 sets them, 2 removes them.
	action, start, end, zone := 0, 0, 0, ""
	if doc.QuietHours.Set {
		action = 2
		if q := doc.QuietHours.Value; q != nil {
			start, end = q.Minutes()
			action, zone = 1, q.TimeZone
		}
	}
	if _, err := p.db.Exec(ctx, `WITH prefs AS (
			INSERT INTO push_preferences (user_id, category, push)
			SELECT $1, c, p FROM unnest($2::text[], $3::bool[]) AS t(c, p)
			ON CONFLICT (user_id, category) DO UPDATE SET push = EXCLUDED.push, updated_at = now()
		),
		removed AS (
			DELETE FROM push_quiet_hours WHERE user_id = $1 AND $4::int = 2
		)
		INSERT INTO push_quiet_hours (user_id, start_minute, end_minute, time_zone)
		SELECT $1, $5, $6, $7 WHERE $4::int = 1
		ON CONFLICT (user_id) DO UPDATE SET start_minute = EXCLUDED.start_minute, end_minute = EXCLUDED.end_minute,
		    time_zone = EXCLUDED.time_zone, updated_at = now()`, userID, categories, pushes, action, start, end, zone); err != nil {
		return Doc{}, fmt.Errorf("save preferences: %w", err)
	}
	return p.Get(ctx, userID)
}

// PushOff implements Source. If Postgres fails, everyone pushes (fail open).
func (p *Builtin) PushOff(ctx context.Context, users []string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	rows, err := p.db.Query(ctx, `SELECT user_id, category FROM push_preferences WHERE user_id = ANY($1) AND NOT push`, users)
	if err == nil {
		defer rows.Close()
		for rows.Next() {
			var user, category string
			if err = rows.Scan(&user, &category); err != nil {
				break
			}
			if out[user] == nil {
				out[user] = map[string]bool{}
			}
			out[user][category] = true
		}
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		p.metrics.lookups.WithLabelValues(FailOpen).Add(float64(len(users)))
		p.failLog.Do(func(suppressed int64) {
			p.log.Warn("preferences unreadable; pushing to everyone (fail open)", "err", err, "suppressed", suppressed)
		})
		return map[string]map[string]bool{}
	}
	p.metrics.lookups.WithLabelValues(BuiltinRead).Add(float64(len(users)))
	return out
}

// Results of a preference lookup, the values of the metric's result label.
const (
	Hit         = "hit"       // the external answer was cached
	Miss        = "miss"      // asked the external service, which answered
	FailOpen    = "fail_open" // the source failed: pushed anyway
	BuiltinRead = "builtin"   // read from Postgres
)

// ExternalConfig configures the external preference source.
type ExternalConfig struct {
	// URL of the preference service: a user's preferences are at URL/<user id>. Required.
	URL string
	// Token returns the bearer token to send (a service token with the
	// prefs:read scope). Required.
	Token func() (string, error)
	// CacheTTL is how long an answer is kept per user. Default 60s.
	CacheTTL time.Duration
	// Timeout bounds one lookup. Default 300ms.
	Timeout time.Duration
	// Concurrency caps lookups in flight. Default 16.
	Concurrency int
	// HTTP is the client. Default http.DefaultClient's transport without its own timeout.
	HTTP *http.Client
	// Metrics and Logger: defaults not exported, slog.Default().
	Metrics *Metrics
	Logger  *slog.Logger
	// Clock is the clock of the cache. Default the wall clock.
	Clock clock.Clock
}

// External asks the product's own API for each user's
// preferences: GET <URL>/<user id> with a service bearer token, answered 200
// with a Doc, or 404 for a user without preferences (push
// everything). Answers are cached per user for CacheTTL, for at most 100,000
// users (past it the oldest answer is dropped); a failure (timeout, 5xx, an
// answer it cannot read) is never cached and pushes anyway.
type External struct {
	cfg     ExternalConfig
	log     *slog.Logger
	failLog *lograte.Limiter
	slots   chan struct{}

	mu    sync.Mutex
	cache *prefsCache
}

// NewExternal returns the external source.
func NewExternal(cfg ExternalConfig) (*External, error) {
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https"):
		return nil, fmt.Errorf("preferences URL %q: want an http(s) URL", cfg.URL)
	case cfg.Token == nil:
		return nil, errors.New("preferences: a service token source is required")
	case cfg.CacheTTL < 0 || cfg.Timeout < 0 || cfg.Concurrency < 0:
		return nil, errors.New("preferences: cache TTL, timeout and concurrency must not be negative")
	}
	cfg.URL = strings.TrimSuffix(cfg.URL, "/")
	cfg.CacheTTL = cmp.Or(cfg.CacheTTL, time.Minute)
	cfg.Timeout = cmp.Or(cfg.Timeout, 300*time.Millisecond)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 16)
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	return &External{
		cfg: cfg, log: cfg.Logger.With("component", "preferences"), failLog: lograte.New(10 * time.Second),
		slots: make(chan struct{}, cfg.Concurrency), cache: newPrefsCache(prefsCacheSize, cfg.CacheTTL),
	}, nil
}

// PushOff implements Source.
func (p *External) PushOff(ctx context.Context, users []string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	now := p.cfg.Clock.Now()
	for _, user := range users {
		p.mu.Lock()
		cached, ok := p.cache.get(user, now)
		p.mu.Unlock()
		if ok {
			p.cfg.Metrics.lookups.WithLabelValues(Hit).Inc()
			if len(cached) > 0 {
				out[user] = cached
			}
			continue
		}
		wg.Go(func() {
			off, err := p.lookup(ctx, user)
			if err != nil {
				p.cfg.Metrics.lookups.WithLabelValues(FailOpen).Inc()
				p.failLog.Do(func(suppressed int64) {
					p.log.Warn("preference service failed; pushing anyway (fail open)", "user", user, "err", err, "suppressed", suppressed)
				})
				return
			}
			p.cfg.Metrics.lookups.WithLabelValues(Miss).Inc()
			p.mu.Lock()
			p.cache.put(user, off, p.cfg.Clock.Now()) // the clock read under the lock: stores in time order
			p.mu.Unlock()
			if len(off) > 0 {
				mu.Lock()
				out[user] = off
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

func (p *External) lookup(ctx context.Context, user string) (map[string]bool, error) {
	select {
	case p.slots <- struct{}{}:
		defer func() { <-p.slots }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	token, err := p.cfg.Token()
	if err != nil {
		return nil, fmt.Errorf("service token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.URL+"/"+url.PathEscape(user), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return map[string]bool{}, nil // no preferences: push everything
	default:
		return nil, fmt.Errorf("preference service answered %d", resp.StatusCode)
	}
	var doc Doc
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("preference service: undecodable answer: %w", err)
	}
	off := map[string]bool{}
	for c, s := range doc.Categories {
		if !s.Push {
			off[c] = true
		}
	}
	return off, nil
}
