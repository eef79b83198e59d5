package redisstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/token"
)

// TestAcquireSentAgainAfterLostReply: go-redis sends a command again when
// its connection breaks before the reply (MaxRetries, 3 by default). An
// Acquire whose script ran but whose reply was lost then runs a second
// time; the second run finds the record the first wrote, under this
// call's own owner. The linearizability check under faults found that it
// answered InFlight (the caller's own lease, blocking the key until the
// lease ended) or took the key over a second time (fence + 1), and then
// that the answer lost TookOver. It must answer what the first run did.
func TestAcquireSentAgainAfterLostReply(t *testing.T) {
	p, c := resendingClient(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	const key, fp = "k", "fp-of-the-lost-reply"

	for _, tc := range []struct {
		name      string
		lease     time.Duration
		abandoned bool // a record whose lease ended is there first
		fence     int64
		took      bool
	}{
		{"new key", time.Minute, false, 1, false},
		{"lease ended before the second run", time.Millisecond, false, 1, false},
		{"takeover", time.Minute, true, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scope := "lost-reply-" + t.Name()
			if tc.abandoned {
				if _, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: time.Millisecond, Retention: time.Minute}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(5 * time.Millisecond) // the 1 ms lease has ended
			}
			var calls atomic.Int32
			// Lose the reply of the first script call with the fingerprint;
			// in the second case, let the lease end before the second run.
			p.DropResponsesIf(func(req []byte) bool {
				if !bytes.Contains(req, []byte(fp)) || calls.Add(1) != 1 {
					return false
				}
				if tc.lease == time.Millisecond {
					time.Sleep(5 * time.Millisecond)
				}
				return true
			})
			res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: tc.lease, Retention: time.Minute})
			p.DropResponsesIf(nil)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if calls.Load() < 2 {
				t.Fatalf("the reply was not lost and sent again (%d script calls)", calls.Load())
			}
			rec, err := s.Get(ctx, scope, key)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != idem.Acquired || res.Lease.Fence != tc.fence || res.TookOver != tc.took ||
				rec.Fence != tc.fence || rec.Owner != res.Lease.Owner {
				t.Errorf("Acquire sent again answered %v fence %d took over %v (want fence %d, took over %v); the record is fence %d of owner %q (lease owner %q)",
					res.Outcome, res.Lease.Fence, res.TookOver, tc.fence, tc.took, rec.Fence, rec.Owner, res.Lease.Owner)
			}
			if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201}, time.Minute); err != nil {
				t.Errorf("Complete with the lease: %v", err)
			}
		})
	}
}

// TestConsumeSentAgainAfterLostReply: a token spent by a Consume whose
// reply was lost, and sent again by go-redis, answered *UsedError with
// the call's own result ("spent before"), which tells the caller that
// another submission used the token. The second run must answer that
// this call spent it. Found by the linearizability check under faults.
func TestConsumeSentAgainAfterLostReply(t *testing.T) {
	p, c := resendingClient(t)
	s, err := redisstore.NewTokenStore(c, &redisstore.TokenConfig{Prefix: "idemtest-" + strings.ToLower(rand.Text()[:10])})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const scope, digest, result = "user-1", "d1ce5a1b2c3d4e5f", "order-of-the-lost-reply"
	if _, err := s.Insert(ctx, scope, digest, time.Minute); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	p.DropResponsesIf(func(req []byte) bool { return bytes.Contains(req, []byte(result)) && calls.Add(1) == 1 })
	err = s.Consume(ctx, scope, digest, token.Spend{Result: []byte(result), Keep: time.Minute})
	p.DropResponsesIf(nil)
	if calls.Load() < 2 {
		t.Fatalf("the reply was not lost and sent again (%d script calls)", calls.Load())
	}
	if err != nil {
		t.Fatalf("Consume sent again: %v, want nil (this call spent the token)", err)
	}
	// A second submission is told of the first use.
	var used *token.UsedError
	if err := s.Consume(ctx, scope, digest, token.Spend{Result: []byte("another"), Keep: time.Minute}); !errors.As(err, &used) || string(used.Result) != result {
		t.Fatalf("a second Consume: %v, want *UsedError with %q", err, result)
	}
}

// TestLockAcquireSentAgainAfterLostReply: a lock taken by an Acquire
// whose reply was lost, and sent again by go-redis, answered ErrHeld: the
// caller's own lock, which it then waited out for the whole TTL. The
// second run must answer the fence the first took. Found by the
// linearizability check under faults.
func TestLockAcquireSentAgainAfterLostReply(t *testing.T) {
	p, c := resendingClient(t)
	b, err := redisstore.NewLockBackend(c, &redisstore.LockConfig{Prefix: "idemtest-" + strings.ToLower(rand.Text()[:10])})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const owner = "owner-of-the-lost-reply"
	var calls atomic.Int32
	p.DropResponsesIf(func(req []byte) bool { return bytes.Contains(req, []byte(owner)) && calls.Add(1) == 1 })
	fence, err := b.Acquire(ctx, "job", owner, time.Minute)
	p.DropResponsesIf(nil)
	if calls.Load() < 2 {
		t.Fatalf("the reply was not lost and sent again (%d script calls)", calls.Load())
	}
	if err != nil || fence != 1 {
		t.Fatalf("Acquire sent again: fence %d, %v; want fence 1", fence, err)
	}
	if err := b.Release(ctx, "job", owner, fence); err != nil {
		t.Fatalf("Release with the fence: %v", err)
	}
}

// TestTokenInsertSentAgainAfterLostReply: a token stored by an Insert
// whose reply was lost, and sent again by go-redis, answered
// ErrDuplicate for the call's own token. Found by the linearizability
// check under faults.
func TestTokenInsertSentAgainAfterLostReply(t *testing.T) {
	p, c := resendingClient(t)
	s, err := redisstore.NewTokenStore(c, &redisstore.TokenConfig{Prefix: "idemtest-" + strings.ToLower(rand.Text()[:10])})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const digest = "d1ce5a1b2c3d4e5f-of-the-lost-reply"
	var calls atomic.Int32
	p.DropResponsesIf(func(req []byte) bool { return bytes.Contains(req, []byte(digest)) && calls.Add(1) == 1 })
	exp, err := s.Insert(ctx, "user-1", digest, time.Minute)
	p.DropResponsesIf(nil)
	if calls.Load() < 2 {
		t.Fatalf("the reply was not lost and sent again (%d script calls)", calls.Load())
	}
	if err != nil || time.Until(exp) < 50*time.Second {
		t.Fatalf("Insert sent again: expiry %v, %v; want the expiry its first run set", exp, err)
	}
	// Another insert of the digest is still a duplicate.
	if _, err := s.Insert(ctx, "user-1", digest, time.Minute); !errors.Is(err, token.ErrDuplicate) {
		t.Fatalf("a second Insert of the digest: %v, want ErrDuplicate", err)
	}
	if err := s.Consume(ctx, "user-1", digest, token.Spend{Keep: time.Minute}); err != nil {
		t.Fatalf("Consume: %v", err)
	}
}

// resendingClient returns a proxy to the Redis server and a go-redis
// client through it that sends a command again, at once, when its
// connection breaks before the reply (as go-redis does by default, with
// a longer backoff); both are closed when t ends.
func resendingClient(t *testing.T) (*netfault.Proxy, *redis.Client) {
	t.Helper()
	p, err := netfault.New(testenv.Redis.Need(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return p, c
}
