package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// keyTTL is how long a key answers retries as a duplicate: the relay's
// default --key-ttl, given to Redis's key and to the JetStream stream's
// duplicate window (Postgres keeps keys for good).
const keyTTL = 24 * time.Hour

// maxBody is the relay's default --max-body.
const maxBody = 64 << 10

// store takes one event durably: isNew is false when its key was taken
// before, and then nothing was stored.
type store interface {
	ingest(ctx context.Context, key string, body []byte) (isNew bool, err error)
	close()
}

// serveFrontEnd runs the HTTP front-end of one store on listen until
// SIGTERM. It listens only once the store answers, so that a listening
// front-end means a ready target.
func serveFrontEnd(kind, listen, backend string, pool int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var s store
	var err error
	switch kind {
	case "redis":
		s, err = openRedis(ctx, backend, pool)
	case "nats":
		s, err = openNATS(ctx, backend)
	case "postgres":
		s, err = openPostgres(ctx, backend, pool)
	default:
		err = fmt.Errorf("unknown front-end %q", kind)
	}
	if err != nil {
		return err
	}
	defer s.close()

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: eventsHandler(s), ReadHeaderTimeout: 10 * time.Second}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ingestEvent is what a front-end checks of an event before storing it
// whole, as received: the fields the relay requires first.
type ingestEvent struct {
	IdempotencyKey string   `json:"idempotency_key"`
	Type           string   `json:"type"`
	Recipients     []string `json:"recipients"`
	Title          string   `json:"title"`
}

// eventsHandler serves the relay's contract: POST /v1/events, 202 once
// stored, 200 for a key taken before.
func eventsHandler(s store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/events", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		var ev ingestEvent
		if err := json.Unmarshal(body, &ev); err != nil || ev.IdempotencyKey == "" || ev.Type == "" || len(ev.Recipients) == 0 || ev.Title == "" {
			http.Error(w, "want a JSON event with idempotency_key, type, recipients and title", http.StatusBadRequest)
			return
		}
		// As in the relay, the store gets its answer even if the producer
		// hangs up meanwhile.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
		defer cancel()
		isNew, err := s.ingest(ctx, ev.IdempotencyKey, body)
		if err != nil {
			http.Error(w, "not stored; retry with the same key: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if isNew {
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, `{"status":"accepted","idempotency_key":%q}`, ev.IdempotencyKey)
			return
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"status":"duplicate","idempotency_key":%q}`, ev.IdempotencyKey)
	})
	return mux
}

// retry calls f until it succeeds or ctx ends: a store just started may
// not answer yet.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// redisStore claims the key and appends the event to a stream in one Lua
// script, so that the two happen together or not at all.
type redisStore struct{ client *redis.Client }

var redisIngest = redis.NewScript(`
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  redis.call('XADD', KEYS[2], '*', 'key', ARGV[3], 'body', ARGV[1])
  return 1
end
return 0`)

func openRedis(ctx context.Context, addr string, pool int) (store, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool, MinIdleConns: pool, DisableIdentity: true})
	if err := retry(ctx, func() error { return client.Ping(ctx).Err() }); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	return redisStore{client}, nil
}

func (s redisStore) ingest(ctx context.Context, key string, body []byte) (bool, error) {
	n, err := redisIngest.Run(ctx, s.client, []string{"idem:" + key, "events"}, body, int(keyTTL.Seconds()), key).Int()
	return n == 1, err
}

func (s redisStore) close() { s.client.Close() }

// natsStore publishes each event to a JetStream stream with the key as
// Nats-Msg-Id and waits for the stream's acknowledgement, which says
// whether the id was seen within the duplicate window.
type natsStore struct {
	conn *nats.Conn
	js   jetstream.JetStream
}

const natsSubject = "events"

func openNATS(ctx context.Context, url string) (store, error) {
	var conn *nats.Conn
	if err := retry(ctx, func() (err error) { conn, err = nats.Connect(url); return err }); err != nil {
		return nil, fmt.Errorf("nats at %s: %w", url, err)
	}
	js, err := jetstream.New(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	// JetStream answers only once it has recovered its streams.
	err = retry(ctx, func() error {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: "EVENTS", Subjects: []string{natsSubject}, Storage: jetstream.FileStorage, Replicas: 1, Duplicates: keyTTL,
		})
		return err
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("create the stream: %w", err)
	}
	return natsStore{conn, js}, nil
}

func (s natsStore) ingest(ctx context.Context, key string, body []byte) (bool, error) {
	ack, err := s.js.Publish(ctx, natsSubject, body, jetstream.WithMsgID(key))
	if err != nil {
		return false, err
	}
	return !ack.Duplicate, nil
}

func (s natsStore) close() { s.conn.Close() }

// postgresStore inserts each event in a transaction of its own (one
// statement, committed when it returns).
type postgresStore struct{ pool *pgxpool.Pool }

func openPostgres(ctx context.Context, url string, size int) (store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(size), int32(size)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = retry(ctx, func() error {
		_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS events (
			key         text PRIMARY KEY,
			body        jsonb NOT NULL,
			received_at timestamptz NOT NULL DEFAULT now()
		)`)
		return err
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s: %w", url, err)
	}
	return postgresStore{pool}, nil
}

func (s postgresStore) ingest(ctx context.Context, key string, body []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, `INSERT INTO events (key, body) VALUES ($1, $2) ON CONFLICT DO NOTHING`, key, body)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

func (s postgresStore) close() { s.pool.Close() }
