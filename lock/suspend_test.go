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
// Done closes. (The maximum hold is longer than the lease: the lease
// ran out before it.) Not parallel: it moves the package's wall clock.
func TestSuspendedPastTheLease(t *testing.T) {
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{TTL: time.Hour, MaxHold: 3 * time.Hour})
	lease := takeJob(t, l)
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
	lease := takeJob(t, l)
	undo := lock.SuspendFor(10 * time.Minute)
	defer undo()
	if err := lease.Err(); err != nil {
		t.Fatalf("Err after a suspend within the lease = %v, want nil", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// The maximum hold is counted on the wall clock too: after a suspend
// within the lease (the monotonic clock stood still, the backend's clock
// went on), no renewal asks the backend for a lease past the maximum
// hold on its clock. The watchdog once counted the hold on the monotonic
// clock alone, and asked for a lease ending the suspend's length past it.
// Not parallel: it moves the package's wall clock.
func TestMaxHoldCountsSuspend(t *testing.T) {
	// The renewals come every 400 ms; after the suspend the lease, on
	// the wall clock, still has 500 ms to spare at each of them.
	const ttl, maxHold, suspend = 1200 * time.Millisecond, 2 * time.Second, 300 * time.Millisecond
	h := newHook()
	l := newLocker(t, h, lock.Config{TTL: ttl, MaxHold: maxHold})
	lease := takeJob(t, l)
	// The acquisition was sent before this: the maximum hold ends, on the
	// wall clock, no later than acquired + maxHold.
	acquired := time.Now()
	undo := lock.SuspendFor(suspend)
	defer undo()
	waitDone(t, lease)
	if !errors.Is(lease.Err(), lock.ErrMaxHold) {
		t.Fatalf("Err = %v, want ErrMaxHold", lease.Err())
	}
	calls := h.calls()
	if len(calls) == 0 {
		t.Fatal("no renewal")
	}
	// An Extend reached the backend when its clock read at + suspend.
	const slack = 100 * time.Millisecond // the call's way to the backend
	for i, c := range calls {
		if end, most := c.at.Add(suspend+c.ttl), acquired.Add(maxHold+slack); end.After(most) {
			t.Errorf("renewal %d asked for %v: the backend's lease ends %v past the maximum hold", i, c.ttl, end.Sub(acquired.Add(maxHold)))
		}
	}
}

// A lease whose confirmed end is the end of the maximum hold (here the
// acquisition's: MaxHold equals the TTL) ends with ErrMaxHold however
// its end is found: by the watchdog's timer, or by Err once a suspend
// took the clock past it before the watchdog's first run. Err used to
// answer ErrLost then, as for a lease no renewal confirmed in time,
// since only the watchdog's run marked the hold used up. Not parallel:
// it moves the package's wall clock.
func TestMaxHoldReachedWhileSuspended(t *testing.T) {
	l := newLocker(t, lock.NewMemoryBackend(), lock.Config{TTL: time.Hour, MaxHold: time.Hour})
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	undo := lock.SuspendFor(2 * time.Hour)
	defer undo()
	if err := lease.Err(); !errors.Is(err, lock.ErrMaxHold) {
		t.Fatalf("Err after a suspend past the maximum hold = %v, want ErrMaxHold", err)
	}
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), lock.ErrMaxHold) {
		t.Fatalf("context after a suspend past the maximum hold: Err %v, cause %v; want cancelled with ErrMaxHold", ctx.Err(), context.Cause(ctx))
	}
	waitDone(t, lease)
}
