package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
	"github.com/idemkit/idem/redisstore"
)

// The scale benchmarks measure the store under load and with many
// records, each against PING in the same run:
//
//	go test -run '^$' -bench 'Throughput|Scale' -benchmem -benchtime 1s -count 3 ./redisstore/
//
// BenchmarkThroughput: 64 goroutines at once (SetParallelism(64 /
// GOMAXPROCS)), each operation Acquire on a new key then Complete, against
// 64 goroutines sending PING; the client's pool holds 64 connections.
//
// BenchmarkScale: Acquire on a new key, a replay of a random completed
// key, and a replay of a recent one (among the last recentKeys written:
// retries come seconds after the first request), with 10 thousand and
// 100 thousand completed records under the store's prefix. The records
// are written through the store's own Acquire and Complete (32
// goroutines), not by mimicking its encoding, which is why the larger
// size is 100 thousand and not a million; -short skips it.

// recentKeys is how many of the last completed records BenchmarkScale's
// replay-recent picks from.
const recentKeys = 1000

var scaleResp = idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 256)}

func scaleReq(key string) idem.AcquireRequest {
	return idem.AcquireRequest{Scope: "bench", Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
}

// acquireComplete acquires the new key and completes it with scaleResp.
func acquireComplete(ctx context.Context, s *redisstore.Store, key string) error {
	res, err := s.Acquire(ctx, scaleReq(key))
	if err != nil {
		return err
	}
	if res.Outcome != idem.Acquired {
		return fmt.Errorf("acquire %q: outcome %v", key, res.Outcome)
	}
	return s.Complete(ctx, res.Lease, scaleResp, time.Hour)
}

func BenchmarkThroughput(b *testing.B) {
	c := singleClient(b)
	s := newStore(b, c, nil)
	b.Run("ping", func(b *testing.B) {
		throughput.Run(b, func(ctx context.Context, _ int64) error { return c.Ping(ctx).Err() })
	})
	b.Run("acquire-complete", func(b *testing.B) {
		throughput.Run(b, func(ctx context.Context, n int64) error {
			return acquireComplete(ctx, s, "t"+strconv.FormatInt(n, 10))
		})
	})
}

func BenchmarkScale(b *testing.B) {
	c := singleClient(b)
	s := newStore(b, c, nil)
	ctx := context.Background()
	filled := 0
	for _, size := range []struct {
		name string
		n    int
	}{{"records=10k", 10_000}, {"records=100k", 100_000}} {
		b.Run(size.name, func(b *testing.B) {
			if testing.Short() && size.n > 10_000 {
				b.Skip("-short: no 100 thousand records")
			}
			t0 := time.Now()
			fill(b, s, filled, size.n)
			b.Logf("filled %d records in %v", size.n-filled, time.Since(t0).Round(time.Millisecond))
			filled = size.n
			// One loop (benchpair), so that the ratios of one size
			// compare with those of the other.
			replay := func(key func() string) func() {
				return func() {
					res, err := s.Acquire(ctx, scaleReq(key()))
					if err != nil || res.Outcome != idem.Completed {
						b.Fatal(res.Outcome, err)
					}
				}
			}
			m := benchpair.Run(b,
				benchpair.Func{Name: "ping", F: func() {
					if err := c.Ping(ctx).Err(); err != nil {
						b.Fatal(err)
					}
				}},
				benchpair.Func{Name: "acquire-new", F: func() {
					res, err := s.Acquire(ctx, scaleReq("new"+strconv.FormatInt(throughput.Next(), 10)))
					if err != nil || res.Outcome != idem.Acquired {
						b.Fatal(res.Outcome, err)
					}
				}},
				benchpair.Func{Name: "replay", F: replay(func() string { return "k" + strconv.Itoa(rand.IntN(size.n)) })},
				// fill hands out its keys in order: "k<n-1>" is among the last.
				benchpair.Func{Name: "replay-recent", F: replay(func() string {
					return "k" + strconv.Itoa(size.n-1-rand.IntN(min(recentKeys, size.n)))
				})},
			)
			benchpair.Ratio(b, "acquire-x-ping", m[1], m[0])
			benchpair.Ratio(b, "replay-x-ping", m[2], m[0])
			benchpair.Ratio(b, "recent-x-ping", m[3], m[0])
		})
	}
}

// fill completes the records "k<from>" … "k<to-1>" of s on 32 goroutines.
func fill(b *testing.B, s *redisstore.Store, from, to int) {
	b.Helper()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next.Store(int64(from))
	for range 32 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(to) {
					return
				}
				if err := acquireComplete(context.Background(), s, "k"+strconv.FormatInt(i, 10)); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		b.Fatalf("fill: %v", first)
	}
}
