package live

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The live frames held while a socket resumes are bounded by bytes as its
// queue is, not by frames alone: past QueueBytes, the stream's frames held
// are dropped for a catch-up from Postgres after the resume, which reads
// them at the pace the app reads.
func TestFramesHeldDuringAResumeAreBoundedByBytes(t *testing.T) {
	h := &Hub{cfg: Config{QueueFrames: 1024, QueueBytes: 4 << 10}, metrics: NewMetrics(nil)}
	s := &socket{hub: h, resuming: true, transport: transportWebSocket}
	big := bytes.Repeat([]byte("x"), 1500)
	for i := range 10 {
		s.offer(frame{kind: kindNotification, pos: Position{Tx: 1, ID: int64(i + 1)}, bytes: big})
		if s.heldSize > h.cfg.QueueBytes {
			t.Fatalf("after %d frames of 1,500 bytes, %d bytes held; want at most %d", i+1, s.heldSize, h.cfg.QueueBytes)
		}
	}
	if !s.behind || testutil.ToFloat64(h.metrics.catchUps) != 1 {
		t.Errorf("behind %v, catch-ups %v; want the socket to catch up from Postgres, counted once", s.behind, testutil.ToFloat64(h.metrics.catchUps))
	}
	if s.closing {
		t.Error("the socket was closed; want it to catch up")
	}
}
