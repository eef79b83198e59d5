package lock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/lock"
)

// TestObserver: attempts are acquired or contended, Release is released,
// a lease whose renewal is refused is lost; the name is hashed, and named
// only through Config.Route.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &obstest.Recorder{}
	b := newHook()
	// The first lease must neither run out before its Release (a lost
	// report among the outcomes) nor the second before its renewal is
	// refused, on a loaded machine too: a renewal has a second.
	l, err := lock.New(b, &lock.Config{TTL: 1500 * time.Millisecond, Observer: rec, Route: func(name string) string {
		kind, _, _ := strings.Cut(name, "/")
		return kind
	}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, "invoice/1234")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "invoice/1234"); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("second TryAcquire: %v, want ErrHeld", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A lease whose renewal the backend refuses is lost.
	b.extend = func(context.Context, int) (error, bool) { return lock.ErrNotHeld, true }
	lost, err := l.TryAcquire(ctx, "invoice/1235")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease whose renewal was refused did not end")
	}
	want := []string{idem.OutcomeAcquired, idem.OutcomeContended, idem.OutcomeReleased, idem.OutcomeAcquired, idem.OutcomeLost}
	// The lost report follows the lease's end: wait for it.
	for deadline := time.Now().Add(10 * time.Second); len(rec.Outcomes(idem.KindLock)) < len(want) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := rec.Outcomes(idem.KindLock); !slices.Equal(got, want) {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	ends := rec.Ends(idem.KindLock)
	ops := []string{idem.OpAcquire, idem.OpAcquire, idem.OpRelease, idem.OpAcquire, idem.OpExtend}
	for i, e := range ends {
		if e.Op != ops[i] || e.Route != "invoice" {
			t.Errorf("end %d: %+v, want Op %s, Route invoice", i, e, ops[i])
		}
		name := "invoice/1234"
		if i > 2 {
			name = "invoice/1235"
		}
		if e.KeyHash != idem.HashKey("lock", name) {
			t.Errorf("end %d: KeyHash %q, want HashKey of the name", i, e.KeyHash)
		}
	}
	if !errors.Is(ends[4].Err, lock.ErrLost) || ends[1].Err != nil {
		t.Fatalf("lost %+v, contended %+v: want ErrLost and no error", ends[4], ends[1])
	}
	// Without Route, no name: Route is empty.
	rec2 := &obstest.Recorder{}
	l2, err := lock.New(lock.NewMemoryBackend(), &lock.Config{Observer: rec2})
	if err != nil {
		t.Fatal(err)
	}
	lease2, err := l2.Acquire(ctx, "user/alice")
	if err != nil {
		t.Fatal(err)
	}
	_ = lease2.Release(ctx)
	for _, c := range rec2.Calls() {
		if c.Event.Route != "" || strings.Contains(c.Event.KeyHash, "alice") {
			t.Fatalf("call %+v names the lock", c)
		}
	}
	if got := rec2.Outcomes(idem.KindLock); !slices.Equal(got, []string{idem.OutcomeAcquired, idem.OutcomeReleased}) {
		t.Fatalf("outcomes %q", got)
	}
}
