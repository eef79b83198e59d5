package tieredtest_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
)

// BenchmarkReplay compares a replay (Acquire on a completed key) answered
// by Redis with one answered by the SQLite truth alone, and a Redis PING
// as the floor of any Redis round trip.
func BenchmarkReplay(b *testing.B) {
	c := redisClient(b)
	_, truth := newTruth(b)
	s := newTiered(b, c, c, truth, nil)
	ctx := b.Context()
	body := make([]byte, 256)
	res, err := s.Acquire(ctx, req("k", "fp"))
	if err != nil || res.Outcome != idem.Acquired {
		b.Fatal(res.Outcome, err)
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	for name, store := range map[string]idem.Store{"cache": s, "truth": truth} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := store.Acquire(ctx, req("k", "fp"))
				if err != nil || res.Outcome != idem.Completed {
					b.Fatal(res.Outcome, err)
				}
			}
		})
	}
	// Parallel: many request goroutines at once (GOMAXPROCS × 16). The
	// truth, on sqlite.Open's single connection, serves them one at a time.
	for name, store := range map[string]idem.Store{"cache-parallel": s, "truth-parallel": truth} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := store.Acquire(ctx, req("k", "fp"))
					if err != nil || res.Outcome != idem.Completed {
						b.Error(res.Outcome, err)
						return
					}
				}
			})
		})
	}
	b.Run("ping", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	if st := s.Stats(); st.Errors != 0 {
		b.Fatalf("stats %+v", st)
	}
}

// BenchmarkReplayUnderWrites measures replays while 4 goroutines acquire
// and complete new keys in the truth without pause: the truth's replays
// share its one SQLite connection with those writes (and their fsyncs);
// the cache's do not.
func BenchmarkReplayUnderWrites(b *testing.B) {
	c := redisClient(b)
	_, truth := newTruth(b)
	s := newTiered(b, c, c, truth, nil)
	ctx := b.Context()
	res, err := s.Acquire(ctx, req("k", "fp"))
	if err != nil || res.Outcome != idem.Acquired {
		b.Fatal(res.Outcome, err)
	}
	if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 200, Body: make([]byte, 256)}, time.Hour); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"cache", "truth"} {
		store := map[string]idem.Store{"cache": s, "truth": truth}[name]
		b.Run(name, func(b *testing.B) {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var writes atomic.Int64
			run := randomPrefix() // keys of their own for every run of the sub-benchmark
			for w := range 4 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						res, err := truth.Acquire(ctx, req(fmt.Sprintf("%s-%d-%d", run, w, i), "fp"))
						if err != nil {
							b.Error(err)
							return
						}
						if err := truth.Complete(ctx, res.Lease, idem.Response{StatusCode: 200}, time.Hour); err != nil {
							b.Error(err)
							return
						}
						writes.Add(1)
					}
				})
			}
			// No ReportAllocs: the writers' allocations would count too.
			b.ResetTimer()
			for b.Loop() {
				res, err := store.Acquire(ctx, req("k", "fp"))
				if err != nil || res.Outcome != idem.Completed {
					b.Fatal(res.Outcome, err)
				}
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(writes.Load())/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// BenchmarkVsRoundTrip measures, in one loop (benchpair), a replay answered
// by the cache and the same replay answered by a PostgreSQL truth alone,
// next to a Redis PING and a prepared SELECT 1 on that PostgreSQL:
//
//	go test -run '^$' -bench VsRoundTrip -benchmem -benchtime 3000x -count 5 ./cmd/internal/tieredtest/
func BenchmarkVsRoundTrip(b *testing.B) {
	c := redisClient(b)
	db, truth := postgresTruth(b)
	s := newTiered(b, c, c, truth, nil)
	ctx := b.Context()
	r := idem.AcquireRequest{Scope: "bench-" + randomPrefix(), Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	b.Cleanup(func() { _ = truth.Delete(context.Background(), r.Scope, r.Key) })
	res, err := s.Acquire(ctx, r)
	if err != nil || res.Outcome != idem.Acquired {
		b.Fatal(res.Outcome, err)
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ord_123","amount":4200,"currency":"EUR"}`)}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	sel, err := db.PrepareContext(ctx, "SELECT 1")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sel.Close() })
	replay := func(store idem.Store) func() {
		return func() {
			res, err := store.Acquire(ctx, r)
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
		benchpair.Func{Name: "select1", F: func() {
			var one int
			if err := sel.QueryRowContext(ctx).Scan(&one); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "cache", F: replay(s)},
		benchpair.Func{Name: "truth", F: replay(truth)},
	)
	benchpair.Ratio(b, "cache-x-ping", m[2], m[0])
	benchpair.Ratio(b, "truth-x-select1", m[3], m[1])
	if st := s.Stats(); st.Errors != 0 || st.Misses != 1 {
		b.Fatalf("stats %+v: want every replay answered by the cache", st)
	}
}
