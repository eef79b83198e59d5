package redisstore_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testenv"
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
	p, err := netfault.New(testenv.Redis.Need(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
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
