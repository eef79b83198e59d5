package lock

import (
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"
)

// wallAhead returns t with its monotonic reading and a wall clock reading
// d later: what time.Now returned before the wall clock was stepped back
// by d. (time.Time is a wall word, the monotonic reading and a location;
// no exported API sets one reading alone.)
func wallAhead(t time.Time, d time.Duration) time.Time {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	u := t.Add(d) // both readings move
	(*layout)(unsafe.Pointer(&u)).ext = (*layout)(unsafe.Pointer(&t)).ext
	return u
}

// The wall clock stepped back (an NTP correction) between the acquisition
// and a renewal, then the machine was suspended past the renewed lease:
// Err sees the lease over, as the watchdog does, although the wall clock
// has not yet gone past the acquisition's reading plus the lease. Err
// once measured the wall clock's time from the acquisition's reading, and
// answered nil for up to the step's length after the lease had ended.
// Not parallel: it moves the package's wall clock.
func TestErrAfterWallStepBackAndSuspend(t *testing.T) {
	const ttl, step, suspend = 600 * time.Millisecond, time.Hour, 30 * time.Minute
	now := time.Now()
	if wallAhead(now, step).Sub(now) != 0 || !wallAhead(now, step).Round(0).Equal(now.Round(0).Add(step)) {
		t.Skip("time.Time's layout is not the expected one")
	}
	l, err := New(NewMemoryBackend(), &Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	fence, err := l.b.Acquire(t.Context(), "job", "owner", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// The acquisition was sent with the wall clock an hour ahead; it has
	// been stepped back since.
	e := l.start("job", "owner", fence, wallAhead(sent, step))
	defer e.Release(context.Background())
	ctx, cancel := e.Context(context.Background())
	defer cancel()
	// Wait for the first renewal, sent after the step.
	for deadline := time.Now().Add(30 * time.Second); time.Duration(e.due.Load()) <= ttl; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no renewal")
		}
	}
	if err := e.Err(); err != nil {
		t.Fatalf("Err after the renewal = %v", err)
	}
	undo := SuspendFor(suspend)
	defer undo()
	if err := e.Err(); !errors.Is(err, ErrLost) {
		t.Fatalf("Err after a suspend past the renewed lease = %v, want ErrLost", err)
	}
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), ErrLost) {
		t.Fatalf("context after a suspend past the renewed lease: Err %v, cause %v; want cancelled with ErrLost", ctx.Err(), context.Cause(ctx))
	}
}
