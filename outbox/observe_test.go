package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/outbox"
)

// TestRelayObserver: a batch is one publish operation, with the messages
// marked sent as N and the refusal as Err; the publisher runs in the
// operation's context.
func TestRelayObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outbox.NewMemoryStore("m-")
	for _, key := range []string{"a", "b", "stuck"} {
		if _, err := s.Add(ctx, outbox.Message{Topic: "t", Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	rec := &obstest.Recorder{}
	var marks []int
	refused := errors.New("refused")
	p := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		marks = append(marks, obstest.Mark(ctx))
		if m.Key == "stuck" {
			return refused
		}
		return nil
	})
	r, err := outbox.NewRelay(s, p, &outbox.RelayConfig{Observer: rec, Name: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Once(ctx); n != 2 || !errors.Is(err, refused) {
		t.Fatalf("Once = %d, %v; want 2 and the refusal", n, err)
	}
	calls := rec.Calls()
	if len(calls) != 2 || !calls[0].Start || calls[1].Start {
		t.Fatalf("calls %+v, want a Start and an End", calls)
	}
	e := calls[1].Event
	if e.Kind != idem.KindOutbox || e.Op != idem.OpPublish || e.Route != "orders" || e.Outcome != idem.OutcomeError || e.N != 2 || !errors.Is(e.Err, refused) {
		t.Fatalf("End %+v, want publish, orders, error, N 2, the refusal", e)
	}
	for _, m := range marks {
		if m != calls[0].Mark {
			t.Fatalf("publisher ran on contexts %v, want the Start's %d", marks, calls[0].Mark)
		}
	}
	// A second cycle is a second batch, of 0 this time.
	if n, err := r.Once(ctx); n != 0 || !errors.Is(err, refused) {
		t.Fatalf("second Once = %d, %v", n, err)
	}
	if ends := rec.Ends(idem.KindOutbox); len(ends) != 2 || ends[1].N != 0 || ends[1].Outcome != idem.OutcomeError {
		t.Fatalf("ends %+v, want a second failed batch of 0", ends)
	}
	// An empty claim is no batch: nothing is reported.
	empty, err := outbox.NewRelay(outbox.NewMemoryStore("e-"), p, &outbox.RelayConfig{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := empty.Once(ctx); n != 0 || err != nil {
		t.Fatalf("empty Once = %d, %v", n, err)
	}
	if got := len(rec.Calls()); got != 4 {
		t.Fatalf("%d calls after an empty claim, want the 4 of the two batches", got)
	}
}

// TestRelayBacklog: Run reports the backlog of a BacklogStore: the pending
// messages and the age of the oldest, which grows while the publisher
// refuses it.
func TestRelayBacklog(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := outbox.NewMemoryStore("m-")
	for range 3 {
		if _, err := s.Add(ctx, outbox.Message{Topic: "t", Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Add(ctx, outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	rec := &obstest.Recorder{}
	p := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		if m.Key == "k" {
			return errors.New("down")
		}
		return nil
	})
	r, err := outbox.NewRelay(s, p, &outbox.RelayConfig{Observer: rec, BacklogPeriod: 10 * time.Millisecond, RetryDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	defer wg.Wait()
	defer stop()
	var last idem.Event
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, e := range rec.Ends(idem.KindOutbox) {
			if e.Op == idem.OpBacklog {
				last = e
			}
		}
		if last.N == 3 && last.Age >= 50*time.Millisecond {
			break
		}
	}
	if last.N != 3 || last.Age < 50*time.Millisecond || last.Outcome != idem.OutcomeOK || last.Err != nil {
		t.Fatalf("last backlog %+v, want the key's 3 messages pending, aging", last)
	}
	b, err := s.Backlog(ctx)
	if err != nil || b.Pending != 3 {
		t.Fatalf("Backlog = %+v, %v", b, err)
	}
}
