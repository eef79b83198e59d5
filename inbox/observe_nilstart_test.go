package inbox_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
)

// TestObserverNilStart: an Observer whose Start returns nil (taken for
// the context given) does not break a handling: the handler runs, the
// message is processed and a duplicate is recognised.
func TestObserverNilStart(t *testing.T) {
	t.Parallel()
	obs := &obstest.NilStart{}
	in, _ := newInbox(t, inbox.Config{Observer: obs})
	ran := 0
	h := func(ctx context.Context, _ inbox.Delivery) error { ran++; return ctx.Err() }
	m := inbox.Message{ID: "order-1/paid"}
	for _, want := range []inbox.Result{inbox.Processed, inbox.Duplicate} {
		o, err := in.Handle(context.Background(), m, h)
		if err != nil || o.Result != want {
			t.Fatalf("Handle = %+v, %v; want %v", o, err, want)
		}
	}
	if ran != 1 || obs.Ends() != 2 {
		t.Fatalf("handler ran %d times, %d ends; want 1 and 2", ran, obs.Ends())
	}
}
