package inbox_test

import (
	"context"
	"errors"
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
