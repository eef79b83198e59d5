package memstore_test

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// wallStepped returns t with its wall clock reading moved by d (whole
// seconds) and its monotonic reading kept: what time.Now returns once
// the system clock has been stepped by d (NTP, a resumed VM). ok is
// false when t has no monotonic reading or time.Time is not laid out as
// this expects; the result is checked with time's own arithmetic.
func wallStepped(t time.Time, d time.Duration) (time.Time, bool) {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	const hasMonotonic, secShift = 1 << 63, 30
	if unsafe.Sizeof(t) != unsafe.Sizeof(layout{}) || d%time.Second != 0 {
		return t, false
	}
	s := t
	l := (*layout)(unsafe.Pointer(&s))
	if l.wall&hasMonotonic == 0 {
		return t, false
	}
	l.wall += uint64(int64(d/time.Second)) << secShift
	if s.Sub(t) != 0 || s.Round(0).Sub(t.Round(0)) != d {
		return t, false
	}
	return s, true
}

// TestWallClockStep: leases and retention are durations, measured on the
// monotonic clock when the store's clock gives one (time.Now does): a
// step of the system's wall clock neither ends a live lease, which would
// let a retry run the effect again while the first execution still runs,
// nor expires a completed record early.
func TestWallClockStep(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var step atomic.Int64
	now := func() time.Time {
		s, ok := wallStepped(time.Now(), time.Duration(step.Load()))
		if !ok {
			t.Skip("cannot step the wall clock reading of a time.Time here")
		}
		return s
	}
	now() // skip early if stepping cannot work
	s := memstore.New(&memstore.Config{Now: now})
	running := idem.AcquireRequest{Key: "running", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
	done := idem.AcquireRequest{Key: "done", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}
	if res, err := s.Acquire(ctx, running); err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire: %v, %v", res.Outcome, err)
	}
	res, err := s.Acquire(ctx, done)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire: %v, %v", res.Outcome, err)
	}
	if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}

	step.Store(int64(3 * time.Hour)) // the wall clock jumps; hardly any time passes
	if res, err := s.Acquire(ctx, running); err != nil || res.Outcome != idem.InFlight {
		t.Errorf("after a wall clock step, a lease of an hour taken just now: %v (took over: %t), %v; want in flight",
			res.Outcome, res.TookOver, err)
	}
	if res, err := s.Acquire(ctx, done); err != nil || res.Outcome != idem.Completed {
		t.Errorf("after a wall clock step, a record completed just now for an hour: %v, %v; want completed", res.Outcome, err)
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 0 {
		t.Errorf("after a wall clock step, Sweep removed %d records (%v); want none", n, err)
	}
	rec, err := s.Get(ctx, "", "done")
	if err != nil || rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.StatusCode != 201 {
		t.Errorf("the completed record: %+v, %v", rec, err)
	}
}
