package redisstore_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/token"
	"github.com/idemkit/idem/token/tokentest"
)

// newTokenStore returns a TokenStore with a random prefix whose keys are
// deleted when t ends.
func newTokenStore(t testing.TB, c *redis.Client) (*redisstore.TokenStore, string) {
	t.Helper()
	prefix := randomPrefix()
	s, err := redisstore.NewTokenStore(c, &redisstore.TokenConfig{Prefix: prefix})
	if err != nil {
		t.Fatalf("NewTokenStore: %v", err)
	}
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	return s, prefix
}

func TestTokenConformance(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	s, _ := newTokenStore(t, c)
	tokentest.Run(t, func(*testing.T) token.Store { return s }, tokentest.Caps{ExpiresByItself: true, Precision: time.Millisecond})
}

// TestTokenConformanceCluster runs the suite on a Redis Cluster: a
// scope's token keys and its set share a slot, or the scripts would fail
// with CROSSSLOT.
func TestTokenConformanceCluster(t *testing.T) {
	t.Parallel()
	c := clusterClient(t)
	prefix := randomPrefix()
	s, err := redisstore.NewTokenStore(c, &redisstore.TokenConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	tokentest.Run(t, func(*testing.T) token.Store { return s }, tokentest.Caps{ExpiresByItself: true, Precision: time.Millisecond})
}

// tokenKey returns the Redis key of the token id of scope under prefix.
func tokenKey(t testing.TB, prefix, scope, id string) string {
	t.Helper()
	d, err := token.Digest(id)
	if err != nil {
		t.Fatal(err)
	}
	return prefix + ":token:{" + rediskey.ScopeTag(scope) + "}:" + d
}

// TestTokenRace: 100 goroutines consume one token, three times over:
// exactly one spends it, the 99 others are told it is used with the
// winner's result, and the hash holds the winner's result.
func TestTokenRace(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	s, prefix := newTokenStore(t, c)
	toks, err := token.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for round := range 3 {
		tok, err := toks.Issue(ctx, "user-1")
		if err != nil {
			t.Fatal(err)
		}
		const n = 100
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: fmt.Appendf(nil, "order-%d", i)})
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				if winner >= 0 {
					t.Fatalf("round %d: goroutines %d and %d both spent the token", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody spent the token: %v", round, errors.Join(errs...))
		}
		want := fmt.Sprintf("order-%d", winner)
		for i, err := range errs {
			var ue *token.UsedError
			if i != winner && (!errors.As(err, &ue) || string(ue.Result) != want) {
				t.Fatalf("round %d: goroutine %d: %v, want used with %q", round, i, err, want)
			}
		}
		h, err := c.HGetAll(ctx, tokenKey(t, prefix, "user-1", tok.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if h["s"] != "user-1" || h["r"] != want || h["u"] == "" {
			t.Fatalf("round %d: hash %v, want scope user-1, used, result %q", round, h, want)
		}
	}
}

// TestTokenTTL: the key's expiry is set by Insert, to the TokenStore's
// answer, and Consume moves it to the use + Keep; the raw ID is in no
// key; the scope's set holds the unused token only; Redis deletes the
// token when it ends.
func TestTokenTTL(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	s, prefix := newTokenStore(t, c)
	ctx := t.Context()
	toks, err := token.New(s, &token.Config{TTL: time.Second, Keep: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := toks.Issue(ctx, "user-1")
	if err != nil {
		t.Fatal(err)
	}
	key := tokenKey(t, prefix, "user-1", tok.ID)
	expireTime := func() int64 {
		t.Helper()
		ms, err := c.PExpireTime(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int64(ms / time.Millisecond)
	}
	before := expireTime()
	if before != tok.ExpiresAt.UnixMilli() {
		t.Fatalf("key expires at %d, Issue said %d", before, tok.ExpiresAt.UnixMilli())
	}
	set := prefix + ":tokens:{" + rediskey.ScopeTag("user-1") + "}:dXNlci0x"
	d, _ := token.Digest(tok.ID)
	if score, err := c.ZScore(ctx, set, d).Result(); err != nil || int64(score) != before {
		t.Fatalf("the scope's set scores the token %v, %v; want its expiry %d", score, err, before)
	}
	if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	h, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	usedAt, _ := strconv.ParseInt(h["u"], 10, 64)
	if after := expireTime(); after != usedAt+2000 || after <= before {
		t.Fatalf("Consume moved the expiry from %d to %d, want the use (%d) + Keep", before, after, usedAt)
	}
	if n, err := c.Exists(ctx, set).Result(); err != nil || n != 0 {
		t.Fatalf("the scope's set of unused tokens is still there after its only token was used: %d, %v", n, err)
	}
	if n, err := c.Exists(ctx, prefix+":token:"+tok.ID).Result(); err != nil || n != 0 {
		t.Fatalf("a key holds the raw ID: %d, %v", n, err)
	}
	if got := countPrefix(t, c, prefix); got != 1 {
		t.Fatalf("%d keys under the prefix, want 1", got)
	}
	time.Sleep(time.Until(time.UnixMilli(usedAt+2000)) + 200*time.Millisecond)
	if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the token's key is still there after its keep: %d, %v", n, err)
	}
	if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{}); !errors.Is(err, token.ErrInvalid) {
		t.Fatalf("Consume after the TTL = %v, want ErrInvalid", err)
	}
}

// TestTokenBesideStore: tokens share a prefix with a Store's records
// without meeting them: the Store's Sweep leaves tokens alone.
func TestTokenBesideStore(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	ts, prefix := newTokenStore(t, c)
	st, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := token.New(ts, &token.Config{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := toks.Issue(t.Context(), "u")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Sweep(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if err := toks.Consume(t.Context(), "u", tok.ID, token.Use{}); err != nil {
		t.Fatalf("Consume after the Store's Sweep = %v", err)
	}
}

func TestNewTokenStore(t *testing.T) {
	t.Parallel()
	if _, err := redisstore.NewTokenStore(nil, nil); err == nil {
		t.Error("NewTokenStore(nil) succeeded")
	}
	c := offlineClient(t)
	for _, p := range []string{"a{b", "a b", "x\n"} {
		if _, err := redisstore.NewTokenStore(c, &redisstore.TokenConfig{Prefix: p}); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
	s, err := redisstore.NewTokenStore(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	// An unreachable server: an error that is neither answer of the
	// contract.
	err = s.Consume(t.Context(), "u", fmt.Sprintf("%064x", 1), token.Spend{})
	if err == nil || errors.Is(err, token.ErrInvalid) || errors.Is(err, token.ErrUsed) {
		t.Fatalf("Consume on an unreachable server = %v", err)
	}
	if _, err := s.Insert(t.Context(), "u", fmt.Sprintf("%064x", 1), time.Minute); err == nil {
		t.Fatal("Insert on an unreachable server succeeded")
	}
}

// TestTokenExampleSteps runs ExampleNewTokenStore's steps against the test
// server.
func TestTokenExampleSteps(t *testing.T) {
	t.Parallel()
	s, _ := newTokenStore(t, singleClient(t))
	tokens, err := token.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	tok, err := tokens.Issue(ctx, "user-42")
	if err != nil {
		t.Fatal(err)
	}
	if err := tokens.Consume(ctx, "user-42", tok.ID, token.Use{Result: []byte("order-1001")}); err != nil {
		t.Fatal(err)
	}
	var used *token.UsedError
	if err := tokens.Consume(ctx, "user-42", tok.ID, token.Use{}); !errors.As(err, &used) || string(used.Result) != "order-1001" {
		t.Fatalf("second Consume = %v, want used with order-1001", err)
	}
}
