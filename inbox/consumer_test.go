package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
)

// fakeDelivery records what the loop did with it; DeadLetter fails while
// deadFails > 0.
type fakeDelivery struct {
	m         inbox.Message
	fallback  string
	delivered int

	mu        sync.Mutex
	deadFails int
	calls     []string
}

func (d *fakeDelivery) record(s string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, s)
	return nil
}

func (d *fakeDelivery) log() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, c := range d.calls {
		if c != "in-progress" {
			out = append(out, c)
		}
	}
	return out
}

func (d *fakeDelivery) Message() inbox.Message { return d.m }
func (d *fakeDelivery) FallbackID() string     { return d.fallback }
func (d *fakeDelivery) Delivered() int         { return d.delivered }
func (d *fakeDelivery) Ack(context.Context) error {
	return d.record("ack")
}
func (d *fakeDelivery) Nak(_ context.Context, delay time.Duration) error {
	return d.record(fmt.Sprint("nak ", delay))
}
func (d *fakeDelivery) InProgress(context.Context) error { return d.record("in-progress") }
func (d *fakeDelivery) Term(context.Context, string) error {
	return d.record("term")
}
func (d *fakeDelivery) DeadLetter(_ context.Context, reason string, _ inbox.Outcome) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.deadFails > 0 {
		d.deadFails--
		d.calls = append(d.calls, "dead-letter failed")
		return errors.New("no stream")
	}
	d.calls = append(d.calls, "dead-letter "+reason)
	return nil
}

func fastBackoff(int) time.Duration { return time.Millisecond }

func newLoop(t *testing.T, cfg inbox.ConsumerConfig) *inbox.Consumer {
	t.Helper()
	if cfg.Backoff == nil {
		cfg.Backoff = fastBackoff
	}
	c, err := inbox.NewConsumer(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A store error is retried in place, without a nak: the delivery is
// neither handed back nor counted, and the next call's outcome settles it.
func TestSettleRetriesStoreErrorInPlace(t *testing.T) {
	calls := 0
	c := newLoop(t, inbox.ConsumerConfig{MaxDeliver: 1, Heartbeat: time.Millisecond, Process: func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		calls++
		if calls <= 5 {
			return inbox.Outcome{Result: inbox.Retry, Delay: time.Second}, errors.New("database down")
		}
		return inbox.Outcome{Result: inbox.Processed, ID: m.ID}, nil
	}})
	d := &fakeDelivery{m: inbox.Message{ID: "m"}, delivered: 1}
	s := c.Settle(context.Background(), d)
	if got := fmt.Sprint(d.log()); got != "[ack]" || calls != 6 || s.Action != inbox.Acked || s.StoreErrors != 5 || s.Err != nil {
		t.Fatalf("calls %d, delivery %s, settled %+v; want 6 calls and one ack", calls, got, s)
	}
}

// The consumer's stop ends the retries of a store error: the delivery is
// naked, to be redelivered.
func TestSettleStopsRetryingOnStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := newLoop(t, inbox.ConsumerConfig{Process: func(context.Context, inbox.Message) (inbox.Outcome, error) {
		cancel()
		return inbox.Outcome{Result: inbox.Retry}, errors.New("database down")
	}})
	d := &fakeDelivery{m: inbox.Message{ID: "m"}}
	if s := c.Settle(ctx, d); s.Action != inbox.Naked || fmt.Sprint(d.log()) != fmt.Sprint([]string{"nak " + inbox.DefaultStopNak.String()}) {
		t.Fatalf("settled %+v, delivery %v", s, d.log())
	}
}

// A panic of the Process is a Retry, naked; on the MaxDeliver-th
// delivery, dead-lettered.
func TestSettlePanic(t *testing.T) {
	c := newLoop(t, inbox.ConsumerConfig{MaxDeliver: 3, Process: func(context.Context, inbox.Message) (inbox.Outcome, error) { panic("boom") }})
	d := &fakeDelivery{m: inbox.Message{ID: "m"}, delivered: 1}
	s := c.Settle(context.Background(), d)
	var pe *inbox.PanicError
	if s.Outcome.Result != inbox.Retry || !errors.As(s.Outcome.Err, &pe) || s.Action != inbox.Naked {
		t.Fatalf("settled %+v", s)
	}
	d = &fakeDelivery{m: inbox.Message{ID: "m"}, delivered: 3}
	if s := c.Settle(context.Background(), d); s.Action != inbox.DeadLettered ||
		fmt.Sprint(d.log()) != "[dead-letter delivered 3 times (MaxDeliver), last: inbox: handler panicked: boom term]" {
		t.Fatalf("settled %+v, delivery %v", s, d.log())
	}
}

// A dead-letter publish that fails is retried while the delivery is
// held, and the delivery is terminated only after it succeeded.
func TestSettleRetriesDeadLetter(t *testing.T) {
	c := newLoop(t, inbox.ConsumerConfig{Process: func(context.Context, inbox.Message) (inbox.Outcome, error) {
		return inbox.Outcome{Result: inbox.Dead, Err: errors.New("poison")}, nil
	}})
	d := &fakeDelivery{m: inbox.Message{ID: "m"}, deadFails: 3}
	s := c.Settle(context.Background(), d)
	want := "[dead-letter failed dead-letter failed dead-letter failed dead-letter poison term]"
	if got := fmt.Sprint(d.log()); got != want || s.Action != inbox.DeadLettered || s.Err != nil {
		t.Fatalf("delivery %s, settled %+v; want %s", got, s, want)
	}
}

// A message without an ID gets DeriveFrom's, before the fallback; with
// a field missing, the fallback.
func TestSettleDerivesID(t *testing.T) {
	var got []string
	c := newLoop(t, inbox.ConsumerConfig{
		DeriveFrom: func(m inbox.Message) []string {
			return []string{m.Headers["Order-No"], m.Headers["Event-Type"], m.Headers["Event-Version"]}
		},
		Process: func(_ context.Context, m inbox.Message) (inbox.Outcome, error) {
			got = append(got, m.ID)
			return inbox.Outcome{Result: inbox.Processed}, nil
		}})
	h := map[string]string{"Order-No": "7", "Event-Type": "order.paid", "Event-Version": "1"}
	c.Settle(context.Background(), &fakeDelivery{m: inbox.Message{Headers: h}, fallback: "S:1:1"})
	c.Settle(context.Background(), &fakeDelivery{m: inbox.Message{Headers: map[string]string{"Order-No": "7"}}, fallback: "S:2:2"})
	c.Settle(context.Background(), &fakeDelivery{m: inbox.Message{ID: "own", Headers: h}, fallback: "S:3:3"})
	if want := []string{inbox.DeriveID("7", "order.paid", "1"), "S:2:2", "own"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("IDs %v, want %v", got, want)
	}
}

func TestDefaultBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 8: 10 * time.Second, 100: 10 * time.Second} {
		for range 20 {
			if d := inbox.DefaultBackoff(n); d < want/2 || d > want {
				t.Fatalf("DefaultBackoff(%d) = %v, want in [%v, %v]", n, d, want/2, want)
			}
		}
	}
}

// A Backoff of 0 or less does not spin: the loop waits at least
// minRetryWait between two calls of a Process whose store is down.
func TestSettleBoundsNonPositiveBackoff(t *testing.T) {
	for _, b := range []time.Duration{0, -time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		calls := 0
		c := newLoop(t, inbox.ConsumerConfig{Backoff: func(int) time.Duration { return b }, Process: func(context.Context, inbox.Message) (inbox.Outcome, error) {
			calls++
			return inbox.Outcome{}, errors.New("database down")
		}})
		d := &fakeDelivery{m: inbox.Message{ID: "m"}}
		s := c.Settle(ctx, d)
		cancel()
		if calls > 30 || s.Action != inbox.Naked {
			t.Fatalf("Backoff %v: %d calls of the Process in 200ms, settled %+v; want at most 30 (a wait of 10ms at least)", b, calls, s)
		}
	}
}

// A DeriveFrom that panics is never a crash: the message is dead, as one
// without an ID is, and dead-lettered with the panic at once (a
// redelivery would panic again).
func TestSettleDeriveFromPanic(t *testing.T) {
	called := false
	c := newLoop(t, inbox.ConsumerConfig{
		DeriveFrom: func(m inbox.Message) []string { panic("no header map") },
		Process: func(context.Context, inbox.Message) (inbox.Outcome, error) {
			called = true
			return inbox.Outcome{Result: inbox.Processed}, nil
		}})
	// No MaxDeliver, a broker that counts no deliveries: a Retry would
	// come back and panic again for ever.
	d := &fakeDelivery{m: inbox.Message{}, fallback: "S:1:1"}
	s := c.Settle(context.Background(), d)
	var pe *inbox.PanicError
	if called || s.Action != inbox.DeadLettered || s.Outcome.Result != inbox.Dead || !errors.As(s.Outcome.Err, &pe) {
		t.Fatalf("Process called %v, settled %+v, delivery %v; want dead-lettered with the panic", called, s, d.log())
	}
}

// A Backoff that panics (it is the caller's code, called only while the
// store is down) is not the consumer's end: the default backoff stands
// in for it, and the store error is retried in place.
func TestSettleBackoffPanics(t *testing.T) {
	calls := 0
	c := newLoop(t, inbox.ConsumerConfig{Backoff: func(int) time.Duration { panic("bad table") }, Process: func(_ context.Context, m inbox.Message) (inbox.Outcome, error) {
		if calls++; calls == 1 {
			return inbox.Outcome{}, errors.New("database down")
		}
		return inbox.Outcome{Result: inbox.Processed, ID: m.ID}, nil
	}})
	d := &fakeDelivery{m: inbox.Message{ID: "m"}}
	if s := c.Settle(context.Background(), d); s.Action != inbox.Acked || calls != 2 || fmt.Sprint(d.log()) != "[ack]" {
		t.Fatalf("settled %+v after %d calls, delivery %v", s, calls, d.log())
	}
}

// An InProgress on the MaxDeliver-th delivery is handed back, not
// dead-lettered: another consumer holds the message's live lease (a
// handler slower than the lease, a copy of the message published twice,
// a holder whose broker connection dropped) and settles it. The loop
// dead-lettered such a copy of a healthy message.
func TestSettleInProgressNotDeadLettered(t *testing.T) {
	c := newLoop(t, inbox.ConsumerConfig{MaxDeliver: 3, Process: func(_ context.Context, m inbox.Message) (inbox.Outcome, error) {
		return inbox.Outcome{Result: inbox.InProgress, ID: m.ID, Delay: 700 * time.Millisecond}, nil
	}})
	d := &fakeDelivery{m: inbox.Message{ID: "m"}, delivered: 5}
	if s := c.Settle(context.Background(), d); s.Action != inbox.Naked || fmt.Sprint(d.log()) != "[nak 700ms]" {
		t.Fatalf("settled %+v, delivery %v; want a nak of the lease's remainder", s, d.log())
	}
}
