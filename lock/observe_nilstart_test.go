package lock_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/lock"
)

// TestObserverNilStart: an Observer whose Start returns nil (taken for
// the context given) does not break a lock: it is acquired, held against
// another, and released.
func TestObserverNilStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obs := &obstest.NilStart{}
	l, err := lock.New(lock.NewMemoryBackend(), &lock.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := l.TryAcquire(ctx, "job"); err == nil {
		t.Fatal("a second TryAcquire of a held lock succeeded")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	again, err := l.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("TryAcquire after Release: %v", err)
	}
	_ = again.Release(ctx)
	if obs.Ends() < 4 {
		t.Fatalf("%d ends, want at least 4", obs.Ends())
	}
}
