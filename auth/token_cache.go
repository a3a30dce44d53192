package auth

import (
	"context"
	"crypto"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/jwkset"
)

// DefaultCachedTokens is how many verified user tokens a verifier keeps by
// default: one an active user's every request presents, for a replica's
// active users, at about 200 bytes each.
const DefaultCachedTokens = 10_000

// tokenCache keeps verified user tokens by the SHA-256 of the token, so
// that a client's next request with the same token costs a hash and a map
// lookup instead of a signature check (an ES256 verify alone took 113 µs of
// the ~830 µs a feed page cost). It never holds a refusal, nor the token
// itself. An entry answers only within its token's validity (nbf, iat, exp
// with the leeway, on the verifier's clock) and while the key set that
// verified it holds the same keys (keySet.generation). Full, it forgets
// the entry put first: O(1), and tokens of one issuer, which share a
// lifetime, then go roughly in the order they expire.
type tokenCache struct {
	max int

	mu      sync.RWMutex
	entries map[[32]byte]cachedToken
	order   [][32]byte // keys in the order they were put; order[next] goes first once full
	next    int

	hits, misses atomic.Uint64
}

// cachedToken is a verified token's user and when it may answer.
type cachedToken struct {
	user       User // shared by every hit: read only
	notBefore  time.Time
	notAfter   time.Time
	generation uint64 // of the key set that verified it
}

func newTokenCache(max int) *tokenCache {
	return &tokenCache{max: max, entries: make(map[[32]byte]cachedToken, min(max, 1024))}
}

// get returns the user of a token verified before, if it may answer at now
// under the key set's current generation.
func (c *tokenCache) get(key [32]byte, now time.Time, generation uint64) (User, bool) {
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if !ok || e.generation != generation || now.Before(e.notBefore) || !now.Before(e.notAfter) {
		c.misses.Add(1)
		return User{}, false
	}
	c.hits.Add(1)
	return e.user, true
}

// put keeps a verified token. A token put again (verified by two requests
// at once, or again once stale) keeps its place in the order.
func (c *tokenCache) put(key [32]byte, e cachedToken) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; ok {
		c.entries[key] = e
		return
	}
	if len(c.order) < c.max {
		c.order = append(c.order, key)
	} else {
		delete(c.entries, c.order[c.next])
		c.order[c.next] = key
		c.next = (c.next + 1) % c.max
	}
	c.entries[key] = e
}

func (c *tokenCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// keySet is the verifier's copy of the issuer's JWKS: jwkset's in-memory
// storage, with a generation that moves whenever a refresh drops a key or
// changes one (its material, alg or use). Cached tokens carry the
// generation they were verified under, so a key the issuer stops
// publishing stops every token it verified at once, without a key lookup
// per request. A key added (the next one of a rotation) moves nothing.
type keySet struct {
	*jwkset.MemoryJWKSet
	generation atomic.Uint64
}

var _ jwkset.Storage = (*keySet)(nil)

func newKeySet() *keySet { return &keySet{MemoryJWKSet: jwkset.NewMemoryStorage()} }

// KeyReplaceAll is what each fetch of the JWKS calls. The generation moves
// before the keys change, so that no cached token verified by a dropped key
// answers from then on, and again after, so that none verified meanwhile
// by the old keys is kept under the new generation.
func (s *keySet) KeyReplaceAll(ctx context.Context, given []jwkset.JWK) error {
	old, err := s.MemoryJWKSet.KeyReadAll(ctx)
	if err != nil {
		return err
	}
	if !keepsEvery(old, given) {
		s.generation.Add(1)
		defer s.generation.Add(1)
	}
	return s.MemoryJWKSet.KeyReplaceAll(ctx, given)
}

// KeyDelete drops a key, and with it the tokens it verified.
func (s *keySet) KeyDelete(ctx context.Context, keyID string) (bool, error) {
	s.generation.Add(1)
	defer s.generation.Add(1)
	return s.MemoryJWKSet.KeyDelete(ctx, keyID)
}

// KeyWrite adds or replaces a key; a replaced one stops the tokens it verified.
func (s *keySet) KeyWrite(ctx context.Context, jwk jwkset.JWK) error {
	s.generation.Add(1)
	defer s.generation.Add(1)
	return s.MemoryJWKSet.KeyWrite(ctx, jwk)
}

// keepsEvery reports whether every key of old is in given, unchanged.
func keepsEvery(old, given []jwkset.JWK) bool {
	for _, o := range old {
		kept := false
		for _, g := range given {
			if sameKey(o, g) {
				kept = true
				break
			}
		}
		if !kept {
			return false
		}
	}
	return true
}

func sameKey(a, b jwkset.JWK) bool {
	am, bm := a.Marshal(), b.Marshal()
	if am.KID != bm.KID || am.ALG != bm.ALG || am.USE != bm.USE {
		return false
	}
	k, ok := a.Key().(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b.Key())
}
