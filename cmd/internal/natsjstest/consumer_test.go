package natsjstest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// recorder keeps the events a consumer observes.
type recorder struct {
	mu  sync.Mutex
	evs []natsjs.Event
}

func (r *recorder) observe(ev natsjs.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

// of returns the events of message id, as "result/action@delivery".
func (r *recorder) of(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.evs {
		if ev.Message.ID == id {
			out = append(out, fmt.Sprintf("%s/%s@%d", ev.Outcome.Result, ev.Action, ev.Delivered))
		}
	}
	return out
}

func (r *recorder) count(id string) int { return len(r.of(id)) }

// The same message published 5 times with one ID gives one effect:
// within the stream's Duplicates window the stream itself drops the
// republishes (PubAck.Duplicate); past it, the stream holds five copies
// and the inbox acks four as duplicates.
func TestPublishedFiveTimes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		window     time.Duration
		wantStored uint64
		want       string
	}{
		{"within the window", 0, 1, "[processed/acked@1]"},
		{"past the window", minWindow, 5, "[processed/acked@1 duplicate/acked@1 duplicate/acked@1 duplicate/acked@1 duplicate/acked@1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, tc.window)
			db, _, in := sqliteInbox(t, inbox.Config{})
			pub, err := natsjs.NewPublisher(e.js, &natsjs.PublisherConfig{Stream: e.stream})
			if err != nil {
				t.Fatal(err)
			}
			msg := outbox.Message{ID: "ob-7", Topic: e.subject + ".order.paid", Key: "order-7", Payload: []byte(`{"amount_cents":1299}`), Headers: map[string]string{"Event": "order.paid"}}
			for i := range 5 {
				if err := pub.Publish(t.Context(), msg); err != nil {
					t.Fatalf("publish %d: %v", i, err)
				}
				if tc.window > 0 && i < 4 {
					time.Sleep(tc.window + tc.window/2) // let the next publish land
				}
			}
			if got := e.streamMsgs(t, e.stream); got != tc.wantStored {
				t.Fatalf("stream holds %d messages, want %d", got, tc.wantStored)
			}
			var rec recorder
			var seen atomic.Pointer[inbox.Delivery]
			h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
				seen.Store(&d)
				return effect(sqlstore.SQLite, "p")(ctx, tx, d)
			}
			c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe})
			run(t, c)
			obstest.WaitFor(t, "the deliveries", func() bool { return rec.count("ob-7") == int(tc.wantStored) && settled(t, c) })
			if got := fmt.Sprint(rec.of("ob-7")); got != tc.want {
				t.Fatalf("events %s, want %s", got, tc.want)
			}
			if all, of := effects(t, db, sqlstore.SQLite, "ob-7"); all != 1 || of != 1 {
				t.Fatalf("%d effects (%d of ob-7), want 1", all, of)
			}
			d := seen.Load()
			if d.Topic != msg.Topic || d.Key != "order-7" || string(d.Payload) != string(msg.Payload) || d.Headers["Event"] != "order.paid" {
				t.Fatalf("delivery %+v does not carry the message's topic, key, payload and headers", d.Message)
			}
		})
	}
}

// A handler that fails twice and then succeeds: negatively acked twice
// (with the inbox's backoff), the effect once, on the third delivery.
func TestFailsTwiceThenSucceeds(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, s, in := sqliteInbox(t, inbox.Config{Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
	var calls atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		if err := effect(sqlstore.SQLite, "p")(ctx, tx, d); err != nil {
			return err
		}
		if calls.Add(1) <= 2 {
			return errors.New("points service unavailable")
		}
		return nil
	}
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe})
	run(t, c)
	e.publish(t, "order.paid", "order-3.paid", "{}")
	obstest.WaitFor(t, "the third delivery", func() bool { return rec.count("order-3.paid") == 3 && settled(t, c) })
	if got, want := fmt.Sprint(rec.of("order-3.paid")), "[retry/naked@1 retry/naked@2 processed/acked@3]"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	if all, of := effects(t, db, sqlstore.SQLite, "order-3.paid"); all != 1 || of != 1 {
		t.Fatalf("%d effects, want 1", all)
	}
	if r, err := s.Get(t.Context(), "loyalty", "order-3.paid"); err != nil || r.Status != inbox.StatusSucceeded || r.Attempts != 3 {
		t.Fatalf("record %+v, %v", r, err)
	}
}

// A poison message is dead after the inbox's MaxAttempts: published to
// the dead-letter subject (with the reason and where it came from) and
// terminated; the messages around it keep flowing.
func TestPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, s, in := sqliteInbox(t, inbox.Config{MaxAttempts: 3, Backoff: func(int) time.Duration { return 20 * time.Millisecond }})
	h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		if err := effect(sqlstore.SQLite, "p")(ctx, tx, d); err != nil {
			return err
		}
		if strings.HasPrefix(string(d.Payload), "garbage") {
			return errors.New("cannot decode the payload")
		}
		return nil
	}
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe, Workers: 2})
	run(t, c)
	for i := range 10 {
		if i == 3 {
			e.publish(t, "order.paid", "poison", "garbage")
		}
		e.publish(t, "order.paid", fmt.Sprint("ok-", i), "{}")
	}
	obstest.WaitFor(t, "the messages", func() bool {
		all, _ := effects(t, db, sqlstore.SQLite, "")
		return all == 10 && rec.count("poison") == 3 && settled(t, c)
	})
	if got, want := fmt.Sprint(rec.of("poison")), "[retry/naked@1 retry/naked@2 dead/dead-lettered@3]"; got != want {
		t.Fatalf("poison events %s, want %s", got, want)
	}
	if _, of := effects(t, db, sqlstore.SQLite, "poison"); of != 0 {
		t.Fatalf("%d effects of the poison", of)
	}
	if r, err := s.Get(t.Context(), "loyalty", "poison"); err != nil || r.Status != inbox.StatusDead || r.Attempts != 3 {
		t.Fatalf("record %+v, %v", r, err)
	}
	// Observe the dead letter where it was dead-lettered.
	if n := e.streamMsgs(t, e.dead); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	dl := deadLetters(t, e, 1)[0]
	h2 := dl.Headers()
	if dl.Subject() != c.DeadLetterSubject() || string(dl.Data()) != "garbage" ||
		h2.Get(natsjs.DeadIDHeader) != "poison" || h2.Get(natsjs.DeadReasonHeader) != "cannot decode the payload" ||
		h2.Get(natsjs.DeadSubjectHeader) != e.subject+".order.paid" || h2.Get(natsjs.DeadStreamHeader) != e.stream ||
		h2.Get(natsjs.DeadConsumerHeader) != "loyalty" || h2.Get(natsjs.DeadDeliveriesHeader) != "3" || h2.Get(natsjs.DeadSequenceHeader) != "4" {
		t.Fatalf("dead letter on %s: %q %v", dl.Subject(), dl.Data(), h2)
	}
	// Terminated: the poison is not redelivered, and the original stays
	// in its stream (4 is its sequence).
	if n := e.streamMsgs(t, e.stream); n != 11 {
		t.Fatalf("stream holds %d, want 11", n)
	}
}

// deadLetters fetches n messages from the test's dead-letter stream.
func deadLetters(t testing.TB, e env, n int) []jetstream.Msg {
	t.Helper()
	cons, err := e.js.CreateOrUpdateConsumer(t.Context(), e.dead, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	if len(out) != n {
		t.Fatalf("%d dead letters fetched, want %d", len(out), n)
	}
	return out
}

// A message that is still failing on its MaxDeliver-th delivery is
// dead-lettered by the consumer, since the server would drop it.
func TestMaxDeliverDeadLetters(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, s, in := sqliteInbox(t, inbox.Config{MaxAttempts: 10, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	h := func(context.Context, *sql.Tx, inbox.Delivery) error { return errors.New("down") }
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe, MaxDeliver: 2})
	run(t, c)
	e.publish(t, "x", "m", "{}")
	obstest.WaitFor(t, "two deliveries", func() bool { return rec.count("m") == 2 && settled(t, c) })
	if got, want := fmt.Sprint(rec.of("m")), "[retry/naked@1 retry/dead-lettered@2]"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	dl := deadLetters(t, e, 1)[0]
	if r := dl.Headers().Get(natsjs.DeadReasonHeader); r != "delivered 2 times (MaxDeliver), last: down" {
		t.Fatalf("reason %q", r)
	}
	if r, err := s.Get(t.Context(), "loyalty", "m"); err != nil || r.Status != inbox.StatusFailed || r.Attempts != 2 {
		t.Fatalf("record %+v, %v", r, err)
	}
}

// A message dead on its last delivery whose dead letter cannot be
// published (the dead-letter stream is missing) is kept, not dropped:
// the consumer retries the publish while it holds the message, and once
// the stream is there, the message is dead-lettered. Before, it was
// naked "to be dead-lettered on its redelivery", but the server had
// reached MaxDeliver and never redelivered it: neither handled nor
// dead-lettered.
func TestDeadLetterUnpublishedOnLastDelivery(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, e.dead); err != nil {
		t.Fatal(err)
	}
	db, s, in := sqliteInbox(t, inbox.Config{MaxAttempts: 10, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	h := func(context.Context, *sql.Tx, inbox.Delivery) error { return errors.New("poison") }
	var rec recorder
	var failed atomic.Int32
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe, MaxDeliver: 2, AckWait: 300 * time.Millisecond,
		Backoff: func(int) time.Duration { failed.Add(1); return 20 * time.Millisecond }})
	run(t, c)
	e.publish(t, "x", "m", "{}")
	obstest.WaitFor(t, "failed dead-letter publishes", func() bool { return failed.Load() >= 3 })
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.dead, Subjects: []string{natsjs.DefaultDeadLetterPrefix + e.stream + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	obstest.WaitFor(t, "the dead letter", func() bool { return rec.count("m") == 2 && settled(t, c) })
	if got, want := fmt.Sprint(rec.of("m")), "[retry/naked@1 retry/dead-lettered@2]"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	if dl := deadLetters(t, e, 1)[0]; dl.Headers().Get(natsjs.DeadIDHeader) != "m" {
		t.Fatalf("dead letter %v", dl.Headers())
	}
	if r, err := s.Get(t.Context(), "loyalty", "m"); err != nil || r.Attempts != 2 {
		t.Fatalf("record %+v, %v", r, err)
	}
}

// A handler that runs longer than AckWait keeps its message: the
// consumer sends InProgress every third of AckWait, and the server does
// not redeliver it meanwhile.
func TestHeartbeatKeepsMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	var calls atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		calls.Add(1)
		time.Sleep(4500 * time.Millisecond) // three AckWaits
		return effect(sqlstore.SQLite, "p")(ctx, tx, d)
	}
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{Observe: rec.observe, AckWait: 1500 * time.Millisecond, Workers: 2})
	run(t, c)
	e.publish(t, "x", "slow", "{}")
	obstest.WaitFor(t, "the delivery", func() bool { return rec.count("slow") == 1 && settled(t, c) })
	// Had the server redelivered during the handler, the second worker
	// would have found the record in the handler's transaction. (Each
	// heartbeat has a second to reach the server, which a loaded machine
	// leaves it.)
	time.Sleep(1800 * time.Millisecond)
	if got := fmt.Sprint(rec.of("slow")); got != "[processed/acked@1]" || calls.Load() != 1 {
		t.Fatalf("events %s, %d calls; want one delivery", got, calls.Load())
	}
}

// A message without Nats-Msg-Id is kept under
// "<stream>:<sequence>:<timestamp>": a redelivery is recognised, a
// re-publish is not.
func TestMessageIDFromSequence(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	var rec recorder
	c := newConsumer(t, e, natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p")), natsjs.Config{Observe: rec.observe})
	run(t, c)
	e.publish(t, "x", "", "a")
	e.publish(t, "x", "", "a")
	id1, id2 := seqID(t, e, 1), seqID(t, e, 2)
	obstest.WaitFor(t, "two messages", func() bool { return rec.count(id1) == 1 && rec.count(id2) == 1 && settled(t, c) })
	if all, of := effects(t, db, sqlstore.SQLite, id1); all != 2 || of != 1 {
		t.Fatalf("%d effects, %d of %s", all, of, id1)
	}
}
