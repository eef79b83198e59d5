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
// lease ended) or took the key over a second time (fence 2). It must
// answer Acquired with the lease the first run wrote.
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

	for _, lease := range []time.Duration{time.Minute, time.Millisecond} {
		scope := "lost-reply-" + lease.String() + "-" + t.Name()
		var lost atomic.Int32
		// Lose the reply of the first script call that names the key.
		p.DropResponsesIf(func(req []byte) bool {
			return bytes.Contains(req, []byte(fp)) && lost.Add(1) == 1
		})
		if lease == time.Millisecond {
			// The second run comes after the lease ended: still ours.
			p.DropResponsesIf(func(req []byte) bool {
				if bytes.Contains(req, []byte(fp)) && lost.Add(1) == 1 {
					time.Sleep(5 * time.Millisecond)
					return true
				}
				return false
			})
		}
		res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: lease, Retention: time.Minute})
		p.DropResponsesIf(nil)
		if err != nil {
			t.Fatalf("lease %v: Acquire: %v", lease, err)
		}
		if lost.Load() < 2 {
			t.Fatalf("lease %v: the reply was not lost and sent again (%d script calls)", lease, lost.Load())
		}
		rec, err := s.Get(ctx, scope, key)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != idem.Acquired || res.Lease.Fence != 1 || rec.Fence != 1 || rec.Owner != res.Lease.Owner {
			t.Errorf("lease %v: Acquire sent again answered %v fence %d; the record is fence %d of owner %q (lease owner %q)",
				lease, res.Outcome, res.Lease.Fence, rec.Fence, rec.Owner, res.Lease.Owner)
		}
		if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201}, time.Minute); err != nil {
			t.Errorf("lease %v: Complete with the lease: %v", lease, err)
		}
	}
}
