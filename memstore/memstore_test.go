package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) idem.Store { return memstore.New(nil) }, storetest.Caps{})
}

func TestConformanceShared(t *testing.T) {
	// One store for every case, as a store on a real server is.
	t.Parallel()
	s := memstore.New(nil)
	storetest.Run(t, func(t *testing.T) idem.Store { return s }, storetest.Caps{})
}

// clock is a fake store clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newClocked(t *testing.T) (*memstore.Store, *clock) {
	t.Helper()
	c := &clock{now: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)}
	return memstore.New(&memstore.Config{Now: c.Now}), c
}

// TestBoundaries pins the exact instants on the store's clock: a lease
// ends at LeaseUntil, a record expires at ExpiresAt.
func TestBoundaries(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, c := newClocked(t)
	start := c.Now()
	req := idem.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: 10 * time.Second, Retention: time.Minute}

	res, err := s.Acquire(ctx, req)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	if !res.Lease.Until.Equal(start.Add(10 * time.Second)) {
		t.Fatalf("Until = %v, want start + 10s", res.Lease.Until)
	}
	rec, _ := s.Get(ctx, "", "k")
	if !rec.CreatedAt.Equal(start) || !rec.ExpiresAt.Equal(start.Add(10*time.Second+time.Minute)) {
		t.Fatalf("record = %+v", rec)
	}

	c.Advance(10*time.Second - 1)
	if res, _ := s.Acquire(ctx, req); res.Outcome != idem.InFlight {
		t.Fatalf("1ns before the lease's end: %v, want in flight", res.Outcome)
	}
	c.Advance(1)
	res2, _ := s.Acquire(ctx, req)
	if res2.Outcome != idem.Acquired || !res2.TookOver || res2.Lease.Fence != 2 {
		t.Fatalf("at the lease's end: %v took over %v fence %d, want a takeover", res2.Outcome, res2.TookOver, res2.Lease.Fence)
	}
	rec, _ = s.Get(ctx, "", "k")
	if !rec.CreatedAt.Equal(start) {
		t.Errorf("a takeover changed CreatedAt to %v", rec.CreatedAt)
	}

	if err := s.Complete(ctx, res2.Lease, idem.Response{StatusCode: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	completedAt := c.Now()
	rec, _ = s.Get(ctx, "", "k")
	if !rec.CompletedAt.Equal(completedAt) || !rec.ExpiresAt.Equal(completedAt.Add(time.Hour)) || rec.Retention != time.Hour {
		t.Fatalf("completed record = %+v", rec)
	}

	c.Advance(time.Hour - 1)
	if n, _ := s.Sweep(ctx, 0); n != 0 {
		t.Fatalf("Sweep 1ns before ExpiresAt removed %d", n)
	}
	if res, _ := s.Acquire(ctx, req); res.Outcome != idem.Completed {
		t.Fatalf("1ns before ExpiresAt: %v, want completed", res.Outcome)
	}
	c.Advance(1)
	res3, _ := s.Acquire(ctx, idem.AcquireRequest{Key: "k", Fingerprint: "new", Lease: time.Second, Retention: time.Second})
	if res3.Outcome != idem.Acquired || res3.TookOver || res3.Lease.Fence != 3 {
		t.Fatalf("at ExpiresAt: %v took over %v fence %d, want a replacement with fence 3", res3.Outcome, res3.TookOver, res3.Lease.Fence)
	}
	rec, _ = s.Get(ctx, "", "k")
	if !rec.CreatedAt.Equal(c.Now()) || rec.Fingerprint != "new" || rec.Response != nil || !rec.CompletedAt.IsZero() {
		t.Fatalf("replacing record = %+v", rec)
	}

	// An abandoned record is swept exactly at LeaseUntil + Retention.
	c.Advance(2*time.Second - 1)
	if n, _ := s.Sweep(ctx, 0); n != 0 {
		t.Fatalf("Sweep before the abandoned record's ExpiresAt removed %d", n)
	}
	c.Advance(1)
	if n, _ := s.Sweep(ctx, 0); n != 1 {
		t.Fatalf("Sweep at the abandoned record's ExpiresAt removed %d, want 1", n)
	}
	if _, err := s.Get(ctx, "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after Sweep = %v", err)
	}
}

func TestSweepLimit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, c := newClocked(t)
	for i := range 2500 {
		res, _ := s.Acquire(ctx, idem.AcquireRequest{Key: fmt.Sprint(i), Lease: time.Second, Retention: time.Second})
		if i%2 == 0 {
			_ = s.Complete(ctx, res.Lease, idem.Response{}, time.Second)
		}
	}
	c.Advance(2 * time.Second)
	for _, want := range []int{idem.DefaultSweepLimit, idem.DefaultSweepLimit, 500, 0} {
		if n, err := s.Sweep(ctx, 0); n != want || err != nil {
			t.Fatalf("Sweep(0) = %d, %v; want %d", n, err, want)
		}
	}
}

func TestNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 100 {
		_ = memstore.New(nil)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("New started goroutines: %d before, %d after", before, after)
	}
}

func TestCanceledContext(t *testing.T) {
	t.Parallel()
	s := memstore.New(nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l := idem.Lease{Key: "k", Owner: "o", Fence: 1}
	errs := map[string]error{}
	_, errs["Acquire"] = s.Acquire(ctx, idem.AcquireRequest{Key: "k", Lease: 1, Retention: 1})
	errs["Complete"] = s.Complete(ctx, l, idem.Response{}, time.Second)
	_, errs["Extend"] = s.Extend(ctx, l, time.Second)
	errs["Release"] = s.Release(ctx, l)
	_, errs["Get"] = s.Get(ctx, "", "k")
	errs["Delete"] = s.Delete(ctx, "", "k")
	_, errs["Sweep"] = s.Sweep(ctx, 0)
	for op, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context = %v, want context.Canceled", op, err)
		}
	}
}

func TestInvalidIdentity(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := memstore.New(nil)
	if _, err := s.Get(ctx, "", ""); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Get with an empty key = %v, want ErrInvalidKey", err)
	}
	if err := s.Delete(ctx, "\n", "k"); !errors.Is(err, idem.ErrInvalidScope) {
		t.Errorf("Delete with a bad scope = %v, want ErrInvalidScope", err)
	}
	if err := s.Complete(ctx, idem.Lease{Key: "\x00"}, idem.Response{}, time.Second); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Complete with a bad key = %v, want ErrInvalidKey", err)
	}
}

func BenchmarkAcquire(b *testing.B) {
	ctx := b.Context()
	s := memstore.New(nil)
	req := idem.AcquireRequest{Scope: "tenant", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req.Key = strconv.Itoa(i)
		i++
		if _, err := s.Acquire(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReplay is the hot path of a retry: the key is completed
// and its response (1 KiB) is replayed.
func BenchmarkAcquireReplay(b *testing.B) {
	ctx := b.Context()
	s := memstore.New(nil)
	req := idem.AcquireRequest{Scope: "tenant", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	res, _ := s.Acquire(ctx, req)
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 1024)}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if res, err := s.Acquire(ctx, req); err != nil || res.Outcome != idem.Completed {
			b.Fatal(res.Outcome, err)
		}
	}
}

func BenchmarkAcquireParallel(b *testing.B) {
	s := memstore.New(nil)
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := idem.AcquireRequest{Scope: "tenant", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
		for pb.Next() {
			req.Key = strconv.FormatInt(n.Add(1), 10)
			if _, err := s.Acquire(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkComplete acquires a key and completes it with a 1 KiB response.
func BenchmarkComplete(b *testing.B) {
	ctx := b.Context()
	s := memstore.New(nil)
	req := idem.AcquireRequest{Scope: "tenant", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 1024)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req.Key = strconv.Itoa(i)
		i++
		res, err := s.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtend(b *testing.B) {
	ctx := b.Context()
	s := memstore.New(nil)
	res, _ := s.Acquire(ctx, idem.AcquireRequest{Key: "k", Lease: time.Minute, Retention: time.Hour})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Extend(ctx, res.Lease, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardDo is a whole execution through idem.Guard: acquire,
// watchdog, work, complete.
func BenchmarkGuardDo(b *testing.B) {
	ctx := b.Context()
	g, err := idem.NewGuard(memstore.New(nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	work := func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 200}, nil }
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, _, err := g.Do(ctx, "tenant", strconv.Itoa(i), "fp", work); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBoundariesAtEdgeTimes: the exact instants of TestBoundaries hold
// on clocks far from now, where a time kept as Unix seconds and
// nanoseconds is negative or large (before 1970 with nanoseconds, year 1,
// year 9999), and on a clock that goes back: a lease still ends exactly
// at LeaseUntil, a record still expires exactly at ExpiresAt, and the
// record's times come back equal to the clock's.
func TestBoundariesAtEdgeTimes(t *testing.T) {
	t.Parallel()
	for _, start := range []time.Time{
		{},
		time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 500, time.FixedZone("west", -3600)),
		time.Unix(0, -1),
		time.Date(9999, 12, 31, 23, 0, 0, 999999999, time.UTC),
	} {
		ctx := t.Context()
		c := &clock{now: start}
		s := memstore.New(&memstore.Config{Now: c.Now})
		req := idem.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: 10 * time.Second, Retention: time.Minute}
		res, err := s.Acquire(ctx, req)
		if err != nil || res.Outcome != idem.Acquired || !res.Record.CreatedAt.Equal(start) ||
			!res.Lease.Until.Equal(start.Add(10*time.Second)) || !res.Record.ExpiresAt.Equal(start.Add(10*time.Second+time.Minute)) {
			t.Fatalf("%v: Acquire = %+v, %v", start, res, err)
		}
		c.Advance(10*time.Second - 1)
		if res, _ := s.Acquire(ctx, req); res.Outcome != idem.InFlight {
			t.Fatalf("%v: 1ns before the lease's end: %v, want in flight", start, res.Outcome)
		}
		c.Advance(1)
		res, _ = s.Acquire(ctx, req)
		if res.Outcome != idem.Acquired || !res.TookOver {
			t.Fatalf("%v: at the lease's end: %v, want a takeover", start, res.Outcome)
		}
		if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 200}, time.Hour); err != nil {
			t.Fatal(err)
		}
		c.Advance(-time.Hour) // the clock goes back: the record is younger, not gone
		if res, _ := s.Acquire(ctx, req); res.Outcome != idem.Completed {
			t.Fatalf("%v: after the clock went back: %v, want completed", start, res.Outcome)
		}
		c.Advance(2*time.Hour - 1)
		if n, _ := s.Sweep(ctx, 0); n != 0 {
			t.Fatalf("%v: Sweep 1ns before ExpiresAt removed %d", start, n)
		}
		c.Advance(1)
		if n, _ := s.Sweep(ctx, 0); n != 1 {
			t.Fatalf("%v: Sweep at ExpiresAt removed %d, want 1", start, n)
		}
	}
}
