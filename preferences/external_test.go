package preferences_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/preferences"
)

// roundTripper answers requests in-process.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestThePreferenceCacheKeepsAtMostItsBoundDroppingTheOldestAnswer(t *testing.T) {
	t.Parallel()
	const bound = 100_000 // the cache's default size
	var mu sync.Mutex
	asked := map[string]int{}
	service := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		asked[strings.TrimPrefix(r.URL.Path, "/prefs/")]++
		mu.Unlock()
		return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})}
	// Nothing expires in this test: the clock stands still.
	prefs, err := preferences.NewExternal(preferences.ExternalConfig{
		URL: "http://prefs.invalid/prefs", Token: func() (string, error) { return "t", nil }, HTTP: service,
		Clock: clock.NewFake(time.Now()), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prefs.PushOff(ctx, []string{"u000000"}) // the oldest answer (a batch's lookups end in any order)
	users := make([]string, 0, 1000)
	for i := 1; i < bound; i += len(users) {
		users = users[:0]
		for j := i; j < min(i+cap(users), bound); j++ {
			users = append(users, fmt.Sprintf("u%06d", j))
		}
		prefs.PushOff(ctx, users)
	}
	prefs.PushOff(ctx, []string{"one-more"}) // past the bound
	prefs.PushOff(ctx, []string{"u000000", fmt.Sprintf("u%06d", bound-1)})
	if n := asked["u000000"]; n != 2 {
		t.Errorf("the oldest answer was asked for %d times; want twice: the cache went past its %d entries instead of dropping it", n, bound)
	}
	if n := asked[fmt.Sprintf("u%06d", bound-1)]; n != 1 {
		t.Errorf("the newest answer before the last was asked for %d times; want once (cached)", n)
	}
}
