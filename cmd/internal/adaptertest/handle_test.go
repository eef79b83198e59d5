package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
)

// each runs f for every broker and inbox store, in parallel.
func each(t *testing.T, f func(t *testing.T, b broker, s inbox.Store)) {
	t.Parallel()
	for _, br := range brokers {
		for _, st := range stores {
			t.Run(br.name+"/"+st.name, func(t *testing.T) {
				t.Parallel()
				f(t, br.open(t), st.open(t))
			})
		}
	}
}

func newInbox(t testing.TB, s inbox.Store, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	cfg.Group = "payments"
	if cfg.Backoff == nil {
		cfg.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	}
	in, err := inbox.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// The same message published 5 times with one ID, held 5 times by the
// broker: the claim of the first delivery commits, the handler calls the
// downstream once with the message's ID and the claim's fence, Finish
// marks it succeeded, and the 4 others are acked as duplicates without a
// call.
func TestHandlePublishedFiveTimes(t *testing.T) {
	each(t, func(t *testing.T, b broker, s inbox.Store) {
		// A copy found in progress comes back after the lease's
		// remainder: a short lease keeps that wait short.
		in := newInbox(t, s, inbox.Config{Lease: 2 * time.Second})
		ds := newDownstream()
		h := func(_ context.Context, d inbox.Delivery) error {
			ds.called(d)
			ds.apply(d.ID)
			return nil
		}
		for range 5 {
			b.publish(t, "charge-1", "1299")
		}
		var rec outcomes
		b.consume(t, in, h, &rec)
		// A copy delivered while the first one's handler runs finds the
		// claim's live lease (in progress) and comes back later: only
		// the acked outcomes are counted, one processed and 4
		// duplicates, in any order.
		obstest.WaitFor(t, "5 acked deliveries", func() bool { return rec.acked("charge-1") == 5 && b.settled(t) })
		if p, d := rec.n("charge-1", inbox.Processed), rec.n("charge-1", inbox.Duplicate); p != 1 || d != 4 {
			t.Fatalf("outcomes %s: %d processed and %d duplicates, want 1 and 4", rec.of("charge-1"), p, d)
		}
		if n := ds.effects("charge-1"); n != 1 {
			t.Fatalf("%d downstream effects, want 1", n)
		}
		r, err := s.Get(t.Context(), "payments", "charge-1")
		if err != nil || r.Status != inbox.StatusSucceeded || r.Attempts != 1 {
			t.Fatalf("record %+v, %v", r, err)
		}
		// The handler saw what a downstream needs to de-duplicate and to
		// refuse a stale holder: the message's ID and the claim's fence.
		calls := ds.callsOf("charge-1")
		if len(calls) != 1 || calls[0] != (call{"charge-1", "payments", r.Fence, 1}) || r.Fence < 1 {
			t.Fatalf("calls %+v, record fence %d", calls, r.Fence)
		}
	})
}

// A downstream call that fails twice and then succeeds: Handle records
// each failure (Fail), the broker redelivers, each attempt's claim holds
// a higher fence, and the effect happens once, on the third delivery.
func TestHandleFailsTwice(t *testing.T) {
	each(t, func(t *testing.T, b broker, s inbox.Store) {
		in := newInbox(t, s, inbox.Config{})
		ds := newDownstream()
		h := func(_ context.Context, d inbox.Delivery) error {
			if ds.called(d) <= 2 {
				return errors.New("payment service unavailable")
			}
			ds.apply(d.ID)
			return nil
		}
		var rec outcomes
		b.consume(t, in, h, &rec)
		b.publish(t, "charge-2", "500")
		obstest.WaitFor(t, "the third delivery", func() bool { return rec.count("charge-2") == 3 && b.settled(t) })
		if got, want := rec.of("charge-2"), "[retry retry processed]"; got != want {
			t.Fatalf("outcomes %s, want %s", got, want)
		}
		if n := ds.effects("charge-2"); n != 1 {
			t.Fatalf("%d downstream effects, want 1", n)
		}
		r, err := s.Get(t.Context(), "payments", "charge-2")
		if err != nil || r.Status != inbox.StatusSucceeded || r.Attempts != 3 {
			t.Fatalf("record %+v, %v", r, err)
		}
		calls := ds.callsOf("charge-2")
		if len(calls) != 3 {
			t.Fatalf("%d calls, want 3", len(calls))
		}
		for i, c := range calls {
			if c.id != "charge-2" || c.attempt != i+1 || (i > 0 && c.fence <= calls[i-1].fence) {
				t.Fatalf("calls %+v: want the message's ID, attempts 1, 2, 3 and rising fences", calls)
			}
		}
		if calls[2].fence != r.Fence {
			t.Fatalf("the succeeding call had fence %d, the record %d", calls[2].fence, r.Fence)
		}
	})
}

// A poison message fails every attempt: after MaxAttempts (3) it is dead
// and dead-lettered with the reason, and the 10 messages around it are
// handled meanwhile, each effect once.
func TestHandlePoison(t *testing.T) {
	each(t, func(t *testing.T, b broker, s inbox.Store) {
		in := newInbox(t, s, inbox.Config{MaxAttempts: 3})
		ds := newDownstream()
		h := func(_ context.Context, d inbox.Delivery) error {
			ds.called(d)
			if string(d.Payload) == "garbage" {
				return errors.New("cannot decode the payload")
			}
			ds.apply(d.ID)
			return nil
		}
		var rec outcomes
		b.consume(t, in, h, &rec)
		for i := range 10 {
			if i == 3 {
				b.publish(t, "poison", "garbage")
			}
			b.publish(t, fmt.Sprint("ok-", i), "100")
		}
		obstest.WaitFor(t, "every message settled", func() bool {
			for i := range 10 {
				if rec.count(fmt.Sprint("ok-", i)) != 1 {
					return false
				}
			}
			return rec.count("poison") == 3 && b.settled(t)
		})
		if got, want := rec.of("poison"), "[retry retry dead]"; got != want {
			t.Fatalf("poison outcomes %s, want %s", got, want)
		}
		for i := range 10 {
			id := fmt.Sprint("ok-", i)
			if got := rec.of(id); got != "[processed]" || ds.effects(id) != 1 {
				t.Fatalf("%s: outcomes %s, %d effects", id, got, ds.effects(id))
			}
		}
		if n, calls := ds.effects("poison"), len(ds.callsOf("poison")); n != 0 || calls != 3 {
			t.Fatalf("poison: %d effects, %d calls; want 0 and 3", n, calls)
		}
		r, err := s.Get(t.Context(), "payments", "poison")
		if err != nil || r.Status != inbox.StatusDead || r.Attempts != 3 {
			t.Fatalf("record %+v, %v", r, err)
		}
		var dead map[string]string
		obstest.WaitFor(t, "the dead letter", func() bool { dead = b.dead(t); return len(dead) > 0 })
		if len(dead) != 1 || !strings.Contains(dead["poison"], "cannot decode the payload") {
			t.Fatalf("dead letters %v, want poison's with its reason", dead)
		}
	})
}
