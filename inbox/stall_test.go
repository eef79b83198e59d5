package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
)

// stalled is a store whose Finish and Fail never answer before their
// context ends: a connection that stalls (the network, not the server,
// fails) under a driver that honours contexts.
type stalled struct{ *inbox.MemoryStore }

func (s stalled) Finish(ctx context.Context, group, id string, fence int64) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s stalled) Fail(ctx context.Context, group, id string, fence int64, maxAttempts int, reason string) (inbox.Status, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

// TestHandleStalledStoreEnds: when the store stalls after the handler
// ran, Handle gives up within a bounded time (the lease; the record is
// then the redelivery's to settle) instead of waiting forever: it
// finished and failed under a context without cancellation or deadline,
// so a consumer stopped with its context hung in Handle for good.
func TestHandleStalledStoreEnds(t *testing.T) {
	t.Parallel()
	for name, herr := range map[string]error{"finish": nil, "fail": errors.New("boom")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in, err := inbox.New(stalled{inbox.NewMemoryStore()}, &inbox.Config{Group: "g", Lease: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			type result struct {
				o   inbox.Outcome
				err error
			}
			done := make(chan result, 1)
			go func() {
				o, err := in.Handle(ctx, inbox.Message{ID: "m"}, func(ctx context.Context, d inbox.Delivery) error {
					cancel() // the consumer is told to stop while the handler runs
					return herr
				})
				done <- result{o, err}
			}()
			select {
			case r := <-done:
				if r.err == nil || r.o.Result != inbox.Retry {
					t.Fatalf("Handle = %+v, %v; want Retry and the store's error", r.o, r.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Handle did not return within 10 s of its context's end while the store stalled")
			}
		})
	}
}

// deafExtend is a store whose renewals ignore their context and answer
// only once released: a driver that does not honour contexts, on a
// connection that stalls.
type deafExtend struct {
	*inbox.MemoryStore
	release chan struct{}
	calls   *atomic.Int64
}

func (s deafExtend) Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error {
	s.calls.Add(1)
	<-s.release
	return s.MemoryStore.Extend(ctx, group, id, fence, lease)
}

// TestHandleLeaseEndsWithRenewalUnanswered: a renewal that never answers
// must not keep the handler going past its lease: the handler's context
// is cancelled with ErrLeaseLost while the renewal still waits, and
// another delivery may then take the message over. The watchdog waited
// for the answer, so the handler ran on, unwarned, beside the delivery
// that took its message over.
func TestHandleLeaseEndsWithRenewalUnanswered(t *testing.T) {
	t.Parallel()
	s := deafExtend{MemoryStore: inbox.NewMemoryStore(), release: make(chan struct{}), calls: new(atomic.Int64)}
	in, err := inbox.New(s, &inbox.Config{Group: "g", Lease: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var cause error
	var callsThen int64
	var taken bool
	o, err := in.Handle(t.Context(), inbox.Message{ID: "m"}, func(ctx context.Context, d inbox.Delivery) error {
		select {
		case <-ctx.Done():
			cause, callsThen = context.Cause(ctx), s.calls.Load()
			for deadline := time.Now().Add(5 * time.Second); !taken && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				c, err := s.Claim(t.Context(), "g", "m", time.Hour, 5)
				taken = err == nil && c.Claimed
			}
		case <-time.After(10 * time.Second):
		}
		close(s.release) // the renewal answers at last
		return ctx.Err()
	})
	if !errors.Is(cause, inbox.ErrLeaseLost) || callsThen != 1 {
		t.Fatalf("handler's context ended with %v after %d renewals; want ErrLeaseLost while the first one waited", cause, callsThen)
	}
	if !taken {
		t.Fatal("another delivery could not take the message over once the handler's lease was lost")
	}
	if !errors.Is(err, inbox.ErrFenced) || o.Result != inbox.Retry {
		t.Fatalf("Handle = %+v, %v; want Retry, ErrFenced", o, err)
	}
	if r, _ := s.Get(t.Context(), "g", "m"); r.Status != inbox.StatusProcessing || r.Fence != 2 {
		t.Fatalf("record %+v, want the new holder's", r)
	}
}
