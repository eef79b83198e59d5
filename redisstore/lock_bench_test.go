package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/lock"
)

// BenchmarkLockVsRoundTrip measures an acquisition and release of a
// lock, interleaved in one loop (benchpair.Run) with the bare commands
// of the usual hand-made Redis lock, SET NX PX then DEL:
//
//   - backend: LockBackend.Acquire + Release (two scripts: EXISTS, INCR,
//     SET PX; GET, DEL);
//   - locker: Locker.TryAcquire + Lease.Release, the same two scripts
//     plus the lease's watchdog timer and contexts;
//   - bare: SET key owner NX PX 60000, then DEL (no owner check, no
//     fence).
//
// Ratios x-bare are the lock's cost in multiples of the bare pair.
//
//	go test -run '^$' -bench LockVsRoundTrip -benchtime 5000x -count 3 ./redisstore/
func BenchmarkLockVsRoundTrip(b *testing.B) {
	ctx := context.Background()
	c := singleClient(b)
	backend := newLockBackend(b, c)
	locker, err := lock.New(backend, &lock.Config{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	bareKey, _ := backend.LockKeys("bench-bare")
	bareKey += ":bare"
	m := benchpair.Run(b,
		benchpair.Func{Name: "backend", F: func() {
			o := lock.NewOwner()
			f, err := backend.Acquire(ctx, "bench-backend", o, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := backend.Release(ctx, "bench-backend", o, f); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "locker", F: func() {
			l, err := locker.TryAcquire(ctx, "bench-locker")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "bare", F: func() {
			ok, err := c.SetNX(ctx, bareKey, lock.NewOwner(), time.Minute).Result()
			if err != nil || !ok {
				b.Fatalf("SET NX: %v, %v", ok, err)
			}
			if err := c.Del(ctx, bareKey).Err(); err != nil {
				b.Fatal(err)
			}
		}},
	)
	benchpair.Ratio(b, "backend-x-bare", m[0], m[2])
	benchpair.Ratio(b, "locker-x-bare", m[1], m[2])
}
