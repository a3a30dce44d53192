package startstop_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStopCancelsTheLoopsWaitsForThemAndRunsTheFinalStepOnce(t *testing.T) {
	var s startstop.Service
	var returned, finals atomic.Int32
	started := make(chan struct{})
	if !s.Start(context.Background(), func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		returned.Add(1)
	}) {
		t.Fatal("the first Start did not start")
	}
	if s.Start(context.Background(), func(context.Context) { t.Error("a second Start ran a loop") }) {
		t.Fatal("a second Start reported starting")
	}
	<-started
	final := func(context.Context) error { finals.Add(1); return errors.New("flush failed") }
	err := s.Stop(context.Background(), final)
	if err == nil || err.Error() != "flush failed" {
		t.Fatalf("Stop = %v, want the final step's error", err)
	}
	if returned.Load() != 1 {
		t.Fatal("Stop returned before the loop did")
	}
	if err := s.Stop(context.Background(), final); err == nil || err.Error() != "flush failed" {
		t.Fatalf("a second Stop = %v, want the first one's answer", err)
	}
	if finals.Load() != 1 {
		t.Fatalf("the final step ran %d times, want once", finals.Load())
	}
	select {
	case <-s.Stopped():
	default:
		t.Fatal("Stopped is not closed after Stop")
	}
}

func TestStopBeforeStartMakesStartAStep(t *testing.T) {
	var s startstop.Service
	if err := s.Stop(context.Background(), func(context.Context) error { t.Error("final ran without Start"); return nil }); err != nil {
		t.Fatal(err)
	}
	if s.Start(context.Background(), func(context.Context) { t.Error("a loop ran after Stop") }) {
		t.Fatal("Start after Stop reported starting")
	}
	if s.Go(context.Background(), func(context.Context) { t.Error("Go ran after Stop") }) {
		t.Fatal("Go after Stop reported running")
	}
}

func TestStopGivesUpWhenItsContextEnds(t *testing.T) {
	var s startstop.Service
	release := make(chan struct{})
	s.Start(context.Background(), func(context.Context) { <-release }) // ignores its context
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Stop(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop = %v, want context.Canceled", err)
	}
	close(release)
}

func TestEveryRunsAtStartOnTheIntervalAndWhenWoken(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	wake := make(chan struct{}, 1)
	passes := make(chan int, 10)
	var n int
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		startstop.Every(ctx, startstop.Schedule{Interval: time.Minute, Wake: wake, Clock: clk}, func(context.Context) bool {
			n++
			passes <- n
			return n == 2 // the second pass found more: the third runs at once
		})
	}()
	expect := func(want int, what string) {
		t.Helper()
		select {
		case got := <-passes:
			if got != want {
				t.Fatalf("%s: pass %d, want %d", what, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no pass", what)
		}
	}
	expect(1, "at start")
	<-clk.TimerAdded()
	clk.Advance(time.Minute)
	expect(2, "after the interval")
	expect(3, "at once after a pass that found more")
	<-clk.TimerAdded()
	wake <- struct{}{}
	expect(4, "on a wake-up")
	cancel()
	<-done
}

func TestEveryWithDelayWaitsBeforeTheFirstPass(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	passes := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		startstop.Every(ctx, startstop.Schedule{Interval: time.Minute, Clock: clk, Delay: true}, func(context.Context) bool {
			passes <- struct{}{}
			return false
		})
	}()
	<-clk.TimerAdded()
	select {
	case <-passes:
		t.Fatal("a delayed schedule ran a pass at start")
	default:
	}
	clk.Advance(time.Minute)
	<-passes
	cancel()
	<-done
}

func TestBackoffGrowsToItsCapWithJitterOnTheUpperHalf(t *testing.T) {
	for failures, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 40: 5 * time.Second} {
		for range 100 {
			if d := startstop.Backoff(failures, 100*time.Millisecond, 5*time.Second); d < want/2 || d > want {
				t.Fatalf("Backoff(%d) = %s, want within [%s, %s]", failures, d, want/2, want)
			}
		}
	}
}
