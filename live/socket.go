package live

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/internal/chaosplant"
)

// maxClientFrame bounds what a client may send in one frame: clients only
// answer pings and close, so anything larger is a misbehaving peer.
const maxClientFrame = 4 << 10

var slots atomic.Uint32

// transport is how a socket frames what it writes, and what it reads.
type transport uint8

const (
	transportWebSocket transport = iota
	transportSSE                 // an event stream (text/event-stream) over HTTP/1.1
)

// socket is one client's stream: a WebSocket, or an event stream on a
// connection taken over from the HTTP server. It holds no goroutine while
// idle but the one blocked reading the connection; a writer runs only while
// frames wait.
type socket struct {
	hub       *Hub
	conn      net.Conn
	user      string
	transport transport
	slot      uint32 // which tick of the ping loop pings it

	mu       sync.Mutex
	queue    []frame
	queued   int // bytes in queue
	writing  bool
	closing  bool      // a close frame is queued: nothing more is accepted
	gone     bool      // the connection is closed
	resuming bool      // the resume, or a catch-up, is reading from Postgres: live frames are held
	catching bool      // the resuming is a catch-up
	behind   bool      // live frames were dropped (a burst): catch up from Postgres after last
	slow     bool      // counted as too slow
	held     []frame   // live frames that arrived during the resume
	heldSize int       // bytes in held, as the socket would write them
	last     Position  // the place in the stream of the last frame queued (a notification or a change of state)
	lastAt   time.Time // its cursor's time, or the time of the resume's end there
	room     chan struct{}
}

func newSocket(h *Hub, conn net.Conn, user string, t transport) *socket {
	return &socket{hub: h, conn: conn, user: user, transport: t, slot: slots.Add(1), resuming: true, room: make(chan struct{}, 1)}
}

// size is the length of f as the socket writes it.
func (s *socket) size(f frame) int {
	if s.transport == transportSSE {
		return sseSize(f)
	}
	return len(f.bytes)
}

// appendFrame appends f as the socket writes it.
func (s *socket) appendFrame(bufs net.Buffers, f frame) net.Buffers {
	if s.transport == transportSSE {
		return appendSSE(bufs, f)
	}
	return append(bufs, f.bytes)
}

// writeNow writes f at once, bounded by the write timeout: the close of a
// socket that could not be registered.
func (s *socket) writeNow(f frame) {
	bufs := s.appendFrame(nil, f)
	_ = s.conn.SetWriteDeadline(s.hub.deadline(s.hub.cfg.WriteTimeout))
	_, _ = bufs.WriteTo(s.conn)
}

// offer takes a live frame from the reader: held while the socket resumes,
// dropped when its place in the stream was sent already, or a catch-up from
// Postgres will send it.
func (s *socket) offer(f frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	if s.resuming {
		// Held frames are bounded as the queue is, by frames and by bytes:
		// a user's burst of large frames during a long resume must not
		// hold more than QueueBytes.
		full := func() bool {
			return len(s.held) >= s.hub.cfg.QueueFrames || s.heldSize+s.size(f) > s.hub.cfg.QueueBytes && len(s.held) > 0
		}
		if full() {
			s.fallBehindLocked()
			if full() {
				s.tooSlowLocked() // unpositioned frames alone fill it
				return
			}
		}
		s.held = append(s.held, f)
		s.heldSize += s.size(f)
		return
	}
	s.queueLiveLocked(f)
}

func (s *socket) queueLiveLocked(f frame) {
	if f.kind.positioned() {
		if !s.last.Less(f.pos) || s.behind {
			return // sent by the resume already, or the catch-up sends it
		}
		if len(s.queue) >= s.hub.cfg.QueueFrames || s.queued+s.size(f) > s.hub.cfg.QueueBytes && len(s.queue) > 0 {
			// A burst larger than the queue: the socket catches up from
			// Postgres once what is queued is written, at the pace it
			// reads. Only a peer that stops reading is closed (the
			// writer's timeout).
			s.behind = true
			s.hub.metrics.catchUps.Inc()
			return
		}
		s.last, s.lastAt = f.pos, f.createdAt
		if chaosplant.Plant(chaosplant.DropFrame) {
			return // a planted defect (chaos self-check builds only): lost as if sent
		}
	}
	s.enqueueLocked(f)
}

// fallBehindLocked drops the held frames of the stream: a catch-up after
// the resume reads them from Postgres.
func (s *socket) fallBehindLocked() {
	kept, size := s.held[:0], 0
	for _, f := range s.held {
		if !f.kind.positioned() {
			kept, size = append(kept, f), size+s.size(f)
		}
	}
	s.held, s.heldSize = kept, size
	if !s.behind {
		s.behind = true
		s.hub.metrics.catchUps.Inc()
	}
}

// enqueue queues a frame outside the resume's order: pings and pongs.
func (s *socket) enqueue(f frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing {
		s.enqueueLocked(f)
	}
}

func (s *socket) enqueueLocked(f frame) {
	// Pings and pongs may pass a queue that a burst filled: a socket is too
	// slow only when its peer stops reading (the writer's timeout).
	spare := 0
	if f.kind == kindPing || f.kind == kindPong {
		spare = 16
	}
	if len(s.queue) >= s.hub.cfg.QueueFrames+spare || s.queued+s.size(f) > s.hub.cfg.QueueBytes+spare*256 && len(s.queue) > 0 {
		s.tooSlowLocked()
		return
	}
	s.queue = append(s.queue, f)
	s.queued += s.size(f)
	s.startWriterLocked()
}

// isClosing reports whether the socket is closing: a resume for it reads
// nothing more.
func (s *socket) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// resumed queues a resumed frame of the stream, waiting while the queue is over
// half full so that a long resume never overflows it. False once the socket
// is closing or ctx ends.
func (s *socket) resumed(ctx context.Context, f frame) bool {
	for {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return false
		}
		if len(s.queue) < s.hub.cfg.QueueFrames/2 && s.queued < s.hub.cfg.QueueBytes/2 {
			s.last, s.lastAt = f.pos, f.createdAt
			s.queue = append(s.queue, f)
			s.queued += s.size(f)
			s.startWriterLocked()
			s.mu.Unlock()
			return true
		}
		s.mu.Unlock()
		t := s.hub.cfg.Clock.NewTimer(s.hub.cfg.WriteTimeout)
		select {
		case <-s.room:
		case <-t.C():
			// The writer is stuck: its own timeout closes the socket.
		case <-ctx.Done():
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// endResume sends ready with the cursor the resume ended at (none after a
// catch-up), then the live frames held meanwhile that come after it.
func (s *socket) endResume(end Cursor) {
	var ready frame
	var err error
	s.mu.Lock()
	catchUp := s.catching
	s.mu.Unlock()
	if !catchUp {
		cursor := end.String()
		ready, err = textFrame(kindReady, readyMessage{Type: "ready", Cursor: cursor}, cursor)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	if err != nil {
		s.closeLocked(ws.StatusInternalServerError, "try again")
		return
	}
	s.resuming, s.catching = false, false
	if s.last.Less(end.Position) {
		s.last, s.lastAt = end.Position, end.At
	}
	if !catchUp {
		s.enqueueLocked(ready)
	}
	held := s.held
	s.held, s.heldSize = nil, 0
	for _, f := range held {
		if s.closing {
			return
		}
		s.queueLiveLocked(f)
	}
}

func (s *socket) tooSlowLocked() {
	s.countSlowLocked()
	s.closeLocked(StatusTryAgainLater, "too slow; reconnect with your last cursor")
}

// countSlowLocked counts the socket as closed for slowness, once.
func (s *socket) countSlowLocked() {
	if !s.slow {
		s.slow = true
		s.hub.metrics.slowClosed.Inc()
	}
}

// close sends a close frame after what is being written and then closes the
// connection.
func (s *socket) close(code ws.StatusCode, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(code, reason)
}

func (s *socket) closeLocked(code ws.StatusCode, reason string) {
	if s.closing {
		return
	}
	s.closing, s.held, s.heldSize = true, nil, 0
	// What waits is dropped: the app resumes from the last frame it got.
	f := closeFrame(code, reason)
	s.queue, s.queued = []frame{f}, s.size(f)
	s.startWriterLocked()
}

func (s *socket) startWriterLocked() {
	if s.writing || s.gone {
		return
	}
	s.writing = true
	go s.write()
}

// write writes what is queued, a batch at a time in one system call, until
// the queue is empty; after a close frame it closes the connection.
func (s *socket) write() {
	var bufs net.Buffers
	for {
		s.mu.Lock()
		batch := s.queue
		s.queue, s.queued = nil, 0
		if len(batch) == 0 {
			s.writing = false
			catchUp := s.behind && !s.resuming && !s.closing
			if catchUp {
				s.behind, s.resuming, s.catching = false, true, true
			}
			from := Cursor{Position: s.last, At: s.lastAt}
			s.mu.Unlock()
			if catchUp {
				s.hub.catchUp(s, from)
			}
			return
		}
		s.mu.Unlock()
		select {
		case s.room <- struct{}{}:
		default:
		}
		bufs = bufs[:0]
		closed := false
		for _, f := range batch {
			bufs = s.appendFrame(bufs, f)
			closed = closed || f.kind == kindClose
		}
		_ = s.conn.SetWriteDeadline(s.hub.deadline(s.hub.cfg.WriteTimeout))
		_, err := bufs.WriteTo(s.conn)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				s.mu.Lock()
				if !s.closing || s.slow {
					s.countSlowLocked()
				}
				s.mu.Unlock()
			}
			s.drop()
			return
		}
		now := s.hub.cfg.Clock.Now()
		for _, f := range batch {
			if f.kind.positioned() || f.kind == kindReady {
				s.hub.metrics.frames.WithLabelValues(f.kind.label()).Inc()
			}
			if !f.at.IsZero() {
				s.hub.metrics.lag.Observe(now.Sub(f.at).Seconds())
			}
		}
		if closed {
			s.drop()
			return
		}
	}
}

// drop closes the connection at once and unregisters the socket.
func (s *socket) drop() {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return
	}
	s.gone, s.closing, s.queue, s.held, s.heldSize = true, true, nil, nil, 0
	s.mu.Unlock()
	_ = s.conn.Close()
	s.hub.remove(s)
}

// read reads what the client sends: pongs and pings keep the socket alive, a
// close frame closes it, an app's {"type":"ping"} is answered
// {"type":"pong"}, a seen message (one text frame) moves the user's seen
// position, anything else is discarded. A client silent for two
// ping intervals is gone. buffered holds bytes the handshake read ahead.
func (s *socket) read(buffered []byte) {
	closing := false // a close frame is queued: the writer closes the connection after it
	defer func() {
		if !closing {
			s.drop()
		}
	}()
	var r io.Reader = s.conn
	if len(buffered) > 0 {
		r = io.MultiReader(bytes.NewReader(buffered), s.conn)
	}
	var payload [125]byte
	for {
		_ = s.conn.SetReadDeadline(s.hub.deadline(2 * s.hub.cfg.PingInterval))
		h, err := ws.ReadHeader(r)
		if err != nil {
			return
		}
		if !h.Masked || h.Length > maxClientFrame || h.OpCode.IsControl() && h.Length > int64(len(payload)) {
			s.close(ws.StatusProtocolError, "unexpected frame")
			closing = true
			return
		}
		if !h.OpCode.IsControl() {
			if h.OpCode != ws.OpText || !h.Fin {
				if _, err := io.CopyN(io.Discard, r, h.Length); err != nil {
					return
				}
				continue
			}
			msg := make([]byte, h.Length) // at most maxClientFrame
			if _, err := io.ReadFull(r, msg); err != nil {
				return
			}
			ws.Cipher(msg, h.Mask, 0)
			switch {
			case isAppPing(msg):
				s.enqueue(appPong)
			default:
				s.hub.clientMessage(s.user, msg)
			}
			continue
		}
		p := payload[:h.Length]
		if _, err := io.ReadFull(r, p); err != nil {
			return
		}
		ws.Cipher(p, h.Mask, 0)
		switch h.OpCode {
		case ws.OpPing:
			s.enqueue(frame{kind: kindPong, bytes: wsFrame(ws.OpPong, p)})
		case ws.OpClose:
			s.close(ws.StatusNormalClosure, "")
			closing = true
			return
		}
	}
}

// readSSE waits for the client of an event stream to close its connection.
// The client sends nothing after its request: bytes it sends anyway are read
// and dropped, and past maxClientFrame of them the stream is dropped. There
// is no read deadline: a client that is gone is found by a write failing or
// timing out (a ping each interval), since an event stream has no pong.
func (s *socket) readSSE(buffered int) {
	defer s.drop()
	_ = s.conn.SetReadDeadline(time.Time{})
	var buf [512]byte
	for n := buffered; n <= maxClientFrame; {
		m, err := s.conn.Read(buf[:])
		if err != nil {
			return
		}
		n += m
	}
}
