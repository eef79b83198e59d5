package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
)

// TestObserverPairsOnPanicAndMisuse: a handler that panics, and a
// HandleTx without a database, are each one handling: a Start, and one
// End on its context, with the outcome (retried, error).
func TestObserverPairsOnPanicAndMisuse(t *testing.T) {
	t.Parallel()
	rec := &obstest.Recorder{}
	in, _ := newInbox(t, inbox.Config{Group: "billing", MaxAttempts: 3, Observer: rec})
	ctx := context.Background()
	o, err := in.Handle(ctx, inbox.Message{ID: "order-1/paid"}, func(context.Context, inbox.Delivery) error { panic("handler bug") })
	var pe *inbox.PanicError
	if err != nil || o.Result != inbox.Retry || !errors.As(o.Err, &pe) {
		t.Fatalf("Handle with a panicking handler = %+v, %v; want Retry with a PanicError", o, err)
	}
	if _, err := in.HandleTx(ctx, nil, inbox.Message{ID: "order-2/paid"}, func(context.Context, *sql.Tx, inbox.Delivery) error { return nil }); err == nil {
		t.Fatal("HandleTx without a database: no error")
	}
	calls := rec.Calls()
	starts := map[int]bool{}
	ends := map[int]int{}
	for _, c := range calls {
		if c.Event.Kind != idem.KindInbox {
			continue
		}
		if c.Start {
			starts[c.Mark] = true
		} else {
			ends[c.Parent]++
		}
	}
	if len(starts) != 2 {
		t.Fatalf("%d starts, want 2: %+v", len(starts), calls)
	}
	for m := range starts {
		if ends[m] != 1 {
			t.Errorf("the handling started as %d ended %d times", m, ends[m])
		}
	}
	if got := rec.Outcomes(idem.KindInbox); len(got) != 2 || got[0] != idem.OutcomeRetried || got[1] != idem.OutcomeError {
		t.Errorf("outcomes %q, want retried and error", got)
	}
}
