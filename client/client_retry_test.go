package client_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/client"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

// waitLimit bounds every wait on the relay: far beyond what any step takes,
// it only turns a hang into a failure.
const waitLimit = time.Minute

// nextAnswer waits for the relay to answer its next request.
func (r *testRelay) nextAnswer(t *testing.T) request {
	t.Helper()
	select {
	case rec := <-r.answers:
		return rec
	case <-time.After(waitLimit):
		t.Fatal("the relay received no request")
		return request{}
	}
}

// fill makes the spool refuse new keys (503 overloaded) until free is called,
// as when Postgres is down and events pile up.
func (r *testRelay) fill(t *testing.T, maxBytes int64) (free func()) {
	t.Helper()
	ctx := context.Background()
	res, err := r.spool.Claim(ctx, spool.Entry{Producer: "billing", Key: "filler", Hash: []byte("filler"), Payload: bytes.Repeat([]byte("x"), int(maxBytes))})
	if err != nil || res.Outcome != event.Accepted {
		t.Fatalf("fill the spool: %v %v", res.Outcome, err)
	}
	return func() {
		t.Helper()
		batch, err := r.spool.NextBatch(ctx, 0, spool.BatchLimit{Rows: 100})
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for _, rec := range batch {
			seqs = append(seqs, rec.Seq)
		}
		if err := r.spool.MarkForwarded(ctx, seqs); err != nil {
			t.Fatal(err)
		}
	}
}

// emitAsync runs Emit in its own goroutine; the channel gets its outcome.
func emitAsync(ctx context.Context, c *client.Client, ev client.Event) <-chan outcome {
	done := make(chan outcome, 1)
	go func() {
		res, err := c.Emit(ctx, ev)
		done <- outcome{res, err}
	}()
	return done
}

type outcome struct {
	res client.Result
	err error
}

func wait(t *testing.T, done <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(waitLimit):
		t.Fatal("Emit did not return")
		return outcome{}
	}
}

func TestAnEventIsRetriedUntilTheRelayListens(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there yet: connection refused

	refused := make(chan error, 1)
	dialer := &net.Dialer{}
	transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			select {
			case refused <- err:
			default:
			}
		}
		return conn, err
	}}
	t.Cleanup(transport.CloseIdleConnections)
	c := newClient(t, client.Config{
		RelayURL:   "http://" + addr,
		HTTPClient: &http.Client{Transport: transport},
		// Keep retrying, quickly, for as long as the test needs.
		MaxAttempts: 100_000, MaxElapsed: 10 * time.Minute, BaseBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	})
	done := emitAsync(context.Background(), c, meeting("retry:refused", "Weekly sync"))

	select {
	case err := <-refused:
		t.Logf("first attempt failed as expected: %v", err)
	case o := <-done:
		t.Fatalf("Emit returned %+v %v with no relay listening", o.res, o.err)
	case <-time.After(waitLimit):
		t.Fatal("Emit never tried to connect")
	}
	r := startRelay(t, relayOpts{addr: addr})

	o := wait(t, done)
	if o.err != nil || o.res.Status != client.Accepted {
		t.Fatalf("Emit = %+v %v; want accepted once the relay listens", o.res, o.err)
	}
	if n := r.stored(t, "retry:refused"); n != 1 {
		t.Errorf("the spool holds the key %d times, want once", n)
	}
	again, err := c.Emit(context.Background(), meeting("retry:refused", "Weekly sync"))
	if err != nil || again.Status != client.Duplicate || !again.ReceivedAt.Equal(o.res.ReceivedAt) {
		t.Errorf("emitting again = %+v %v; want duplicate of the retried event", again, err)
	}
}

func TestAFullSpoolIsRetriedWithTheSameKeyAndBodyUntilItHasRoom(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{spoolMaxBytes: 4 << 10})
	free := r.fill(t, 4<<10)
	c := newClient(t, client.Config{RelayURL: r.url, MaxAttempts: 100, MaxElapsed: 10 * time.Minute})
	done := emitAsync(context.Background(), c, meeting("retry:full", "Weekly sync"))

	if first := r.nextAnswer(t); first.status != http.StatusServiceUnavailable {
		t.Fatalf("first answer = %d; want 503 while the spool is full", first.status)
	}
	free()

	o := wait(t, done)
	if o.err != nil || o.res.Status != client.Accepted {
		t.Fatalf("Emit = %+v %v; want accepted once the spool has room", o.res, o.err)
	}
	reqs := r.requests()
	if len(reqs) < 2 {
		t.Fatalf("the relay received %d requests; want the first and at least one retry", len(reqs))
	}
	for i, req := range reqs {
		if !bytes.Equal(req.body, reqs[0].body) {
			t.Errorf("attempt %d sent %s; want the same bytes as the first, %s", i+1, req.body, reqs[0].body)
		}
		want := http.StatusServiceUnavailable
		if i == len(reqs)-1 {
			want = http.StatusAccepted
		}
		if req.status != want {
			t.Errorf("attempt %d was answered %d, want %d", i+1, req.status, want)
		}
	}
	if n := r.stored(t, "retry:full"); n != 1 {
		t.Errorf("the spool holds the key %d times, want once", n)
	}
}

func TestARetryComesNoSoonerThanRetryAfterSays(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{spoolMaxBytes: 4 << 10, retryAfter: time.Second})
	r.fill(t, 4<<10)
	// Backoff alone would retry within a millisecond.
	c := newClient(t, client.Config{RelayURL: r.url, MaxAttempts: 2, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond})

	_, err := c.Emit(context.Background(), meeting("retry:after", "Weekly sync"))
	var gaveUp *client.GaveUpError
	var status *client.StatusError
	if !errors.As(err, &gaveUp) || !errors.Is(err, client.ErrGaveUp) || !errors.As(err, &status) {
		t.Fatalf("Emit = %v; want a GaveUpError wrapping the relay's 503", err)
	}
	if gaveUp.Attempts != 2 || gaveUp.IdempotencyKey != "retry:after" || gaveUp.ContextErr != nil {
		t.Errorf("gave up = %+v; want 2 attempts, the key, no context error", gaveUp)
	}
	if status.StatusCode != http.StatusServiceUnavailable || status.RetryAfter != time.Second || status.Problem.Slug() != "overloaded" || !status.Temporary() {
		t.Errorf("last failure = %+v; want 503 overloaded with Retry-After 1s", status)
	}
	reqs := r.requests()
	if len(reqs) != 2 {
		t.Fatalf("the relay received %d requests, want 2", len(reqs))
	}
	if reqs[0].retryAfter != "1" {
		t.Fatalf("the relay's first answer had Retry-After %q, want 1", reqs[0].retryAfter)
	}
	if gap := reqs[1].start.Sub(reqs[0].answered); gap < time.Second {
		t.Errorf("the retry came %s after the answer that said Retry-After: 1; want no sooner", gap)
	}
}

func TestARetryAfterBeyondTheBudgetGivesUpAtOnce(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{spoolMaxBytes: 4 << 10, retryAfter: time.Hour})
	r.fill(t, 4<<10)

	t.Run("past MaxElapsed", func(t *testing.T) {
		c := newClient(t, client.Config{RelayURL: r.url, MaxElapsed: time.Minute})
		before := len(r.requests())
		_, err := c.Emit(context.Background(), meeting("budget:elapsed", "t"))
		var gaveUp *client.GaveUpError
		if !errors.As(err, &gaveUp) || gaveUp.Attempts != 1 || gaveUp.ContextErr != nil {
			t.Fatalf("Emit = %v; want a GaveUpError after one attempt, not an hour's wait", err)
		}
		if got := len(r.requests()) - before; got != 1 {
			t.Errorf("the relay received %d requests, want 1", got)
		}
	})
	t.Run("past the context's deadline", func(t *testing.T) {
		c := newClient(t, client.Config{RelayURL: r.url, MaxElapsed: 2 * time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		before := len(r.requests())
		_, err := c.Emit(ctx, meeting("budget:deadline", "t"))
		if !errors.Is(err, client.ErrGaveUp) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Emit = %v; want a GaveUpError for the context's deadline", err)
		}
		if got := len(r.requests()) - before; got != 1 {
			t.Errorf("the relay received %d requests, want 1", got)
		}
	})
}

func TestCancellingTheContextStopsRetrying(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{spoolMaxBytes: 4 << 10, retryAfter: time.Hour})
	r.fill(t, 4<<10)
	c := newClient(t, client.Config{RelayURL: r.url, MaxElapsed: 2 * time.Hour})

	t.Run("while waiting to retry", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := emitAsync(ctx, c, meeting("cancel:waiting", "t"))
		if first := r.nextAnswer(t); first.status != http.StatusServiceUnavailable {
			t.Fatalf("first answer = %d; want 503", first.status)
		}
		cancel() // Emit now waits out Retry-After: 3600

		o := wait(t, done)
		var gaveUp *client.GaveUpError
		if !errors.As(o.err, &gaveUp) || !errors.Is(o.err, context.Canceled) {
			t.Fatalf("Emit = %v; want a GaveUpError for the cancelled context", o.err)
		}
		if gaveUp.Attempts != 1 || gaveUp.Last == nil {
			t.Errorf("gave up = %+v; want one attempt and its failure", gaveUp)
		}
		if got := len(r.requests()); got != 1 {
			t.Errorf("the relay received %d requests, want 1", got)
		}
	})
	t.Run("before the first attempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		before := len(r.requests())
		_, err := c.Emit(ctx, meeting("cancel:before", "t"))
		var gaveUp *client.GaveUpError
		if !errors.As(err, &gaveUp) || !errors.Is(err, context.Canceled) || gaveUp.Attempts != 0 {
			t.Fatalf("Emit = %v; want a GaveUpError with no attempt", err)
		}
		if got := len(r.requests()) - before; got != 0 {
			t.Errorf("the relay received %d requests, want none", got)
		}
	})
}
