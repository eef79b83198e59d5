// Package consumertest is the conformance suite of the inbox's broker
// adapters: Run drives one adapter's consumer, over a real broker, through
// the scenarios the consumer protocol (inbox.Consumer) guarantees —
// duplicates, failures, poison messages, panics, a store outage, a
// dead-letter publish that fails, messages without an ID — and ends each
// with every message acked or terminated on the broker. An adapter is
// done when Run passes against its broker. The suite brings its own
// inbox (an inbox.MemoryStore behind a switch that makes it fail), so an
// adapter's harness only publishes, consumes, stops, reads dead letters
// and tells whether the broker holds anything unsettled.
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
)

// Broker is a test's own stream or queue on a real broker, with its
// dead-letter stream or queue, and the adapter's consumer of it; it is
// removed when the test ends.
type Broker interface {
	// Publish publishes m (an empty ID: none, as a producer that is not
	// the outbox sends it) with its headers and payload; the broker
	// holds it even if it holds a message with that ID already.
	Publish(t testing.TB, m inbox.Message)
	// Consume runs the adapter's consumer until the test ends, with the
	// Process, MaxDeliver, DeriveFrom and Backoff of cfg (the adapter's
	// own settings for the rest).
	Consume(t testing.TB, cfg inbox.ConsumerConfig)
	// DeadLetters returns the IDs of the messages dead-lettered so far,
	// one per dead letter, in any order.
	DeadLetters(t testing.TB) []string
	// BreakDeadLetters makes every dead-letter publish fail (broken) or
	// succeed again.
	BreakDeadLetters(t testing.TB, broken bool)
	// Stop stops the consumer and returns once its Run has returned
	// (the broker takes back what it did not settle).
	Stop(t testing.TB)
	// Settled reports whether, after Stop, the broker holds nothing to
	// deliver: every message was acked or terminated.
	Settled(t testing.TB) bool
}

// Run runs every scenario, each in parallel, with a Broker of its own
// from open.
func Run(t *testing.T, open func(t testing.TB) Broker) {
	for _, sc := range []struct {
		name string
		run  func(*testing.T, Broker)
	}{
		{"Duplicates", testDuplicates},
		{"FailsTwiceThenSucceeds", testFailsTwice},
		{"Poison", testPoison},
		{"Panics", testPanics},
		{"StoreOutage", testStoreOutage},
		{"DeadLetterPublishFails", testDeadLetterFails},
		{"DerivedID", testDerivedID},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			b := &consuming{Broker: open(t)}
			sc.run(t, b)
			b.settle(t)
		})
	}
}

// consuming is a Broker that remembers its consumer's config.
type consuming struct {
	Broker
	cfg inbox.ConsumerConfig
}

func (b *consuming) Consume(t testing.TB, cfg inbox.ConsumerConfig) {
	b.cfg = cfg
	b.Broker.Consume(t, cfg)
}

// settle checks that every message ends settled: an adapter that never
// acks gets the effects right and fails here. A message still handed
// back when the consumer stops (a copy naked while its twin held the
// lease) is the next consumer's, which is started until none is left.
func (b *consuming) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b.Stop(t)
		if b.Settled(t) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for every message acked or terminated")
		}
		b.Broker.Consume(t, b.cfg)
		time.Sleep(time.Second)
	}
}

var errDown = errors.New("consumertest: store down")

// store is an inbox.MemoryStore that fails every call while down.
type store struct {
	*inbox.MemoryStore
	down   atomic.Bool
	failed atomic.Int64
}

func (s *store) err() error {
	if s.down.Load() {
		s.failed.Add(1)
		return errDown
	}
	return nil
}

func (s *store) Claim(ctx context.Context, g, id string, lease time.Duration, max int) (inbox.Claim, error) {
	if err := s.err(); err != nil {
		return inbox.Claim{}, err
	}
	return s.MemoryStore.Claim(ctx, g, id, lease, max)
}

func (s *store) Finish(ctx context.Context, g, id string, fence int64) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.MemoryStore.Finish(ctx, g, id, fence)
}

func (s *store) Fail(ctx context.Context, g, id string, fence int64, max int, reason string) (inbox.Status, error) {
	if err := s.err(); err != nil {
		return "", err
	}
	return s.MemoryStore.Fail(ctx, g, id, fence, max, reason)
}

func (s *store) Extend(ctx context.Context, g, id string, fence int64, lease time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.MemoryStore.Extend(ctx, g, id, fence, lease)
}

// effects counts the handler's calls and effects per message ID.
type effects struct {
	mu      sync.Mutex
	calls   map[string]int
	applied map[string]int
}

func (e *effects) call(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.calls == nil {
		e.calls, e.applied = map[string]int{}, map[string]int{}
	}
	e.calls[id]++
	return e.calls[id]
}

func (e *effects) apply(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.applied[id]++
}

func (e *effects) of(id string) (calls, applied int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[id], e.applied[id]
}

func (e *effects) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, v := range e.applied {
		n += v
	}
	return n
}

// setup returns an inbox over a failing store, and a consumer config
// whose Process handles with h (the external-effect mode), counting in
// eff; fail(id, call) says whether the call-th call of id fails.
func setup(t *testing.T, maxAttempts int, eff *effects, fail func(id string, call int) error) (*store, inbox.ConsumerConfig) {
	t.Helper()
	s := &store{MemoryStore: inbox.NewMemoryStore()}
	in, err := inbox.New(s, &inbox.Config{Group: "consumertest", MaxAttempts: maxAttempts, Lease: 5 * time.Second,
		Backoff: func(int) time.Duration { return 20 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, d inbox.Delivery) error {
		n := eff.call(d.ID)
		if fail != nil {
			if err := fail(d.ID, n); err != nil {
				return err
			}
		}
		eff.apply(d.ID)
		return nil
	}
	return s, inbox.ConsumerConfig{Process: in.Process(h), Backoff: func(int) time.Duration { return 20 * time.Millisecond }}
}

// hold checks that cond still holds a while after it first did: no late
// redelivery undoes it.
func hold(t testing.TB, what string, cond func() bool) {
	t.Helper()
	obstest.WaitFor(t, what, cond)
	time.Sleep(500 * time.Millisecond)
	if !cond() {
		t.Fatalf("%s no longer holds", what)
	}
}

func msg(id string) inbox.Message { return inbox.Message{ID: id, Payload: []byte("p-" + id)} }

// The same message published three times has one effect.
func testDuplicates(t *testing.T, b Broker) {
	var eff effects
	_, cfg := setup(t, 3, &eff, nil)
	b.Consume(t, cfg)
	for range 3 {
		b.Publish(t, msg("dup"))
	}
	b.Publish(t, msg("other"))
	hold(t, "one effect each", func() bool {
		_, d := eff.of("dup")
		_, o := eff.of("other")
		return d == 1 && o == 1
	})
}

// A handler that fails twice has its effect on the third attempt.
func testFailsTwice(t *testing.T, b Broker) {
	var eff effects
	_, cfg := setup(t, 5, &eff, func(id string, n int) error {
		if n <= 2 {
			return fmt.Errorf("attempt %d fails", n)
		}
		return nil
	})
	b.Consume(t, cfg)
	b.Publish(t, msg("flaky"))
	hold(t, "the effect on attempt 3", func() bool { c, a := eff.of("flaky"); return c == 3 && a == 1 })
	if len(b.DeadLetters(t)) != 0 {
		t.Fatal("a dead letter of a message that succeeded")
	}
}

// A poison message is dead-lettered once, after MaxAttempts runs of its
// handler; the messages around it flow.
func testPoison(t *testing.T, b Broker) {
	var eff effects
	_, cfg := setup(t, 3, &eff, func(id string, _ int) error {
		if id == "poison" {
			return errors.New("cannot decode")
		}
		return nil
	})
	b.Consume(t, cfg)
	b.Publish(t, msg("poison"))
	for i := range 5 {
		b.Publish(t, msg(fmt.Sprint("ok-", i)))
	}
	var dead []string
	obstest.WaitFor(t, "the dead letter", func() bool { dead = append(dead, b.DeadLetters(t)...); return len(dead) >= 1 })
	hold(t, "five effects", func() bool { return eff.total() == 5 })
	dead = append(dead, b.DeadLetters(t)...)
	if !slices.Equal(dead, []string{"poison"}) {
		t.Fatalf("dead letters %q, want [poison] once", dead)
	}
	if c, a := eff.of("poison"); c != 3 || a != 0 {
		t.Fatalf("poison: %d calls, %d effects; want 3 calls (MaxAttempts), none", c, a)
	}
}

// A panic, of the handler or of the Process around it, is a failed
// attempt, never the consumer's end: the message is retried, then
// dead-lettered after MaxAttempts, and later messages are handled.
func testPanics(t *testing.T, b Broker) {
	var eff effects
	_, cfg := setup(t, 2, &eff, func(id string, _ int) error {
		if id == "handler-panics" {
			panic("handler panics")
		}
		return nil
	})
	var wrapped atomic.Int32
	p := cfg.Process
	cfg.Process = func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		if m.ID == "process-panics" && wrapped.Add(1) <= 2 {
			panic("process panics")
		}
		return p(ctx, m)
	}
	b.Consume(t, cfg)
	b.Publish(t, msg("handler-panics"))
	b.Publish(t, msg("process-panics"))
	var dead []string
	obstest.WaitFor(t, "the dead letter of handler-panics", func() bool { dead = append(dead, b.DeadLetters(t)...); return len(dead) >= 1 })
	if !slices.Equal(dead, []string{"handler-panics"}) {
		t.Fatalf("dead letters %q", dead)
	}
	b.Publish(t, msg("after"))
	hold(t, "the effects after the panics", func() bool {
		_, a := eff.of("process-panics")
		_, b := eff.of("after")
		return a == 1 && b == 1
	})
	if c, _ := eff.of("handler-panics"); c != 2 {
		t.Fatalf("handler-panics ran %d times, want 2 (MaxAttempts)", c)
	}
}

// A store outage costs time, never a message nor a delivery: with
// MaxAttempts and MaxDeliver at 2, messages that arrive during an outage
// of many store errors are held, not handed back; when it ends, each
// fails its first attempt and has its effect on its second delivery,
// which an adapter that had handed them back during the outage would
// count past MaxDeliver and dead-letter.
func testStoreOutage(t *testing.T, b Broker) {
	var eff effects
	s, cfg := setup(t, 2, &eff, func(_ string, n int) error {
		if n == 1 {
			return errors.New("the first attempt fails")
		}
		return nil
	})
	cfg.MaxDeliver = 2
	s.down.Store(true)
	b.Consume(t, cfg)
	const n = 10
	for i := range n {
		b.Publish(t, msg(fmt.Sprint("m-", i)))
	}
	obstest.WaitFor(t, "store errors", func() bool { return s.failed.Load() >= 20 })
	s.down.Store(false)
	hold(t, "every message handled once, on its second attempt", func() bool {
		if d := b.DeadLetters(t); len(d) != 0 {
			t.Fatalf("dead letters after a store outage: %q", d)
		}
		for i := range n {
			if c, a := eff.of(fmt.Sprint("m-", i)); c != 2 || a != 1 {
				return false
			}
		}
		return eff.total() == n
	})
	if d := b.DeadLetters(t); len(d) != 0 {
		t.Fatalf("dead letters after a store outage: %q", d)
	}
}

// A dead-letter publish that fails is retried while the message is
// held: once publishing works again, the message is dead-lettered, once.
func testDeadLetterFails(t *testing.T, b Broker) {
	var eff effects
	_, cfg := setup(t, 1, &eff, func(string, int) error { return errors.New("poison") })
	var retries atomic.Int32
	cfg.Backoff = func(int) time.Duration { retries.Add(1); return 20 * time.Millisecond }
	b.BreakDeadLetters(t, true)
	b.Consume(t, cfg)
	b.Publish(t, msg("dead"))
	obstest.WaitFor(t, "failed dead-letter publishes", func() bool { return retries.Load() >= 3 })
	b.BreakDeadLetters(t, false)
	var dead []string
	obstest.WaitFor(t, "the dead letter", func() bool { dead = append(dead, b.DeadLetters(t)...); return len(dead) >= 1 })
	time.Sleep(500 * time.Millisecond)
	if dead = append(dead, b.DeadLetters(t)...); !slices.Equal(dead, []string{"dead"}) {
		t.Fatalf("dead letters %q, want [dead] once", dead)
	}
	if c, _ := eff.of("dead"); c != 1 {
		t.Fatalf("the handler ran %d times, want 1", c)
	}
}

// A message without an ID gets one from DeriveFrom: the business number,
// the event type and the version. Two publishes of one business event
// are one effect; another version is another event.
func testDerivedID(t *testing.T, b Broker) {
	var eff effects
	_, cfg := setup(t, 3, &eff, nil)
	cfg.DeriveFrom = func(m inbox.Message) []string {
		return []string{m.Headers["Order-No"], m.Headers["Event-Type"], m.Headers["Event-Version"]}
	}
	b.Consume(t, cfg)
	event := func(version string) inbox.Message {
		return inbox.Message{Headers: map[string]string{"Order-No": "7", "Event-Type": "order.paid", "Event-Version": version}, Payload: []byte("{}")}
	}
	b.Publish(t, event("1"))
	b.Publish(t, event("1"))
	b.Publish(t, event("2"))
	v1, v2 := inbox.DeriveID("7", "order.paid", "1"), inbox.DeriveID("7", "order.paid", "2")
	hold(t, "one effect per event", func() bool {
		_, a := eff.of(v1)
		_, b := eff.of(v2)
		return a == 1 && b == 1 && eff.total() == 2
	})
}
