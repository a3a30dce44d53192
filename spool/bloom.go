package spool

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// keyFilter answers, without reading the key index file, that a key was
// never merged: Bloom filters over the merged keys' hashes, one per segment of
// seqs, 16 bits per key (a false "maybe" for about 1 key in 2,000 per
// segment, which then costs a lookup in the file). A segment is dropped once
// the pruner has deleted every row at or below its highest seq, so the
// filters hold about 2 bytes per kept key.
type keyFilter struct {
	mu       sync.Mutex                 // adds and drops; lookups take no lock
	segments atomic.Pointer[[]*segment] // oldest first; the last takes adds
}

type segment struct {
	words  []atomic.Uint64
	mask   uint64 // bits - 1
	keys   int    // added so far; writers only
	cap    int    // keys it takes before the next segment starts
	maxSeq atomic.Int64
}

const (
	bitsPerKey      = 16
	probes          = 8
	firstSegmentCap = 1 << 16
	maxSegmentCap   = 1 << 20
)

func newSegment(capacity int) *segment {
	nbits := uint64(1) << bits.Len64(uint64(max(capacity, 64)*bitsPerKey-1))
	return &segment{words: make([]atomic.Uint64, nbits/64), mask: nbits - 1, cap: capacity}
}

// positions derives the probes from the 64-bit hash (double hashing).
func (s *segment) probe(h uint64, i uint64) (word int, bit uint64) {
	h2 := h>>32 | h<<32 | 1
	p := (h + i*h2) & s.mask
	return int(p / 64), 1 << (p % 64)
}

func (s *segment) add(h uint64) {
	for i := range uint64(probes) {
		w, b := s.probe(h, i)
		s.words[w].Or(b)
	}
	s.keys++
}

func (s *segment) has(h uint64) bool {
	for i := range uint64(probes) {
		w, b := s.probe(h, i)
		if s.words[w].Load()&b == 0 {
			return false
		}
	}
	return true
}

func newKeyFilter() *keyFilter {
	f := &keyFilter{}
	f.segments.Store(&[]*segment{})
	return f
}

// mayHave is false only for a hash never added.
func (f *keyFilter) mayHave(hash int64) bool {
	for _, s := range *f.segments.Load() {
		if s.has(uint64(hash)) {
			return true
		}
	}
	return false
}

// add records merged hashes, the highest of whose seqs is maxSeq. It is
// called before the keys are forgotten by the writer, so a lookup that misses
// the writer's recent keys finds them here.
func (f *keyFilter) add(hashes []int64, maxSeq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range hashes {
		segs := *f.segments.Load()
		if len(segs) == 0 || segs[len(segs)-1].keys >= segs[len(segs)-1].cap {
			next := firstSegmentCap
			if len(segs) > 0 {
				next = min(2*segs[len(segs)-1].cap, maxSegmentCap)
			}
			grown := append(append(make([]*segment, 0, len(segs)+1), segs...), newSegment(next))
			f.segments.Store(&grown)
			segs = grown
		}
		last := segs[len(segs)-1]
		last.add(uint64(h))
		last.maxSeq.Store(max(last.maxSeq.Load(), maxSeq))
	}
}

// dropBelow drops the segments whose every seq is below minSeq (the oldest
// row the spool still holds), but never the one taking adds.
func (f *keyFilter) dropBelow(minSeq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	segs := *f.segments.Load()
	n := 0
	for n < len(segs)-1 && segs[n].maxSeq.Load() < minSeq {
		n++
	}
	if n > 0 {
		kept := append([]*segment(nil), segs[n:]...)
		f.segments.Store(&kept)
	}
}

// bytes is the filters' memory.
func (f *keyFilter) bytes() int64 {
	var n int64
	for _, s := range *f.segments.Load() {
		n += int64(len(s.words)) * 8
	}
	return n
}
