package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
)

// After the machine was suspended for longer than the lease, the holder
// sees the lease over at its next look, although the monotonic clock did
// not move while the backend's clock went on (and another owner may hold
// the lock): Err and the Err of Context's contexts answer ErrLost, and
// Done closes. Not parallel: it moves the package's wall clock.
func TestSuspendedPastTheLease(t *testing.T) {
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{TTL: time.Hour})
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(t.Context())
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	if err := lease.Err(); err != nil {
		t.Fatalf("Err before the suspend: %v", err)
	}
	undo := lock.SuspendFor(2 * time.Hour)
	defer undo()
	if err := ctx.Err(); err == nil || !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("context after a suspend past the lease: Err %v, cause %v; want cancelled with ErrLost", err, context.Cause(ctx))
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err after a suspend past the lease = %v, want ErrLost", err)
	}
	waitDone(t, lease)
}

// A suspend shorter than what remains of the lease changes nothing.
func TestSuspendedWithinTheLease(t *testing.T) {
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{TTL: time.Hour})
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	undo := lock.SuspendFor(10 * time.Minute)
	defer undo()
	if err := lease.Err(); err != nil {
		t.Fatalf("Err after a suspend within the lease = %v, want nil", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
