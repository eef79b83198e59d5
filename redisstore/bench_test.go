package redisstore_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
)

// The benchmarks run against the single server; BenchmarkPing is the
// round trip the others cost at least. BenchmarkVsRoundTrip measures
// each operation interleaved with PING in one loop, for a ratio that the
// drift of the round trip between runs does not swing.

func BenchmarkPing(b *testing.B) {
	c := singleClient(b)
	ctx := b.Context()
	for b.Loop() {
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireNew(b *testing.B) {
	s := newStore(b, singleClient(b), nil)
	ctx := b.Context()
	i := 0
	for b.Loop() {
		i++
		res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "bench", Key: strconv.Itoa(i), Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != idem.Acquired {
			b.Fatal(res.Outcome, err)
		}
	}
}

func BenchmarkComplete(b *testing.B) {
	s := newStore(b, singleClient(b), nil)
	ctx := b.Context()
	leases := make([]idem.Lease, b.N)
	for i := range leases {
		res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "bench", Key: strconv.Itoa(i), Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		leases[i] = res.Lease
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 256)}
	b.ResetTimer()
	for i := range b.N {
		if err := s.Complete(ctx, leases[i], resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := newStore(b, singleClient(b), nil)
	ctx := b.Context()
	req := idem.AcquireRequest{Scope: "bench", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	res, err := s.Acquire(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 256)}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		res, err := s.Acquire(ctx, req)
		if err != nil || res.Outcome != idem.Completed {
			b.Fatal(res.Outcome, err)
		}
	}
}

// BenchmarkVsRoundTrip measures the store's operations each interleaved
// with a PING on the same client, in one loop (benchpair.Run): the means
// of both as "<name>-ns" and their ratio as x-ping.
//
//   - replay: Acquire of a completed key;
//   - acquire-new: Acquire of a new key;
//   - complete: Complete of a lease acquired beforehand (untimed, 1024
//     at a time with the timer stopped).
//
// The benchmark's ns/op is the whole iteration, PING included.
//
//	go test -run '^$' -bench VsRoundTrip -benchtime 2000x -count 3 ./redisstore/
func BenchmarkVsRoundTrip(b *testing.B) {
	c := singleClient(b)
	s := newStore(b, c, nil)
	ctx := b.Context()
	ping := func(b *testing.B) benchpair.Func {
		return benchpair.Func{Name: "ping", F: func() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}}
	}
	req := func(key string) idem.AcquireRequest {
		return idem.AcquireRequest{Scope: "bench", Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 256)}
	acquire := func(b *testing.B, key string) idem.Lease {
		res, err := s.Acquire(ctx, req(key))
		if err != nil || res.Outcome != idem.Acquired {
			b.Fatal(res.Outcome, err)
		}
		return res.Lease
	}
	if err := s.Complete(ctx, acquire(b, "k"), resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	// replay: a replay next to PING and to Get, one HMGET of the
	// record (the floor of any answer that carries the record).
	b.Run("replay", func(b *testing.B) {
		m := benchpair.Run(b, ping(b),
			benchpair.Func{Name: "get", F: func() {
				rec, err := s.Get(ctx, "bench", "k")
				if err != nil || rec.Status != idem.StatusCompleted {
					b.Fatal(rec.Status, err)
				}
			}},
			benchpair.Func{Name: "replay", F: func() {
				res, err := s.Acquire(ctx, req("k"))
				if err != nil || res.Outcome != idem.Completed {
					b.Fatal(res.Outcome, err)
				}
			}})
		benchpair.Ratio(b, "x-ping", m[2], m[0])
		benchpair.Ratio(b, "get-x-ping", m[1], m[0])
		benchpair.Ratio(b, "x-get", m[2], m[1])
	})
	b.Run("acquire-new", func(b *testing.B) {
		var key string
		m := benchpair.Run(b, ping(b), benchpair.Func{
			Name:   "acquire",
			Before: func() { key = "new" + strconv.FormatInt(throughput.Next(), 10) },
			F:      func() { acquire(b, key) },
		})
		benchpair.Ratio(b, "x-ping", m[1], m[0])
	})
	b.Run("complete", func(b *testing.B) {
		leases := make([]idem.Lease, 0, 1024)
		var l idem.Lease
		m := benchpair.Run(b, ping(b), benchpair.Func{
			Name: "complete",
			Before: func() {
				if len(leases) == 0 {
					b.StopTimer()
					for range cap(leases) {
						leases = append(leases, acquire(b, "lease"+strconv.FormatInt(throughput.Next(), 10)))
					}
					b.StartTimer()
				}
				l, leases = leases[len(leases)-1], leases[:len(leases)-1]
			},
			F: func() {
				if err := s.Complete(ctx, l, resp, time.Hour); err != nil {
					b.Fatal(err)
				}
			},
		})
		benchpair.Ratio(b, "x-ping", m[1], m[0])
	})
}
