package push

import "sync"

// shares bound what one key — a push service origin, a user — may hold of
// a pool of sends: how many it has started or waiting, and how many are in
// flight. A key is kept only while it has sends.
type shares struct {
	waiting  int // the most one key may have started or waiting
	inFlight int // the most one key may have in flight

	mu    sync.Mutex
	byKey map[string]*share
}

// share is one key's sends: count started or waiting, slots in flight.
type share struct {
	key   string
	count int
	slots chan struct{}
}

func newShares(waiting, inFlight int) *shares {
	return &shares{waiting: max(1, waiting), inFlight: max(1, inFlight), byKey: map[string]*share{}}
}

// take counts one more send for key, unless it has its share started or
// waiting already (nil then). leave gives it back.
func (s *shares) take(key string) *share {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.byKey[key]
	if sh == nil {
		sh = &share{key: key, slots: make(chan struct{}, s.inFlight)}
		s.byKey[key] = sh
	}
	if sh.count >= s.waiting {
		return nil
	}
	sh.count++
	return sh
}

func (s *shares) leave(sh *share) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh.count--; sh.count == 0 {
		delete(s.byKey, sh.key)
	}
}
