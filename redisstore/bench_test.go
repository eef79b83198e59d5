package redisstore_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The benchmarks run against the single server; BenchmarkPing is the
// round trip the others cost at least.

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
