package steps_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/steps"
)

// The completer started with Start finishes a failed operation by itself
// and, once its retention has ended, sweeps it.
func TestStartedCompleterFinishesAndSweeps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := memstore.New(nil)
	g, err := idem.NewGuard(store, &idem.GuardConfig{Retention: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	j, _ := steps.NewMemory(store)
	r, err := steps.New(g, j, &steps.Config{Interval: 10 * time.Millisecond, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	op, err := steps.Define(r, "flaky", func(ctx context.Context, s *steps.Run, in string) (string, error) {
		return steps.Foreign(s, "call", func(ctx context.Context, key string) (string, error) {
			calls++
			if calls == 1 {
				return "", errors.New("down")
			}
			return "ok", nil
		})
	}, &steps.OpConfig[string, string]{Key: func(in string) (string, string, error) { return "", in, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := op.Call(ctx, "k"); err == nil {
		t.Fatal("first call: nil error")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err == nil {
		t.Fatal("a second Start: nil error")
	}
	for {
		e, err := j.Get(ctx, "", "k")
		if errors.Is(err, idem.ErrNotFound) {
			break // swept
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never finished and swept: %+v", e)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Fatalf("the foreign step was called %d times, want 2", calls)
	}
	rec, err := store.Get(ctx, "", "k")
	if err == nil && rec.Status != idem.StatusCompleted {
		t.Fatalf("record %+v", rec)
	}
}
