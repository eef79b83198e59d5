package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

func ExampleGuard_Do() {
	ctx := context.Background()
	guard, err := idem.NewGuard(memstore.New(nil), nil)
	if err != nil {
		log.Fatal(err)
	}

	charges := 0
	charge := func(ctx context.Context) (idem.Response, error) {
		charges++ // the effect: must happen once
		return idem.Response{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
	}

	// The same request arrives twice with the same Idempotency-Key.
	for range 2 {
		resp, replayed, err := guard.Do(ctx, "customer-7", "key-1", "sha256:body", charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.StatusCode, string(resp.Body), "replayed:", replayed)
	}
	fmt.Println("charges:", charges)

	// The key with another request is refused.
	_, _, err = guard.Do(ctx, "customer-7", "key-1", "sha256:other-body", charge)
	fmt.Println(errors.Is(err, idem.ErrMismatch))
	// Output:
	// 201 {"charge":"ch_1"} replayed: false
	// 201 {"charge":"ch_1"} replayed: true
	// charges: 1
	// true
}

func ExampleNewGuard() {
	guard, err := idem.NewGuard(memstore.New(nil), &idem.GuardConfig{
		Lease:        10 * time.Second, // renewed every 10s/3 while the work runs
		MaxExecution: time.Minute,      // then the work's context is cancelled
		Retention:    48 * time.Hour,   // how long a completed response is replayed
		Logger:       slog.Default(),
	})
	if err != nil {
		log.Fatal(err)
	}
	cfg := guard.Config()
	fmt.Println(cfg.Lease, cfg.MaxExecution, cfg.Retention)

	// A nil config means the defaults.
	guard, _ = idem.NewGuard(memstore.New(nil), nil)
	cfg = guard.Config()
	fmt.Println(cfg.Lease, cfg.MaxExecution, cfg.Retention)

	// Bad configurations are errors, never panics.
	_, err = idem.NewGuard(memstore.New(nil), &idem.GuardConfig{Lease: -time.Second})
	fmt.Println(err != nil)
	// Output:
	// 10s 1m0s 48h0m0s
	// 30s 5m0s 24h0m0s
	// true
}

func ExampleGuard_Begin() {
	ctx := context.Background()
	guard, _ := idem.NewGuard(memstore.New(nil), nil)

	exec, res, err := guard.Begin(ctx, "tenant-1", "import-2025-01", "v1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, "fence", exec.Lease().Fence)

	// While exec runs, a duplicate sees it in flight.
	_, dup, _ := guard.Begin(ctx, "tenant-1", "import-2025-01", "v1")
	fmt.Println("duplicate:", dup.Outcome)

	// Run the work with exec.Context(): it is cancelled if the lease is lost.
	if err := exec.Complete(ctx, idem.Response{StatusCode: 200, Body: []byte("imported 3 rows")}); err != nil {
		log.Fatal(err)
	}
	_, done, _ := guard.Begin(ctx, "tenant-1", "import-2025-01", "v1")
	fmt.Println(done.Outcome, string(done.Record.Response.Body))
	// Output:
	// acquired fence 1
	// duplicate: in-flight
	// completed imported 3 rows
}
