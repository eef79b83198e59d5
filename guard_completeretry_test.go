package idem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// flakyComplete fails the first fails Complete calls with a store error;
// with lostReply, the first one completes the record and then fails, as
// a completion whose reply was lost.
type flakyComplete struct {
	idem.Store
	fails     int32
	lostReply bool
	calls     atomic.Int32
}

func (s *flakyComplete) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	n := s.calls.Add(1)
	if n == 1 && s.lostReply {
		if err := s.Store.Complete(ctx, l, resp, retention); err != nil {
			return err
		}
		return errors.New("connection reset after the completion committed")
	}
	if n <= s.fails {
		return errors.New("store unreachable")
	}
	return s.Store.Complete(ctx, l, resp, retention)
}

// TestCompleteRetrying: work whose completion fails for a moment (a store
// failing over) is stored once the store answers again, rather than left
// to its lease, after which a retry would run the work again. A
// completion whose reply was lost is found completed by its retry.
func TestCompleteRetrying(t *testing.T) {
	for _, c := range []struct {
		name      string
		fails     int32
		lostReply bool
		retry     time.Duration
		stored    bool
	}{
		{"store back after 3 failures", 3, false, 0, true},
		{"reply of the first lost", 0, true, 0, true},
		{"no retry", 1, false, -1, false},
		{"store down longer than CompleteRetry", 1000, false, 100 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ms := memstore.New(nil)
			s := &flakyComplete{Store: ms, fails: c.fails, lostReply: c.lostReply}
			g, err := idem.NewGuard(s, &idem.GuardConfig{CompleteRetry: c.retry})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			work := func(context.Context) (idem.Response, error) {
				runs++
				return idem.Response{StatusCode: 201, Body: []byte("order 1")}, nil
			}
			_, _, err = g.Do(t.Context(), "s", "k", "fp", work)
			rec, gerr := ms.Get(t.Context(), "s", "k")
			if gerr != nil {
				t.Fatal(gerr)
			}
			if c.stored {
				if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "order 1" {
					t.Fatalf("Do = %v; record %s %+v; want completed with the work's response", err, rec.Status, rec.Response)
				}
				// A retry replays: the work ran once.
				resp, replayed, err := g.Do(t.Context(), "s", "k", "fp", work)
				if err != nil || !replayed || string(resp.Body) != "order 1" || runs != 1 {
					t.Fatalf("retry: %q replayed %v, %v; work ran %d times", resp.Body, replayed, err, runs)
				}
			} else if err == nil || rec.Status != idem.StatusProcessing {
				t.Fatalf("Do = %v; record %s; want an error and the record left processing", err, rec.Status)
			}
			if want := c.fails + 1; c.stored && !c.lostReply && s.calls.Load() != want {
				t.Errorf("Complete called %d times, want %d", s.calls.Load(), want)
			}
		})
	}
}

// hangingComplete is a store whose Complete hangs until its context ends
// (a store that stops answering rather than failing), noting when each
// call began and the deadline its context carried.
type hangingComplete struct {
	idem.Store
	mu        sync.Mutex
	deadlines []time.Time
	ended     time.Time // when the first call gave up
}

func (s *hangingComplete) Complete(ctx context.Context, _ idem.Lease, _ idem.Response, _ time.Duration) error {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(time.Hour) // no bound: surely too late
	}
	s.mu.Lock()
	s.deadlines = append(s.deadlines, dl)
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	if s.ended.IsZero() {
		s.ended = time.Now()
	}
	s.mu.Unlock()
	return ctx.Err()
}

// TestCompleteRetryingHangingStore: CompleteRetry bounds how long the
// completion is tried after its first failure, also when the store hangs
// rather than fails: no retry may run past that deadline (the client
// waits for it), as a retry bounded only by StoreTimeout would.
func TestCompleteRetryingHangingStore(t *testing.T) {
	const storeTimeout, retry = 2 * time.Second, 300 * time.Millisecond
	s := &hangingComplete{Store: memstore.New(nil)}
	g, err := idem.NewGuard(s, &idem.GuardConfig{StoreTimeout: storeTimeout, CompleteRetry: retry, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Do(t.Context(), "s", "k", "fp", func(context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 201}, nil
	})
	if err == nil {
		t.Fatal("Do answered nil with a store whose Complete hangs")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.deadlines) < 2 {
		t.Fatalf("Complete tried %d times, want a retry", len(s.deadlines))
	}
	// Slack for the time between the store's giving up and the guard's
	// noting the failure: well under StoreTimeout.
	limit := s.ended.Add(retry + time.Second)
	for i, dl := range s.deadlines[1:] {
		if dl.After(limit) {
			t.Errorf("retry %d may run until %v after the first failure, past CompleteRetry (%v)", i+1, dl.Sub(s.ended).Round(time.Millisecond), retry)
		}
	}
}

// lostReplyUntilRenewed is a store whose first Complete commits and then
// fails (its reply lost), and whose later ones fail until the
// execution's context has ended: the watchdog, resumed between the
// attempts, has by then renewed against the completed record.
type lostReplyUntilRenewed struct {
	idem.Store
	calls   atomic.Int32
	workCtx atomic.Pointer[context.Context]
}

func (s *lostReplyUntilRenewed) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if s.calls.Add(1) == 1 {
		if err := s.Store.Complete(ctx, l, resp, retention); err != nil {
			return err
		}
		return errors.New("connection reset after the completion committed")
	}
	if wc := s.workCtx.Load(); wc == nil || (*wc).Err() == nil {
		return errors.New("store unreachable")
	}
	return s.Store.Complete(ctx, l, resp, retention)
}

// lostEvents counts the lease-lost events an Observer receives.
type lostEvents struct{ n atomic.Int32 }

func (o *lostEvents) Start(ctx context.Context, _ idem.Event) context.Context { return ctx }
func (o *lostEvents) End(_ context.Context, e idem.Event) {
	if e.Kind == idem.KindLease && e.Outcome == idem.OutcomeLost {
		o.n.Add(1)
	}
}

// TestCompleteRetryingRenewalMeetsOwnCompletion: when a completion
// committed but its reply was lost, the watchdog that resumes between
// the attempts finds the record completed and no longer processing. That
// is the execution's own completion, which the retry then confirms: no
// lease was lost, and none may be reported (a metric and a warning that
// would send an operator after a takeover that never happened).
func TestCompleteRetryingRenewalMeetsOwnCompletion(t *testing.T) {
	ms := memstore.New(nil)
	s := &lostReplyUntilRenewed{Store: ms}
	obs := &lostEvents{}
	g, err := idem.NewGuard(s, &idem.GuardConfig{Lease: 300 * time.Millisecond, CompleteRetry: 30 * time.Second, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Do(t.Context(), "s", "k", "fp", func(ctx context.Context) (idem.Response, error) {
		s.workCtx.Store(&ctx)
		return idem.Response{StatusCode: 201, Body: []byte("order 1")}, nil
	})
	if err != nil {
		t.Fatalf("Do = %v, want nil: the completion committed", err)
	}
	rec, err := ms.Get(t.Context(), "s", "k")
	if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "order 1" {
		t.Fatalf("record %v %+v, %v; want completed with the work's response", rec.Status, rec.Response, err)
	}
	if s.calls.Load() < 3 {
		t.Fatalf("Complete called %d times; the test needs a renewal between the attempts", s.calls.Load())
	}
	if n := obs.n.Load(); n != 0 {
		t.Errorf("the Observer got %d lease-lost events for an execution whose own completion committed", n)
	}
}
