package inbox_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
)

func TestObserver(t *testing.T) {
	t.Parallel()
	rec := &obstest.Recorder{}
	in, s := newInbox(t, inbox.Config{Group: "billing", MaxAttempts: 2, Observer: rec})
	ctx := context.Background()
	headers := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	m := inbox.Message{ID: "order-42/paid", Headers: headers}

	var handlerMarks []int
	ok := func(ctx context.Context, d inbox.Delivery) error {
		handlerMarks = append(handlerMarks, obstest.Mark(ctx))
		return nil
	}
	boom := func(context.Context, inbox.Delivery) error { return errors.New("boom") }

	mustHandle := func(m inbox.Message, h inbox.Handler, want inbox.Result) {
		t.Helper()
		o, err := in.Handle(ctx, m, h)
		if err != nil || o.Result != want {
			t.Fatalf("Handle(%s) = %v, %v; want %v", m.ID, o.Result, err, want)
		}
	}
	mustHandle(m, ok, inbox.Processed)
	mustHandle(m, ok, inbox.Duplicate)
	bad := inbox.Message{ID: "order-43/paid"}
	mustHandle(bad, boom, inbox.Retry)
	mustHandle(bad, boom, inbox.Dead)
	held := inbox.Message{ID: "order-44/paid"}
	if c, err := s.Claim(ctx, "billing", held.ID, time.Minute, 2); err != nil || !c.Claimed {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	mustHandle(held, ok, inbox.InProgress)

	want := []string{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeRetried, idem.OutcomeDead, idem.OutcomeInFlight}
	if got := rec.Outcomes(idem.KindInbox); !slices.Equal(got, want) {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	calls := rec.Calls()
	if len(calls) != 2*len(want) {
		t.Fatalf("%d calls, want a Start and an End per message: %+v", len(calls), calls)
	}
	first := calls[0]
	if !first.Start || !maps.Equal(first.Event.Headers, headers) {
		t.Fatalf("first call %+v: want Start with the message's headers", first)
	}
	if len(handlerMarks) != 1 || handlerMarks[0] != first.Mark {
		t.Fatalf("handler ran with context marks %v, want the Start's %d", handlerMarks, first.Mark)
	}
	for i, c := range calls {
		e := c.Event
		if e.Kind != idem.KindInbox || e.Route != "billing" {
			t.Errorf("call %d: %+v: want KindInbox, Route billing", i, e)
		}
		ids := []string{"order-42/paid", "order-43/paid", "order-44/paid"}
		if want := idem.HashKey("", ids[min(i/4, 2)]); e.KeyHash != want {
			t.Errorf("call %d: KeyHash %q, want HashKey of the message ID", i, e.KeyHash)
		}
		for _, f := range []string{e.Op, e.Outcome, e.Route, e.Store, e.KeyHash} {
			if strings.Contains(f, "order-") {
				t.Errorf("call %d: the message ID appears in %q", i, f)
			}
		}
		if c.Start {
			continue
		}
		if c.Parent != calls[i-1].Mark {
			t.Errorf("End %d on context of %d, want the Start's %d", i, c.Parent, calls[i-1].Mark)
		}
		if e.Headers != nil {
			t.Errorf("End %d carries headers", i)
		}
	}
	ends := rec.Ends(idem.KindInbox)
	if ends[2].Err == nil || ends[2].N != 1 || ends[3].N != 2 {
		t.Fatalf("failed attempts: %+v, %+v: want the handler's error and attempts 1, 2", ends[2], ends[3])
	}
	if ends[0].Err != nil || ends[0].Duration <= 0 {
		t.Fatalf("processed: %+v: want no error and a duration", ends[0])
	}
}

func TestObserverNoID(t *testing.T) {
	t.Parallel()
	rec := &obstest.Recorder{}
	in, _ := newInbox(t, inbox.Config{Observer: rec})
	o, err := in.Handle(context.Background(), inbox.Message{}, func(context.Context, inbox.Delivery) error { return nil })
	if err != nil || o.Result != inbox.Dead {
		t.Fatalf("Handle = %v, %v", o.Result, err)
	}
	ends := rec.Ends(idem.KindInbox)
	if len(ends) != 1 || ends[0].Outcome != idem.OutcomeDead || !errors.Is(ends[0].Err, inbox.ErrNoID) || ends[0].KeyHash != "" {
		t.Fatalf("ends %+v: want one dead with ErrNoID and no KeyHash", ends)
	}
}
