package memstore_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

func ExampleNew() {
	ctx := context.Background()
	store := memstore.New(nil)
	req := idem.AcquireRequest{
		Scope:       "tenant-1",
		Key:         "order-42",
		Fingerprint: "sha256:…",
		Lease:       30 * time.Second,
		Retention:   24 * time.Hour,
	}

	first, _ := store.Acquire(ctx, req)
	fmt.Println("first:", first.Outcome, "fence", first.Lease.Fence)

	_ = store.Complete(ctx, first.Lease, idem.Response{StatusCode: 201, Body: []byte(`{"id":42}`)}, 24*time.Hour)

	retry, _ := store.Acquire(ctx, req)
	fmt.Println("retry:", retry.Outcome, retry.Record.Response.StatusCode, string(retry.Record.Response.Body))
	// Output:
	// first: acquired fence 1
	// retry: completed 201 {"id":42}
}

// A fake clock makes lease expiry deterministic in tests.
func ExampleConfig_fakeClock() {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		now = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	)
	store := memstore.New(&memstore.Config{Now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}})
	req := idem.AcquireRequest{Key: "job-7", Fingerprint: "v1", Lease: 10 * time.Second, Retention: time.Hour}

	first, _ := store.Acquire(ctx, req)
	dup, _ := store.Acquire(ctx, req)
	fmt.Println(first.Outcome, dup.Outcome)

	mu.Lock()
	now = now.Add(11 * time.Second) // the first execution crashed; its lease ran out
	mu.Unlock()

	second, _ := store.Acquire(ctx, req)
	fmt.Println(second.Outcome, "took over:", second.TookOver, "fence", second.Lease.Fence)
	fmt.Println("stale completion:", store.Complete(ctx, first.Lease, idem.Response{}, time.Hour) != nil)
	// Output:
	// acquired in-flight
	// acquired took over: true fence 2
	// stale completion: true
}
