package redisstore_test

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/token"
)

// TestTokenScopeTagCollision: two scopes whose 64-bit tags meet (a
// birthday among some 2^32 scopes: a few billion users) share a slot, and
// their tokens' keys the same {TAG}. Neither trims the other's tokens, nor
// counts them among its own. The colliding scope's token is written as
// Insert would write it if ScopeTag("b") were ScopeTag("a"): its hash (s:
// b) at a token key of a's tag, and its member in the set of its scope —
// the layout Insert uses (rediskey.Tokens).
func TestTokenScopeTagCollision(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	s, prefix := newTokenStore(t, c)
	ctx := t.Context()
	a := make([]string, 3)
	for i := range a {
		a[i] = newDigestT(t)
		if _, err := s.Insert(ctx, "a", a[i], time.Hour+time.Duration(i)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// b's token: a's tag, b's scope, the latest expiry.
	bd := newDigestT(t)
	bkey := rediskey.Token(prefix, "a", bd)
	exp := time.Now().Add(2 * time.Hour).UnixMilli()
	bset := collidingSet(prefix, "a", "b")
	if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, bkey, "s", "b")
		p.PExpireAt(ctx, bkey, time.UnixMilli(exp))
		p.ZAdd(ctx, bset, redis.Z{Score: float64(exp), Member: bd})
		p.PExpireAt(ctx, bset, time.UnixMilli(exp))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Trim(a, 3) keeps a's three tokens: b's does not count among them.
	if n, err := s.Trim(ctx, "a", 3); err != nil || n != 0 {
		t.Fatalf("Trim(a, 3) of a's 3 tokens = %d, %v; want 0 (b's token is not a's)", n, err)
	}
	// Trim(a, 0) removes a's three, and leaves b's.
	if n, err := s.Trim(ctx, "a", 0); err != nil || n != 3 {
		t.Fatalf("Trim(a, 0) = %d, %v; want a's 3", n, err)
	}
	if got, err := c.HGet(ctx, bkey, "s").Result(); err != nil || got != "b" {
		t.Fatalf("b's token after a's trims: %q, %v; want it kept", got, err)
	}
	if n, err := c.ZCard(ctx, bset).Result(); err != nil || n != 1 {
		t.Fatalf("b's set after a's trims has %d members, %v; want 1", n, err)
	}
	for _, d := range a {
		if err := s.Consume(ctx, "a", d, token.Spend{}); err != token.ErrInvalid {
			t.Fatalf("a trimmed token of a: %v, want ErrInvalid", err)
		}
	}
	// a's Consume of b's token (a's tag, b's digest) is not a use.
	if err := s.Consume(ctx, "a", bd, token.Spend{}); err != token.ErrInvalid {
		t.Fatalf("Consume(a) of b's token = %v, want ErrInvalid", err)
	}
}

// collidingSet is the key of the set of scope's unused tokens as it
// would be if scope's tag were that of other.
func collidingSet(prefix, other, scope string) string {
	return strings.Replace(rediskey.Tokens(prefix, scope), "{"+rediskey.ScopeTag(scope)+"}", "{"+rediskey.ScopeTag(other)+"}", 1)
}

// newDigestT returns a random digest.
func newDigestT(t *testing.T) string {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
